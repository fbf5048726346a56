"""The inner gloo group of an ``inagg`` process group: every collective inagg does not implement,
and every allreduce it cannot take, runs here unchanged (``inagg.hostlib.pytorch.backend``).

Design: one object owns the gloo backend (whose ``allreduce`` the allreduce dispatch's gloo path
uses) and the ``dist.ProcessGroup`` around it (whose methods torch's collectives dispatch to),
counts what it runs under the reason inagg could not, and lets both go at shutdown (``release``)
while the interpreter still runs. Both are made at the first call that needs them (``connect``:
gloo's rendezvous, a collective; every rank runs the collectives of a group in one order, so
its first is the same call everywhere): a job whose calls all take inagg's paths (a job on one
host's tiny calls, a re-init's first allreduce) makes none. Each reason is logged once, through logger ``inagg.fallbacks``:
at INFO on rank 0 (every rank makes the same calls, so one line says it for the job) and at
DEBUG on the others. A fallback is normal use (an int64 or MAX allreduce, a broadcast: gloo
runs it as it would without inagg), not a warning; ``stats()['fallbacks']`` counts each.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, NoReturn

import torch
import torch.distributed as dist

from inagg.hostlib import BACKEND_DEVICES
from inagg.hostlib.errors import InaggError
from inagg.hostlib.pytorch.works import _GlooWork

if TYPE_CHECKING:
    from inagg.hostlib.pytorch.backend import InaggProcessGroup

log = logging.getLogger("inagg.fallbacks")


def _gloo_group(gloo: dist.ProcessGroupGloo, store: dist.Store, rank: int, world_size: int) -> dist.ProcessGroup:
    """A process group whose backend is ``gloo`` for every device type the inagg backend takes
    (``BACKEND_DEVICES``: a CUDA tensor inagg does not run, as DDP's broadcasts, comes here as it
    is), as torch builds one for ``init_process_group("gloo")``: torch's ``ProcessGroup`` methods
    (``all_gather_single``, ``reduce_scatter_tensor_coalesced``...) dispatch to the backend's own
    collectives, which the backend's Python binding does not all have."""
    group = dist.ProcessGroup(store, rank, world_size)
    for device in BACKEND_DEVICES:
        group._register_backend(torch.device(device), dist.ProcessGroup.BackendType.GLOO, gloo)
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    return group


class _ShutDownGloo:
    """Stands in for the inner gloo group once the process group is shut down: every use says so
    (instead of an AttributeError on None)."""

    def __getattr__(self, name: str) -> NoReturn:
        """Every attribute: an error saying the group was shut down."""
        raise InaggError(f"the inagg process group was shut down (destroy_process_group): no {name} on it")


class InnerGloo:
    """The inner gloo group: ``backend`` (the ``ProcessGroupGloo``, whose allreduce the gloo path
    calls) and ``group`` (the process group around it, for every other collective), made by
    ``connect`` when first used; its Works are ``_GlooWork``s of ``owner`` (the inagg group,
    which names a rank gone)."""

    def __init__(self, connect: Callable[[], dist.ProcessGroupGloo], store: dist.Store,
                 owner: InaggProcessGroup) -> None:
        """Nothing made yet: ``connect`` makes the backend at the first use, on ``store``."""
        self._connect, self._store, self._owner = connect, store, owner
        self._made: tuple[dist.ProcessGroupGloo, dist.ProcessGroup] | tuple[_ShutDownGloo, _ShutDownGloo] | None = None
        self._lock = threading.Lock()   # one thread makes it
        self.fallbacks: Counter[str] = Counter()    # "<collective>: <reason>" -> calls sent to gloo

    @property
    def backend(self) -> dist.ProcessGroupGloo | _ShutDownGloo:
        """The gloo backend (made now if this is its first use)."""
        return self._parts()[0]

    @property
    def group(self) -> dist.ProcessGroup | _ShutDownGloo:
        """The process group around the backend (made now if this is its first use)."""
        return self._parts()[1]

    def _parts(self) -> tuple:
        made = self._made
        if made is None:
            with self._lock:
                if self._made is None:
                    backend = self._connect()
                    self._made = (backend, _gloo_group(backend, self._store, self._owner.rank(), self._owner.size()))
                made = self._made
        return made

    def run(self, collective: str, reason: str, *args: Any, **kwargs: Any) -> dist.Work:
        """Run ``collective`` on the inner gloo group, counted under ``reason`` (logged once)."""
        key = f"{collective}: {reason}"
        first = key not in self.fallbacks
        self.fallbacks[key] += 1
        if first:
            log.log(logging.INFO if self._owner.rank() == 0 else logging.DEBUG,
                    "rank %d: %s goes to gloo (%s); counted in stats()['fallbacks']", self._owner.rank(), collective,
                    reason)
        try:
            gloo = self.backend if collective == "allreduce" else self.group
            work = getattr(gloo, collective)(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - re-raised, naming the rank gone that caused it
            raise self._owner.named(e)
        return _GlooWork(work, self._owner) if isinstance(work, dist.Work) else work

    def release(self) -> None:
        """Let the backend and its process group go (``GroupLifecycle._release_gloo`` says why
        now): nothing else holds them, so they are destroyed here; every later use says the
        group was shut down."""
        with self._lock:
            self._made = (_ShutDownGloo(), _ShutDownGloo())
