"""CUDA tensors through INA (``inagg.hostlib.worker.cuda_staging``): the GPU check, in this one file.
Run ``pytest tests/test_cuda_path.py`` on a machine with a GPU and a CUDA build of torch; where
there is none, every test here but the registration's skips and says so."""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta
from typing import Iterator

import pytest
import torch
import torch.distributed as dist

from inagg.hostlib.pytorch.backend import InaggProcessGroup
from test_training import on_ranks

needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device here (torch.cuda.is_available() is False): run `pytest tests/test_cuda_path.py` "
           "on a machine with a GPU and a CUDA build of torch")

CASES = [(dtype, size) for dtype in (torch.float32, torch.bfloat16) for size in (5, 300_000)]


def values(rank: int, size: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * rank + size)
    return (torch.randn(size, generator=g) * torch.exp2(torch.randint(-12, 4, (size,), generator=g).float())).to(dtype)


def calls(group: InaggProcessGroup, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every case's CUDA tensor and its CPU twin on this rank, all CUDA calls in flight at once,
    each tensor written on the caller's stream just before its call (the staging copy must wait
    for that write); then the CPU twins."""
    pairs = [(torch.empty((size,), dtype=dtype, device="cuda"), values(rank, size, dtype)) for dtype, size in CASES]
    works = []
    for gpu, cpu in pairs:
        gpu.copy_(cpu.pin_memory(), non_blocking=True)
        works.append(group.allreduce([gpu]))
    works += [group.allreduce([cpu]) for _, cpu in pairs]
    for work in works:
        work.wait()
    return [(gpu.cpu(), cpu) for gpu, cpu in pairs]


def assert_same_bits(results: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> None:
    """Each rank's (CUDA result on the host, CPU twin's result) pairs, one per case, bit for bit."""
    for rank, pairs in enumerate(results):
        for (gpu, cpu), case in zip(pairs, CASES):
            bits = torch.int16 if cpu.element_size() == 2 else torch.int32
            assert torch.equal(gpu.view(bits), cpu.view(bits)), (rank, case)


@contextmanager
def switch_path_groups(tmp_path, monkeypatch) -> Iterator[list[InaggProcessGroup]]:
    """Two ranks' groups on the backend string (threads of this process), every call pinned to
    the switch; shut down on the way out."""
    for name in ("INAGG_CONTROLLER", "LOCAL_WORLD_SIZE", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("INAGG_ALLREDUCE_PATH", "inagg")
    store = dist.FileStore(str(tmp_path / "store"), 2)
    groups = on_ranks(lambda r: InaggProcessGroup(store, r, 2, timedelta(seconds=60)), 2, 120)
    try:
        yield groups
    finally:
        on_ranks(lambda r: groups[r].shutdown(), 2, 120)


def test_the_backend_takes_cuda_tensors_as_well_as_cpu_ones():
    """torch routes a group's CUDA tensors to ``inagg`` (not to NCCL, not refused as a device
    with no backend): the plugin registers it for both device types."""
    import inagg.hostlib.pytorch.plugin  # noqa: F401 - registers where entry points are off

    assert dist.Backend.backend_capability["inagg"] == ["cpu", "cuda"]


def test_what_gloo_runs_for_the_backend_finds_gloo_on_each_device_it_is_registered_for():
    """What inagg does not run itself (DDP's broadcasts of CUDA parameters, FSDP's all-gathers)
    goes to the inner gloo group with the caller's tensors, so that group has gloo for every
    device type the backend takes (without: "No backend type associated with device type
    cuda" at DDP's first broadcast)."""
    from inagg.hostlib.pytorch.inner_gloo import _gloo_group

    store = dist.HashStore()
    gloo = dist.ProcessGroupGloo(store, 0, 1, timedelta(seconds=60))
    group = _gloo_group(gloo, dist.PrefixStore("inner", store), 0, 1)
    for device in dist.Backend.backend_capability["inagg"]:
        assert isinstance(group._get_backend(torch.device(device)), dist.ProcessGroupGloo)


@needs_cuda
def test_cuda_tensors_take_the_switch_path_and_give_their_cpu_twins_bits(tmp_path, monkeypatch):
    """Two ranks on the backend string, every call pinned to the switch: CUDA tensors (float32,
    bfloat16; a call riding in the control round and one of many packets) come back with the
    bits of the same values reduced from CPU memory, and count as the switch's calls."""
    with switch_path_groups(tmp_path, monkeypatch) as groups:
        assert_same_bits(on_ranks(lambda r: calls(groups[r], r), 2, 120))
        stats = groups[0].stats()
        assert stats["allreduce_paths"] == {"inagg": 2 * len(CASES)}   # the CUDA calls and their twins
        assert not [k for k in stats["fallbacks"] if k.startswith("allreduce")]


def scatters(group: InaggProcessGroup, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every case's reduce-scatter of a CUDA tensor and of its CPU twin on this rank: the
    outputs, CUDA's copied to the host."""
    pairs = []
    for dtype, size in CASES:
        cpu = values(rank, 2 * size, dtype)
        outputs = (torch.empty((size,), dtype=dtype, device="cuda"), torch.empty((size,), dtype=dtype))
        for output, input_ in zip(outputs, (cpu.cuda(), cpu)):
            group._reduce_scatter_base(output, input_).wait()
        pairs.append((outputs[0].cpu(), outputs[1]))
    return pairs


@needs_cuda
def test_a_cuda_reduce_scatter_takes_inaggs_path_and_gives_its_cpu_twins_shard(tmp_path, monkeypatch):
    """Two ranks, every call pinned to the switch: a reduce-scatter of CUDA tensors (staged whole
    through pinned memory, module ``inagg.hostlib.pytorch.reduce_scatter``) gives each rank the
    bits of its CPU twin's shard, and runs on inagg's path, not the inner gloo group's."""
    with switch_path_groups(tmp_path, monkeypatch) as groups:
        assert_same_bits(on_ranks(lambda r: scatters(groups[r], r), 2, 120))
        stats = groups[0].stats()
        assert stats["allreduce_paths"] == {"inagg": 2 * len(CASES)}   # the CUDA calls and their twins
        assert stats["via_allreduce"] == {"_reduce_scatter_base": 2 * len(CASES)}   # none on gloo's
