"""Registers the ``inagg`` torch.distributed backend, importing nothing heavy.

torch (>= 2.5) calls the functions of the ``torch.backends`` entry-point group at ``import
torch`` (unless ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``); inagg declares :func:`register` there in
pyproject.toml, so ``dist.init_process_group("inagg")`` works with no inagg import in the
training script. The process group itself (``inagg.hostlib.pytorch.backend``: numpy, the communicator, the
gRPC stubs) is imported only when a group is created. Importing this module registers too
(``import inagg.hostlib.pytorch.plugin``), for installs where entry points are disabled.

A failure here would fail ``import torch`` for every user of the environment, so this module does
the least possible: one ``register_backend`` call.
"""

from __future__ import annotations

from datetime import timedelta

from inagg.hostlib import BACKEND_DEVICES, BACKEND_NAME


def _create_process_group(store, rank: int, world_size: int, timeout: timedelta):
    from inagg.hostlib.pytorch.backend import InaggProcessGroup

    return InaggProcessGroup(store, rank, world_size, timeout)


def register() -> None:
    """Make ``"inagg"`` a torch.distributed backend name for CPU and CUDA tensors (idempotent; a
    CUDA tensor is staged through pinned host memory, ``inagg.hostlib.worker.cuda_staging``)."""
    import torch.distributed as dist

    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_process_group, devices=list(BACKEND_DEVICES))


register()
