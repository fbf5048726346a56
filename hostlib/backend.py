"""The ``inagg`` torch.distributed backend: ``dist.init_process_group("inagg")``.

A Python ``dist.ProcessGroup`` subclass (the pattern of PyTorch's test_c10d_pypg.py), created by
the creator that ``hostlib.torch_plugin`` registers with ``dist.Backend.register_backend``:

* An allreduce of one CPU float32 (SUM or AVG) or int32 (SUM) tensor is eligible for inagg. Each
  eligible call takes the path the alpha-beta model predicts faster (``hostlib.path_choice``):
  inagg through the job's ``Communicator`` (the switch, or the host aggregator when the
  controller grants that) or the inner gloo group; every rank takes the same path.
* Everything else (other collectives, dtypes, ops, several tensors) goes to an inner
  ``ProcessGroupGloo`` on the same store, unchanged. Each kind is counted (``stats()``) and
  logged once: INFO for collectives inagg does not implement, WARNING for an allreduce that could
  not use inagg.

So DDP (its broadcasts, allgathers and bucket allreduces), ``dist.all_reduce`` of metrics and
PyTorch's own comm hooks (PowerSGD, fp16 compression) run unchanged. Where the job finds its
controller, and the local deployment a job brings up when none is named: ``hostlib.local``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from .communicator import Communicator, ReduceOp
from .errors import InaggSetupError
from .local import Endpoint, find_endpoint
from .path_choice import PATHS, PathChooser
from . import BACKEND_NAME

log = logging.getLogger("inagg.backend")

# Collectives inagg does not implement: the inner gloo group runs them as they are.
GLOO_COLLECTIVES = (
    "broadcast", "allgather", "_allgather_base", "allgather_coalesced", "allgather_into_tensor_coalesced",
    "all_gather_single", "allreduce_coalesced", "reduce", "reduce_scatter", "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced", "gather", "scatter", "alltoall", "alltoall_base", "barrier",
    "monitored_barrier", "send", "recv", "recv_anysource",
)
_CALIBRATION_BYTES = (64, 256 * 1024)   # two sizes pin alpha and beta of each path
_CALIBRATION_ROUNDS = 2
_INAGG_DTYPES = (torch.float32, torch.int32)
# A gloo call is timed (a Python callback on gloo's thread, which delays that call's completion
# and, measured, the median call by ~30 % at 4 B when every 8th call had one) only every this
# many calls (and an exploration's, and every call predicted longer than _GLOO_TIME_ALWAYS_S, where
# the callback's microseconds are noise and a model that follows a changing link is worth them),
# and only when it starts with gloo idle; the others cost what gloo's own do.
_GLOO_SAMPLE_EVERY = 32
_GLOO_TIME_ALWAYS_S = 1e-3
PATH_ENV = "INAGG_ALLREDUCE_PATH"   # auto (default) | inagg | gloo
AGREE_ENV = "INAGG_PATH_AGREE_EVERY"   # eligible calls between the ranks' path agreements


def _forced_path() -> str | None:
    """The path ``INAGG_ALLREDUCE_PATH`` pins every eligible allreduce to (None: auto)."""
    value = os.environ.get(PATH_ENV, "auto").strip().lower()
    if value == "auto":
        return None
    if value not in PATHS:
        raise InaggSetupError(f"{PATH_ENV} must be auto, {' or '.join(PATHS)}; got {value!r}")
    return value


def _agree_every() -> dict:
    """``INAGG_PATH_AGREE_EVERY``'s value for PathChooser ({}: its default). Fewer calls between
    agreements follow a changing network sooner, at one small gloo allreduce each."""
    value = os.environ.get(AGREE_ENV, "").strip()
    if not value:
        return {}
    if not value.isdigit() or int(value) < 2:
        raise InaggSetupError(f"{AGREE_ENV} must be a whole number >= 2, got {value!r}")
    return {"agree_every": int(value)}


_SUM, _AVG = dist.ReduceOp.SUM, dist.ReduceOp.AVG


def _ineligible(tensors: list[torch.Tensor], op) -> str:
    """Why this allreduce cannot go through inagg ('' if it can). On every call: kept cheap."""
    if len(tensors) != 1:
        return f"{len(tensors)} tensors in one call"
    t = tensors[0]
    if not t.is_cpu:
        return f"{t.device.type} tensor"
    if t.dtype not in _INAGG_DTYPES:
        return f"dtype {t.dtype}"
    if not t.is_contiguous():
        return "non-contiguous tensor"
    if op == _SUM or (op == _AVG and t.dtype == torch.float32):
        return ""
    return f"op {op}"


def _off_thread(fut: torch.futures.Future) -> torch.futures.Future:
    """The same outcome, delivered on a thread of its own. The communicator completes its
    futures on its one I/O thread; a callback that waits there for another allreduce (PowerSGD's
    hook does) would wait for itself. (gloo's callbacks run on one of its worker threads.)"""
    out = torch.futures.Future()

    def deliver(f: torch.futures.Future) -> None:
        try:
            out.set_result(f.value())
        except Exception as e:  # noqa: BLE001 - handed on to whoever waits on ``out``
            out.set_exception(e)

    fut.add_done_callback(lambda f: threading.Thread(target=deliver, args=(f,), daemon=True,
                                                     name="inagg-complete").start())
    return out


class InaggProcessGroup(dist.ProcessGroup):
    """One rank's ``inagg`` process group (module docstring)."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, timeout: timedelta) -> None:
        super().__init__(rank, world_size)
        forced, agreement = _forced_path(), _agree_every()
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, world_size, timeout)
        self._local_store = dist.PrefixStore("local", store)
        self.endpoint: Endpoint = find_endpoint(self._local_store, rank, world_size, timeout)
        try:
            self.comm = Communicator(dist.PrefixStore("comm", store), rank, world_size, self.endpoint.controller,
                                     bind_ip=self.endpoint.bind_ip, timeout=timeout.total_seconds(),
                                     name=os.environ.get("TORCHELASTIC_RUN_ID", ""))
        except Exception as e:
            self.endpoint.close(self._local_store, rank, world_size, timeout=0)
            raise InaggSetupError(f"rank {rank}: cannot join an inagg job at {self.endpoint.controller}: {e}") from e
        self.allreduces: Counter[str] = Counter()   # eligible calls by path
        self.fallbacks: Counter[str] = Counter()    # "<collective>: <reason>" -> calls sent to gloo
        self._lock = threading.Lock()
        self._last_done = {p: 0.0 for p in PATHS}
        self._last_gloo: dist.Work | None = None
        self._closed = False
        self.paths = PathChooser(self._agree_max, forced=forced, **agreement)
        self._calibrate()
        log.info("rank %d: inagg process group ready (job %d, %s mode, address %s)", rank, self.comm.job_id,
                 self.comm.grant.mode, self.endpoint.bind_ip)

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    # -- allreduce -----------------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        reason = _ineligible(tensors, opts.reduceOp)
        if reason:
            return self._to_gloo("allreduce", reason, tensors, opts)
        tensor = tensors[0]
        nbytes = tensor.numel() * tensor.element_size()
        average = opts.reduceOp == _AVG
        path = self.paths.choose(nbytes)
        self.allreduces[path] += 1
        if path == "gloo" and not average:   # the fast path: gloo's own Work
            idle = self._last_gloo is None or self._last_gloo.is_completed()
            work = self._last_gloo = self._gloo.allreduce(tensors, opts)
            if idle and (self.paths.exploring or self.allreduces[path] % _GLOO_SAMPLE_EVERY == 0
                         or self.paths.predict(path, nbytes) > _GLOO_TIME_ALWAYS_S):
                self._time(path, nbytes, work.get_future())
            return work
        return _create_work_from_future(self._run(path, tensor, average))

    def _time(self, path: str, nbytes: int, fut: torch.futures.Future) -> None:
        """Feed the path's estimator with this call's service time: from its start, or from the
        previous call's end on that path if it was queued behind it (both paths run their
        calls in order), to its end."""
        started = time.perf_counter()

        def done(_: torch.futures.Future) -> None:
            now = time.perf_counter()
            with self._lock:
                began = max(started, self._last_done[path])
                self._last_done[path] = now
            self.paths.observe(path, nbytes, now - began)

        fut.add_done_callback(done)

    def _run(self, path: str, tensor: torch.Tensor, average: bool) -> torch.futures.Future:
        """Start one allreduce on ``path``, timed; the future resolves to ``[tensor]`` (as gloo's)."""
        nbytes = tensor.numel() * tensor.element_size()
        if path == "inagg":
            fut = _off_thread(self.comm.allreduce_async(tensor, ReduceOp.AVG if average else ReduceOp.SUM))
        else:
            opts = dist.AllreduceOptions()
            opts.reduceOp = dist.ReduceOp.SUM    # gloo has no AVG: sum, then divide
            fut = self._gloo.allreduce([tensor], opts).get_future()
        self._time(path, nbytes, fut)

        def result(f: torch.futures.Future) -> list[torch.Tensor]:
            f.value()   # raises the path's error, if any, into the returned future
            if average and path == "gloo":
                tensor.div_(self.size())
            return [tensor]

        return fut.then(result)

    def _agree_max(self, values: np.ndarray) -> np.ndarray:
        """Each element's maximum over the ranks (through gloo: exact and cheap for a few floats)."""
        t = torch.from_numpy(values.astype(np.float64))
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX
        self._gloo.allreduce([t], opts).wait()
        return t.numpy()

    def _calibrate(self) -> None:
        """Time both paths at two sizes (the same calls on every rank) and agree on the result,
        so the first real calls are already chosen from measurements."""
        for nbytes in _CALIBRATION_BYTES:
            for _ in range(_CALIBRATION_ROUNDS):
                for path in PATHS:
                    self._run(path, torch.zeros(nbytes // 4, dtype=torch.float32), False).wait()
        self.paths.agree()

    # -- everything else -----------------------------------------------------------------------

    def _to_gloo(self, collective: str, reason: str, *args, **kwargs):
        key = f"{collective}: {reason}"
        first = key not in self.fallbacks
        self.fallbacks[key] += 1
        if first:
            level = logging.WARNING if collective == "allreduce" else logging.INFO
            log.log(level, "rank %d: %s goes to gloo (%s); counted in stats()['fallbacks']",
                    self.rank(), collective, reason)
        return getattr(self._gloo, collective)(*args, **kwargs)

    def stats(self) -> dict:
        """Calls by path, gloo fallbacks by kind, the agreed path model and the communicator's
        counters (mode, bytes, retransmissions, ...)."""
        return {"controller": self.endpoint.controller, "address": self.endpoint.bind_ip,
                "allreduce_paths": dict(self.allreduces), "fallbacks": dict(self.fallbacks),
                "path_model": self.paths.as_dict(), "inagg": self.comm.stats()}

    def shutdown(self) -> None:
        """Leave the inagg job; rank 0 stops the local deployment it started once every rank
        is done with it. Called by ``dist.destroy_process_group``; idempotent."""
        if self._closed:
            return
        self._closed = True
        self.comm.close()
        self.endpoint.close(self._local_store, self.rank(), self.size())
        log.info("rank %d: inagg process group closed: %s", self.rank(), self.stats())


def _gloo_collective(name: str):
    def forward(self: InaggProcessGroup, *args, **kwargs):
        return self._to_gloo(name, "inagg implements allreduce only", *args, **kwargs)

    forward.__name__ = forward.__qualname__ = name
    forward.__doc__ = f"``{name}`` through the inner gloo group (counted)."
    return forward


for _name in GLOO_COLLECTIVES:
    setattr(InaggProcessGroup, _name, _gloo_collective(_name))
