"""The ``inagg`` torch.distributed backend: ``dist.init_process_group("inagg")``.

A Python ``dist.ProcessGroup`` subclass (the pattern of PyTorch's test_c10d_pypg.py), created by
the creator that ``inagg.pytorch.plugin`` registers with ``dist.Backend.register_backend``:

* An allreduce of one CPU float32 (SUM or AVG) or int32 (SUM) tensor is eligible for inagg. Each
  eligible call takes the path the model predicts fastest (``inagg.pytorch.path_choice``): ``inagg``,
  the job's ``Communicator`` (the switch, or the host aggregator when the controller grants
  that); ``host``, the job's host lane when its grant is on a switch (a second job at the
  controller, ``host_only``: the host aggregator, with its own socket, slots and call numbers,
  so a call on one aggregator never touches the other's state); or the inner gloo group. Every
  rank takes the same path for the same call, so each communicator sees the same calls on every
  rank. Grant changes stay each job's own (a lane job stays on the host aggregator; the main
  job may move between switch and host, and the lane is kept: it is decided once, from the
  first grant, which is the same on every rank).
* A call on a communicator (``inagg``, ``host``) below 64 KiB with nothing queued there runs on
  the caller's thread and returns a Work already complete (its callbacks run on the caller's
  thread too); a larger one is queued on the communicator's I/O thread, so DDP overlaps it with
  the backward pass, and its Work's future is delivered on a thread of its own (a callback that
  waits for another allreduce, as PowerSGD's does, must not block the I/O thread). Either
  way ``wait`` raises the call's error (``JobFailed``, a refused input...), on every rank alike.
* Everything else (other collectives, dtypes, ops, several tensors) goes to an inner
  ``ProcessGroupGloo`` on the same store, unchanged. Each kind is counted (``stats()``) and
  logged once: INFO for collectives inagg does not implement, WARNING for an allreduce that could
  not use inagg.

So DDP (its broadcasts, allgathers and bucket allreduces), ``dist.all_reduce`` of metrics and
PyTorch's own comm hooks (PowerSGD, fp16 compression) run unchanged. Where the job finds its
controller, and the local deployment a job brings up when none is named: ``inagg.worker.local``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, NoReturn

import torch
import torch.distributed as dist

from inagg.pytorch.agreement import StoreMin
from inagg.worker.communicator import Communicator, ReduceOp
from inagg.worker.host_communicator import HostCommunicator, HostGroup, open_host_group
from inagg.errors import InaggError, InaggSetupError
from inagg.worker.local import Endpoint, find_endpoint
from inagg.pytorch.path_choice import PATHS, PathChooser
from inagg import BACKEND_NAME

log = logging.getLogger("inagg.backend")

# Collectives inagg does not implement: the inner gloo group runs them as they are.
GLOO_COLLECTIVES = (
    "broadcast", "allgather", "_allgather_base", "allgather_coalesced", "allgather_into_tensor_coalesced",
    "all_gather_single", "allreduce_coalesced", "reduce", "reduce_scatter", "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced", "gather", "scatter", "alltoall", "alltoall_base", "barrier",
    "monitored_barrier", "send", "recv", "recv_anysource",
)
# three sizes pin alpha and beta of each path (the median of a few rounds each: the machine may
# be shared), so the first real calls are already chosen from measurements
_CALIBRATION_BYTES = (64, 16 * 1024, 1 << 20)
_CALIBRATION_ROUNDS = 3
_INAGG_DTYPES = (torch.float32, torch.int32)
# a smaller call on a communicator with nothing queued runs on the caller's thread (``_run``):
# the hand-over to the I/O thread and back costs most of a small call's time; larger ones stay
# queued, so DDP overlaps them with its backward pass
_INLINE_BELOW_BYTES = 64 << 10
PATH_ENV = "INAGG_ALLREDUCE_PATH"   # auto (default) | inagg | host | gloo


def _forced_path() -> str | None:
    """The path ``INAGG_ALLREDUCE_PATH`` pins every eligible allreduce to (None: auto)."""
    value = os.environ.get(PATH_ENV, "auto").strip().lower()
    if value == "auto":
        return None
    if value not in PATHS:
        raise InaggSetupError(f"{PATH_ENV} must be auto, {' or '.join(PATHS)}; got {value!r}")
    return value


_SUM, _AVG = dist.ReduceOp.SUM, dist.ReduceOp.AVG
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def _ranks_share_a_clock(store: dist.Store, rank: int, world_size: int) -> bool:
    """Whether every rank's ``time.perf_counter`` reads one clock (CLOCK_MONOTONIC is the
    kernel's: one boot id on every rank), so the path chooser can time a call from the last
    rank's start to the last rank's end (``inagg.pytorch.path_choice``). A collective."""
    try:
        mine = _BOOT_ID.read_text().strip()
    except OSError:   # not Linux: no boot id to compare
        mine = ""
    store.set(str(rank), mine)
    return bool(mine) and all(store.get(str(r)).decode() == mine for r in range(world_size))


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


def _settle(out: torch.futures.Future, fut: torch.futures.Future, value) -> None:
    """Complete ``out`` with ``value`` if ``fut`` succeeded, else with ``fut``'s error."""
    try:
        fut.value()
        out.set_result(value)
    except Exception as e:  # noqa: BLE001 - handed on to whoever waits on ``out``
        out.set_exception(e)


def _resolve_to(fut: torch.futures.Future, value) -> torch.futures.Future:
    """A future of ``value`` once the communicator's ``fut`` succeeds (else of its error).
    Already complete if ``fut`` is (a call run on the caller's thread): callbacks then run on the
    caller's thread. Otherwise delivered on a thread of its own: the communicator completes its
    futures on its one I/O thread, and a callback that waits there for another allreduce
    (PowerSGD's hook does) would wait for itself. (gloo's callbacks run on one of its worker
    threads.)"""
    out = torch.futures.Future()
    if fut.done():
        _settle(out, fut, value)
    else:
        fut.add_done_callback(lambda f: threading.Thread(target=_settle, args=(out, f, value), daemon=True,
                                                         name="inagg-complete").start())
    return out


class _CallWork(dist.Work):
    """The Work of one call on a path of ours: ``wait`` waits on the call's own future ``done``
    and raises its error (the Work of torch's ``_create_work_from_future`` returns True from a
    failed future: ``dist.all_reduce`` would return as if the call had succeeded); a caller
    that takes its future (DDP, comm hooks) gets ``result()``, made on first use."""

    def __init__(self, done: torch.futures.Future, result: Callable[[], torch.futures.Future]) -> None:
        super().__init__()
        self._done, self._result, self._future = done, result, None

    def wait(self, timeout: timedelta | None = None) -> bool:
        self._done.wait()   # raises the call's error
        return True

    def get_future(self) -> torch.futures.Future:
        if self._future is None:
            self._future = self._result()
        return self._future

    def is_completed(self) -> bool:
        return self._done.done()


class _TimedWork(dist.Work):
    """A path's Work that reports when it is done (``on_done``, once), timed where it is waited
    for: in ``wait`` on the caller's thread, which costs the call nothing and counts the
    caller's wake-up on every path alike, so every path's time is what its callers see. Only a
    caller that takes its future (DDP) gets a callback on it instead: gloo runs future callbacks
    on its own thread before waiters learn the call is done, so a callback on every call would
    delay the calls themselves."""

    def __init__(self, work: dist.Work, on_done: Callable[[], None]) -> None:
        super().__init__()
        self._work, self._on_done = work, on_done

    def _done(self) -> None:
        on_done, self._on_done = self._on_done, None
        if on_done is not None:
            on_done()

    def wait(self, timeout: timedelta | None = None) -> bool:
        ok = self._work.wait() if timeout is None else self._work.wait(timeout)
        self._done()
        return ok

    def get_future(self) -> torch.futures.Future:
        fut = self._work.get_future()
        fut.add_done_callback(lambda _: self._done())
        return fut

    def is_completed(self) -> bool:
        return self._work.is_completed()


class _ShutDownGloo:
    """Stands in for the inner gloo group once the process group is shut down: every use says so
    (instead of an AttributeError on None)."""

    def __getattr__(self, name: str) -> NoReturn:
        raise InaggError(f"the inagg process group was shut down (destroy_process_group): no {name} on it")


class InaggProcessGroup(dist.ProcessGroup):
    """One rank's ``inagg`` process group (module docstring)."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, timeout: timedelta) -> None:
        super().__init__(rank, world_size)
        forced = _forced_path()
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, world_size, timeout)
        self._local_store = dist.PrefixStore("local", store)
        self.endpoint: Endpoint = find_endpoint(self._local_store, rank, world_size, timeout)
        self.comm: Communicator | HostCommunicator | None = None
        self.lane: Communicator | HostCommunicator | None = None
        self.host: HostGroup | None = None   # this host's ranks reduce together first (worker.host_reduce)
        try:
            self.host = open_host_group(dist.PrefixStore("host", store), rank, world_size, timeout)
            self.comm = self._join(store, "comm", timeout)
            # every rank sees the same first grant (a change needs every rank's agreement); a job
            # on one host sends nothing between hosts, so a lane would be the same path again
            if self.comm.grant.mode == "switch" and (self.host is None or self.host.n_hosts > 1):
                self.lane = self._join(store, "comm-host", timeout, host_only=True)
        except Exception as e:
            self._leave(timeout=0)
            raise InaggSetupError(f"rank {rank}: cannot join an inagg job at {self.endpoint.controller}: {e}") from e
        paths = tuple(p for p in PATHS if p != "host" or self.lane is not None)
        if forced is not None and forced not in paths:
            self._leave(timeout=0)
            raise InaggSetupError(f"{PATH_ENV}={forced}: this job has no host lane (its grant is on the host "
                                  f"aggregator already); use inagg")
        self._closed = False
        self.allreduces: Counter[str] = Counter()   # eligible calls by path
        self.fallbacks: Counter[str] = Counter()    # "<collective>: <reason>" -> calls sent to gloo
        self._lock = threading.Lock()
        self._last_done = {p: 0.0 for p in paths}
        # each path's latest call, weakly: a strong reference would keep the caller's tensor alive
        # until the next call, which would then free it inside the caller's timed call
        self._last_work: dict[str, weakref.ref] = {}
        # the fast path's run (allreduce): its size, calls, calls left, calls to its next sample,
        # the samples' period
        self._run_nbytes, self._run_length, self._run_left, self._to_sample, self._sample_period = 0, 0, 0, 0, 0
        self._run_work: dist.Work | None = None
        self.paths = PathChooser(StoreMin(dist.PrefixStore("agree", store), rank, world_size), paths, forced=forced,
                                 shared_clock=_ranks_share_a_clock(dist.PrefixStore("clock", store), rank, world_size))
        self._calibrate()
        log.info("rank %d: inagg process group ready (job %d, %s mode%s, address %s)", rank, self.comm.job_id,
                 self.comm.grant.mode, f", host lane job {self.lane.job_id}" if self.lane else "",
                 self.endpoint.bind_ip)

    def _join(self, store: dist.Store, prefix: str, timeout: timedelta,
              **kwargs) -> Communicator | HostCommunicator:
        """This rank's communicator of a job at the endpoint's controller (rank 0 creates it):
        every rank a worker, or each host's leader when the host reduces first."""
        def join(rank: int, size: int) -> Communicator:
            return Communicator(dist.PrefixStore(prefix, store), rank, size, self.endpoint.controller,
                                bind_ip=self.endpoint.bind_ip, timeout=timeout.total_seconds(),
                                name=os.environ.get("TORCHELASTIC_RUN_ID", ""), **kwargs)

        return join(self.rank(), self.size()) if self.host is None else HostCommunicator(self.host, join)

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    # -- allreduce -----------------------------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: dist.AllreduceOptions | None = None) -> dist.Work:
        """Allreduce ``tensors`` on the path the chooser picks (module docstring).

        The fast path first: a call in a run of gloo calls of one size (the chooser's
        ``run_length``; some of them samples, ``_sample``), counted later (``_end_run``), costs
        a few attribute reads instead of the chooser's per-call Python, which every call pays
        before gloo's own allreduce. The run's latest Work is held (``_run_work``) until the
        next call is on the wire, so the previous one, and the tensor its caller let go of, are
        freed here, not inside the caller's ``wait``."""
        if self._run_left and opts is not None and len(tensors) == 1 and opts.reduceOp == _SUM:
            t = tensors[0]
            if t.nbytes == self._run_nbytes and t.dtype in _INAGG_DTYPES and t.is_contiguous() and t.is_cpu:
                self._run_left -= 1
                self._to_sample -= 1
                if self._to_sample:
                    self._run_work = self._gloo.allreduce(tensors, opts)
                    return self._run_work
                self._to_sample = self._sample_period
                return self._sample(tensors, opts)
        return self._allreduce(tensors, opts if opts is not None else dist.AllreduceOptions())

    def _sample(self, tensors: list[torch.Tensor], opts) -> dist.Work:
        """A sample of gloo's time in the run (``PathChooser.run_length``): timed as ``_start``
        times a call, without asking the chooser (counted with the run, ``_end_run``)."""
        idle, started = self._idle("gloo"), time.perf_counter()
        work = self._run_work = self._gloo.allreduce(tensors, opts)
        return self._timed("gloo", work, tensors[0].nbytes, started) if idle else work

    def _idle(self, path: str) -> bool:
        """Whether ``path``'s latest call is done (the run's, held, or else the weakly held
        one: a latest call no one holds any more counts as done, ``_start``)."""
        latest = self._run_work if path == "gloo" else None
        if latest is None:
            ref = self._last_work.get(path)
            latest = ref() if ref is not None else None
        return latest is None or latest.is_completed()

    def _timed(self, path: str, work: dist.Work, nbytes: int, started: float) -> dist.Work:
        """``work``, reporting its time from ``started`` to the chooser once its caller has waited."""
        return _TimedWork(work, lambda: self._observe(path, nbytes, started))

    def _allreduce(self, tensors: list[torch.Tensor], opts) -> dist.Work:
        """An allreduce the fast path did not take: the chooser picks its path."""
        previous = self._end_run()   # let go on return, once this call is on the wire  # noqa: F841
        op = opts.reduceOp
        reason = _ineligible(tensors, op)
        if reason:
            return self._to_gloo("allreduce", reason, tensors, opts)
        tensor = tensors[0]
        nbytes = tensor.nbytes
        path, measure = self.paths.choose(nbytes)
        self.allreduces[path] += 1
        if path == "gloo" and op == _SUM:   # a run may follow, after a sampled call too
            self._run_nbytes = nbytes
            self._run_left, first, self._sample_period = self.paths.run_length(nbytes, path)
            self._run_length, self._to_sample = self._run_left, first or -1   # -1: none in this run
            if not measure:   # gloo's own Work
                work = self._gloo.allreduce(tensors, opts)
                self._last_work["gloo"] = weakref.ref(work)
                return work
        return self._start(path, tensor, opts, measure)

    def _end_run(self) -> dist.Work | None:
        """Count the current run's calls (``PathChooser.skip``) and end it: before the chooser
        is asked again, so every rank's call numbers stay the same. Its latest Work is held
        weakly from now on, as every other call's (``_start``'s idle), and returned: the caller
        lets go of it once its own call is submitted."""
        taken, latest = self._run_taken(), self._run_work
        if taken:
            self.paths.skip(taken)
            self.allreduces["gloo"] += taken
            self._last_work["gloo"] = weakref.ref(latest)
        self._run_length = self._run_left = 0
        self._run_work = None
        return latest

    def _run_taken(self) -> int:
        """Calls the fast path took in the current run."""
        return self._run_length - self._run_left

    def _start(self, path: str, tensor: torch.Tensor, opts, measure: bool) -> dist.Work:
        """Start one allreduce on ``path``. Timed only when the chooser asks (``measure``) and
        the path is idle (a queued call's time is not its own), where the caller waits for it
        (``_TimedWork``), so every path's time is what its caller sees. A latest call that no
        one holds any more counts as done: its caller waited for it and let go, or handed it to
        C++ (DDP's reducer keeps its Works there; a call it queued behind an untimed one may
        be timed with the wait: one sample among a ring's, where the calls are under
        ``measure_from_seconds``, the median of a ring)."""
        idle = self._idle(path)
        started = time.perf_counter()
        average = opts.reduceOp == _AVG
        if path == "gloo" and not average:
            work = self._gloo.allreduce([tensor], opts)
        else:
            work = self._run(path, tensor, average)
        self._last_work[path] = weakref.ref(work)
        return self._timed(path, work, tensor.nbytes, started) if measure and idle else work

    def _observe(self, path: str, nbytes: int, started: float) -> None:
        """Feed the path's model with a call that just ended: from its start (``started``,
        taken before it was submitted), or from the previous call's end on that path if it was
        queued behind it (both paths run their calls in order), to now."""
        now = time.perf_counter()
        with self._lock:
            began = max(started, self._last_done[path])
            self._last_done[path] = now
        self.paths.observe(path, nbytes, now - began, began)

    def _run(self, path: str, tensor: torch.Tensor, average: bool) -> dist.Work:
        """Start one allreduce on ``path``; its future resolves to ``[tensor]`` (as gloo's).
        A small call on a communicator with nothing queued runs here, on the caller's thread:
        no hand-over to the communicator's I/O thread and back. A larger one is queued (DDP
        overlaps its bucket allreduces with the backward pass), and the caller waits on the
        communicator's future itself: only a caller that takes the Work's future gets one
        delivered on a thread of its own (``_resolve_to``)."""
        if path != "gloo":
            comm = self.comm if path == "inagg" else self.lane
            fut = comm.allreduce_async(tensor, ReduceOp.AVG if average else ReduceOp.SUM,
                                       inline_if_idle=tensor.nbytes < _INLINE_BELOW_BYTES)
            return _CallWork(fut, lambda: _resolve_to(fut, [tensor]))
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM    # gloo has no AVG: sum, then divide

        def result(f: torch.futures.Future) -> list[torch.Tensor]:
            f.value()   # raises gloo's error, if any, into the returned future
            if average:
                tensor.div_(self.size())
            return [tensor]

        fut = self._gloo.allreduce([tensor], opts).get_future().then(result)
        return _CallWork(fut, lambda: fut)

    def _calibrate(self) -> None:
        """Time every path at a few sizes (the same calls on every rank) and agree on the
        result, so the first real calls are already chosen from measurements."""
        for nbytes in _CALIBRATION_BYTES:
            # one path's calls after another's, each path's first untimed: a call right after
            # another path's is slow (that path's tail still holds the CPU), and a group's first
            # calls set up connections and buffers
            for path in self.paths.paths:
                for timed in (False,) + (True,) * _CALIBRATION_ROUNDS:
                    self._start(path, torch.zeros(nbytes // 4, dtype=torch.float32), dist.AllreduceOptions(),
                                measure=timed).wait()
        self.paths.agree()

    # -- everything else -----------------------------------------------------------------------

    def _to_gloo(self, collective: str, reason: str, *args: Any, **kwargs: Any) -> dist.Work:
        """Run ``collective`` on the inner gloo group, counted under ``reason`` (logged once)."""
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
                "allreduce_paths": dict(self.allreduces + Counter(gloo=self._run_taken())),
                "fallbacks": dict(self.fallbacks),
                "path_model": self.paths.as_dict(), "inagg": self.comm.stats(),
                "host_lane": self.lane.stats() if self.lane is not None else None}

    def path_history(self) -> list[dict]:
        """The recent eligible allreduces' paths, runs of calls in order
        (``PathChooser.history``; the current fast-path run's calls included): what the backend
        chose over time."""
        runs, taken = self.paths.history(), self._run_taken()
        if runs and taken:
            runs[-1]["calls"] += taken
        return runs

    def shutdown(self) -> None:
        """Leave the inagg job; rank 0 stops the local deployment it started once every rank
        is done with it. Called by ``dist.destroy_process_group``; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._leave()
        log.info("rank %d: inagg process group closed: %s", self.rank(), self.stats())

    def _leave(self, timeout: float = 30.0) -> None:
        """Leave the jobs joined so far and the endpoint (``Endpoint.close``, ``timeout``), and
        let the inner gloo group go."""
        for comm in (self.lane, self.comm):
            if comm is not None:
                comm.close()
        if self.host is not None:
            self.host.close()
        self.endpoint.close(self._local_store, self.rank(), self.size(), timeout=timeout)
        self._release_gloo()

    def _release_gloo(self) -> None:
        """Destroy the inner gloo group now, while the interpreter runs: its destructor joins
        its worker threads. A worker still letting go of a finished call (a tensor Python owns)
        needs the GIL; once the interpreter is finalizing, Python ends such a thread with a
        forced unwind that std::terminate()s the process (SIGABRT, "terminate called without an
        active exception", seen with PyTorch's own gloo groups, which outlive
        destroy_process_group under DDP). Nothing else holds the inner group, so dropping it
        destroys it (torch releases the GIL in that destructor)."""
        self._run_work = None
        self._gloo = _ShutDownGloo()


def _gloo_collective(name: str) -> Callable[..., dist.Work]:
    """The method that hands collective ``name`` to the inner gloo group (counted)."""
    def forward(self: InaggProcessGroup, *args: Any, **kwargs: Any) -> dist.Work:
        return self._to_gloo(name, "inagg implements allreduce only", *args, **kwargs)

    forward.__name__ = forward.__qualname__ = name
    forward.__doc__ = f"``{name}`` through the inner gloo group (counted)."
    return forward


for _name in GLOO_COLLECTIVES:
    setattr(InaggProcessGroup, _name, _gloo_collective(_name))
