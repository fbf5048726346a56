"""The ``inagg`` torch.distributed backend: ``dist.init_process_group("inagg")``.

A Python ``dist.ProcessGroup`` subclass (the pattern of PyTorch's test_c10d_pypg.py), created by
the creator that ``inagg.hostlib.pytorch.plugin`` registers with ``dist.Backend.register_backend``:

* An allreduce of one CPU or CUDA float32, bfloat16 or float16 (SUM or AVG) or int32 (SUM)
  tensor is eligible for inagg (a 16-bit tensor is quantized from its own format and its result
  is the float32 one rounded once to it: ``inagg.hostlib.wire.codec``; a CUDA tensor is staged through
  pinned host memory: ``inagg.hostlib.worker.cuda_staging``). Each eligible call takes the path the
  model predicts fastest (``inagg.hostlib.pytorch.path.choice``): ``inagg``,
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
  way ``wait`` raises the call's error (``JobFailed``, a refused input...), on every rank alike;
  the future fails as torch's C++ reads a future (DDP's reducer does): a RuntimeError carrying
  the error's type and text, as a gloo Work's future's (``_resolve_to``).
* Every path gives the same bits (unless ``INAGG_REPRODUCIBLE=0``): the communicators share one
  exponent block and ride limit, and the gloo path sums inagg's fixed point, not floats
  (``inagg.hostlib.pytorch.reproducible``), so a run does not depend on the paths its calls took.
* Everything else (other collectives, dtypes, ops, several tensors) goes to an inner
  ``ProcessGroupGloo`` on the same store, unchanged. Each kind is counted (``stats()``) and
  logged once: INFO for collectives inagg does not implement, WARNING for an allreduce that could
  not use inagg.

So DDP (its broadcasts, allgathers and bucket allreduces), ``dist.all_reduce`` of metrics and
PyTorch's own comm hooks (PowerSGD, fp16 compression) run unchanged. Where the job finds its
controller, and the local deployment a job brings up when none is named: ``inagg.hostlib.worker.local``.

The group is up as soon as its inner gloo group is: the inagg paths (rank 0's local deployment,
the joins at the controller) start in the background and the first call that needs them waits
for them (``InaggProcessGroup.ready``). Every rank watches the others (``inagg.hostlib.pytorch.peer_watch``):
a rank that ends fails every call of the others at once, on every path, with an error naming
it (a rank that stops without ending: once its lease at the peer watch runs out), and a start
still under way gives up at its next wait (``_start_stop``) instead of waiting for that rank.
Every wait ends by the process group's timeout at the latest. A Ctrl-C is a plain
``KeyboardInterrupt`` (``inagg.hostlib.pytorch.interrupts``), and a group left open at exit
leaves its job and stops its deployment while the interpreter can still run.
"""

from __future__ import annotations

import atexit
import gc
import logging
import math
import os
import signal
import sys
import threading
import time
import weakref
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, NoReturn

import torch
import torch.distributed as dist

from inagg.hostlib.pytorch import interrupts
from inagg.hostlib.pytorch.agreement import StoreMin
from inagg.hostlib.pytorch.peer_watch import EXIT, LEAVE, PeerWatch, wait_gloo
from inagg.hostlib.worker.communicator import Communicator, JobFailed, ReduceOp
from inagg.hostlib.worker.host_group import RankDied
from inagg.hostlib.worker.host_communicator import HostCommunicator, HostGroup, open_host_group
from inagg.hostlib.errors import InaggError, InaggSetupError
from inagg.hostlib.worker.local import Endpoint, PendingEndpoint, start_endpoint
from inagg.hostlib.worker.abortable_store import AbortableStore
from inagg.hostlib.pytorch.path.choice import PATHS, PathChooser
from inagg.hostlib.pytorch.reproducible import FixedPointGloo
from inagg.hostlib.worker.stream import Reduction, one_round_capacity
from inagg.hostlib.pytorch.path.links import GrantMove, LinkShape, job_links
from inagg.hostlib.wire.grant import Grant
from inagg.hostlib import BACKEND_NAME

log = logging.getLogger("inagg.backend")

# Collectives inagg does not implement, by the names torch's c10d calls on a process group: the
# inner gloo group runs them as they are (``_gloo_group``)
GLOO_COLLECTIVES = (
    "broadcast", "allgather", "_allgather_base", "all_gather_single", "allgather_coalesced",
    "allgather_into_tensor_coalesced", "all_gather_single_coalesced", "allreduce_coalesced", "reduce",
    "reduce_scatter", "gather", "scatter", "alltoall", "alltoall_base", "all_to_all_single", "barrier",
    "send", "recv", "recv_anysource",
)
# three sizes pin alpha and beta of each path (the median of a few rounds each: the machine may
# be shared), so the first real calls are already chosen from measurements
_CALIBRATION_BYTES = (64, 16 * 1024, 1 << 20)
_CALIBRATION_ROUNDS = 3
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)   # each quantized from its own format
_INAGG_DTYPES = _FLOAT_DTYPES + (torch.int32,)
# a smaller call on a communicator with nothing queued runs on the caller's thread (``_run``):
# the hand-over to the I/O thread and back costs most of a small call's time; larger ones stay
# queued, so DDP overlaps them with its backward pass
_INLINE_BELOW_BYTES = 64 << 10
_NOT_A_REDUCTION = "inagg runs allreduce and reduce-scatter only"
# a wait on a call of ours looks this often whether a rank has gone (which no path may report)
_FAILURE_CHECK_SECONDS = 0.2
# a call that failed with no rank known gone yet waits this long for the peer watch to name one:
# a rank's end reaches its peers' gloo connections and the peer watch's socket together
_NAMING_SECONDS = 2.0
# after a failure, ``destroy_process_group`` waits this long for the start to give up (it does
# at its next wait: a poll of the store, a slice of a call's wait)
_GIVE_UP_SECONDS = 1.0
# at interpreter exit, rank 0 waits this long for the other ranks to end before it stops the
# local deployment (they were told it is going: their calls fail and they end at once)
_EXIT_WAIT_SECONDS = 5.0
PATH_ENV = "INAGG_ALLREDUCE_PATH"   # auto (default) | inagg | host | gloo
REPRODUCIBLE_ENV = "INAGG_REPRODUCIBLE"   # 1 (default): the same bits on every path | 0


def _reproducible_requested() -> bool:
    """Whether ``INAGG_REPRODUCIBLE`` asks for the same bits on every path (the default)."""
    value = os.environ.get(REPRODUCIBLE_ENV, "1").strip().lower()
    if value not in ("0", "1"):
        raise InaggSetupError(f"{REPRODUCIBLE_ENV} must be 1 (the same bits on every path, the default) or 0 "
                              f"(gloo sums floats in its own order); got {value!r}")
    return value == "1"


def _forced_path() -> str | None:
    """The path ``INAGG_ALLREDUCE_PATH`` pins every eligible allreduce to (None: auto)."""
    value = os.environ.get(PATH_ENV, "auto").strip().lower()
    if value == "auto":
        return None
    if value not in PATHS:
        raise InaggSetupError(f"{PATH_ENV} must be auto, {' or '.join(PATHS)}; got {value!r}")
    return value


_SUM, _AVG = dist.ReduceOp.SUM, dist.ReduceOp.AVG
_STRIDED = torch.strided   # a dense tensor's layout (a sparse tensor has no nbytes, nor contiguity)
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def _ranks_share_a_clock(store: dist.Store, rank: int, world_size: int) -> bool:
    """Whether every rank's ``time.perf_counter`` reads one clock (CLOCK_MONOTONIC is the
    kernel's: one boot id on every rank), so the path chooser can time a call from the last
    rank's start to the last rank's end (``inagg.hostlib.pytorch.path.choice``). A collective."""
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
    if t.layout != _STRIDED:   # sparse: gloo sums those (inagg's paths carry dense values)
        return f"{t.layout} tensor"
    if not (t.is_cpu or t.is_cuda):   # a CUDA tensor is staged through pinned host memory
        return f"{t.device.type} tensor"
    if t.dtype not in _INAGG_DTYPES:
        return f"dtype {t.dtype}"
    if not t.is_contiguous():
        return "non-contiguous tensor"
    if op == _SUM or (op == _AVG and t.dtype in _FLOAT_DTYPES):
        return ""
    return f"op {op_name(op)}"


def op_name(op: dist.ReduceOp | dist.ReduceOp.RedOpType) -> str:
    """``op``'s name (SUM, MAX, PREMUL_SUM...): a ``dist.ReduceOp`` prints as an object address."""
    return getattr(op, "op", op).name


Named = Callable[[BaseException], BaseException]   # an error, or one naming the rank gone that caused it


def _settle(out: torch.futures.Future, fut: torch.futures.Future, value, named: Named) -> None:
    """Complete ``out`` (a future made by ``_resolve_to``, not the one it returns) with ``value``
    if ``fut`` succeeded, else with ``fut``'s error (``named``) as its value: ``_raise_failure``
    raises it into the future its caller holds."""
    try:
        fut.value()
        out.set_result(value)
    except Exception as e:  # noqa: BLE001 - handed on to whoever waits on ``out``
        out.set_result(_Failure(named(e)))


class _Failure:
    """A call's error carried as a future's value (``_settle``) to ``_raise_failure``."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _raise_failure(fut: torch.futures.Future):
    """``fut``'s value, or the error it carries raised: a future torch's C++ sees failed."""
    value = fut.value()
    if isinstance(value, _Failure):
        raise value.error
    return value


def _resolve_to(fut: torch.futures.Future, value, named: Named) -> torch.futures.Future:
    """A future of ``value`` once the communicator's ``fut`` succeeds (else failed with its error,
    ``named``). Already complete if ``fut`` is (a call run on the caller's thread): callbacks then
    run on the caller's thread. Otherwise delivered on a thread of its own: the communicator
    completes its futures on its one I/O thread, and a callback that waits there for another
    allreduce (PowerSGD's hook does) would wait for itself. (gloo's callbacks run on one of its
    worker threads.)

    The error is raised in a ``then`` callback, never set with ``Future.set_exception``: that
    completes the C++ future *successfully* with the exception object as its value (only Python's
    ``wait``/``value`` raise it), and DDP's reducer, reading a bucket's result in C++ at the end
    of the backward pass, takes that value for the bucket's tensors: it finds none and reads past
    an empty list (SIGSEGV in ``parseCppCommHookResult``). A ``then`` callback that raises fails
    its future in C++ (``setError``), so the reducer raises it: a RuntimeError whose text is the
    error's type and message, as for any failed c10d future."""
    settled = torch.futures.Future()
    out = settled.then(_raise_failure)
    if fut.done():
        _settle(settled, fut, value, named)
    else:
        fut.add_done_callback(lambda f: threading.Thread(target=_settle, args=(settled, f, value, named), daemon=True,
                                                         name="inagg-complete").start())
    return out


def _wait_for(fut: torch.futures.Future, failure: Callable[[], BaseException | None],
              timeout: timedelta | None = None) -> None:
    """Wait for ``fut`` on a Python lock, not in torch's C++ wait: a Ctrl-C is raised at once,
    and the wait ends with ``failure()`` (a rank gone or stopped) should the call never end, or
    with a RuntimeError once ``timeout`` (None or 0: none) has passed, as gloo's wait does."""
    done = threading.Event()
    fut.add_done_callback(lambda _: done.set())
    deadline = time.monotonic() + timeout.total_seconds() if timeout else None
    while not done.wait(_FAILURE_CHECK_SECONDS):
        error = failure()
        if error is not None:
            raise error
        if deadline is not None and time.monotonic() >= deadline and not done.is_set():
            raise RuntimeError(f"the call did not complete within its timeout ({timeout}): no rank is known "
                               f"gone (a rank that stops is named once its lease runs out)")


class _CallWork(dist.Work):
    """The Work of one call on a path of ours: ``wait`` waits on the call's own future ``done``
    and raises its error, ``named`` (the Work of torch's ``_create_work_from_future`` returns
    True from a failed future: ``dist.all_reduce`` would return as if the call had succeeded);
    a caller that takes its future (DDP, comm hooks) gets ``result()``, made on first use."""

    def __init__(self, done: torch.futures.Future, result: Callable[[], torch.futures.Future],
                 pg: "InaggProcessGroup") -> None:
        super().__init__()
        self._done, self._result, self._future, self._pg = done, result, None, pg

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Wait for the call, at most ``timeout`` (None: the process group's; as gloo's Work)."""
        try:
            if not self._done.done():
                _wait_for(self._done, self._pg.failure, timeout if timeout is not None else self._pg._timeout)
            self._done.value()   # raises the call's error
        except Exception as e:  # noqa: BLE001 - re-raised, naming the rank gone that caused it
            raise self._pg.named(e)
        return True

    def get_future(self) -> torch.futures.Future:
        if self._future is None:
            self._future = self._result()
        return self._future

    def is_completed(self) -> bool:
        return self._done.done()


class _GlooWork(dist.Work):
    """A Work of the inner gloo group, waited for in slices (``wait_gloo``: Ctrl-C and a rank
    gone end the wait) and its error naming the rank gone that caused it; its future likewise."""

    def __init__(self, work: dist.Work, pg: "InaggProcessGroup") -> None:
        super().__init__()
        self._work, self._pg = work, pg

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Wait for the call, at most ``timeout`` (None: the process group's, as gloo's own)."""
        try:
            return wait_gloo(self._work, self._pg.failure, timeout if timeout is not None else self._pg._timeout)
        except Exception as e:  # noqa: BLE001 - re-raised, naming the rank gone that caused it
            raise self._pg.named(e)

    def get_future(self) -> torch.futures.Future:
        named = self._pg.named

        def value(f: torch.futures.Future):
            try:
                return f.value()
            except Exception as e:  # noqa: BLE001 - re-raised, naming the rank gone that caused it
                raise named(e)

        return self._work.get_future().then(value)

    def is_completed(self) -> bool:
        return self._work.is_completed()

    def _source_rank(self) -> int:
        """The rank a receive from any source got its tensor from (``dist.recv`` asks)."""
        return self._work._source_rank()


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


class _ShardWork(dist.Work):
    """The Work of reduce-scatters run as allreduces (``InaggProcessGroup._reduce_scatter``):
    ``calls`` are (output, full, work), ``full`` the tensor ``work`` allreduces; once every
    ``work`` is done, this rank's shard of each ``full`` is copied to its output, once, on
    whichever thread learns it first (``wait`` or the future's callback). ``wait`` raises a
    call's error; the future resolves to the outputs (as gloo's reduce-scatter's)."""

    def __init__(self, calls: list[tuple[torch.Tensor, torch.Tensor, dist.Work]], rank: int) -> None:
        super().__init__()
        self._calls, self._rank = calls, rank
        self._lock, self._kept = threading.Lock(), False

    def _keep_shards(self) -> list[torch.Tensor]:
        with self._lock:
            if not self._kept:
                for output, full, _ in self._calls:
                    n = output.numel()
                    output.copy_(full.view(-1)[self._rank * n:(self._rank + 1) * n].view_as(output))
                self._kept = True
        return [output for output, _, _ in self._calls]

    def wait(self, timeout: timedelta | None = None) -> bool:
        for _, _, work in self._calls:
            work.wait()
        self._keep_shards()
        return True

    def get_future(self) -> torch.futures.Future:
        def kept(f: torch.futures.Future) -> list[torch.Tensor]:
            for done in f.value():
                done.value()   # raises a call's error into the returned future
            return self._keep_shards()

        return torch.futures.collect_all([work.get_future() for _, _, work in self._calls]).then(kept)

    def is_completed(self) -> bool:
        return all(work.is_completed() for _, _, work in self._calls)


def _gloo_group(gloo: dist.ProcessGroupGloo, store: dist.Store, rank: int, world_size: int) -> dist.ProcessGroup:
    """A process group whose CPU backend is ``gloo``, as torch builds one for
    ``init_process_group("gloo")``: torch's ``ProcessGroup`` methods (``all_gather_single``,
    ``reduce_scatter_tensor_coalesced``...) dispatch to the backend's own collectives, which the
    backend's Python binding does not all have."""
    group = dist.ProcessGroup(store, rank, world_size)
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, gloo)
    group._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    return group


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
        same_bits = _reproducible_requested()
        self._timeout = timeout
        self._group_name = self._group_desc = ""
        self._closed = False
        self.endpoint: Endpoint | None = None
        self.comm: Communicator | HostCommunicator | None = None
        self.lane: Communicator | HostCommunicator | None = None
        self.host: HostGroup | None = None   # this host's ranks reduce together first (worker.host_reduce)
        self._fixed: FixedPointGloo | None = None
        self.peers: PeerWatch | None = None
        self.paths: PathChooser | None = None
        self.allreduces: Counter[str] = Counter()   # eligible calls by path
        self.fallbacks: Counter[str] = Counter()    # "<collective>: <reason>" -> calls sent to gloo
        self.via_allreduce: Counter[str] = Counter()   # collective -> calls run as allreduces
        self._lock = threading.Lock()
        # one leaving at a time: a start that gives up (its thread) and destroy may both leave
        self._leave_lock = threading.Lock()
        # each path's latest call, weakly: a strong reference would keep the caller's tensor alive
        # until the next call, which would then free it inside the caller's timed call
        self._last_work: dict[str, weakref.ref] = {}
        # the fast path's run (allreduce): its size, calls, calls left, calls to its next sample,
        # the samples' period
        self._run_nbytes, self._run_length, self._run_left, self._to_sample, self._sample_period = 0, 0, 0, 0, 0
        self._run_work: dist.Work | None = None
        self._local_store = dist.PrefixStore("local", store)
        pending = start_endpoint(self._local_store, rank, world_size)   # rank 0's local deployment starts now
        try:
            self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, world_size, timeout)
            # the fixed-point path's own gloo group, here: its rendezvous waits in C++ for every
            # rank, which the start could not give up on should one die (``_start_stop``)
            fixed_gloo = (dist.ProcessGroupGloo(dist.PrefixStore("gloo-fixed", store), rank, world_size, timeout)
                          if same_bits else None)
            # every rank is here (the gloo group is a collective): from now on a rank that ends is named
            self.peers = PeerWatch(dist.PrefixStore("peers", store), rank, world_size, pending.watch_ip, timeout,
                                   self._rank_gone)
        except BaseException:
            pending.cancel()
            raise
        self._gloo_group = _gloo_group(self._gloo, store, rank, world_size)
        self._start_error: BaseException | None = None
        self._ready = False   # the paths started (``_start_paths``) and calibrated (``ready``)
        self._calibrated = False
        self._ready_lock = threading.Lock()
        # set when the start ended, one way or the other (waited on as an Event: a Ctrl-C that
        # interrupts Thread.join leaves the thread looking stopped while it runs, Python 3.11)
        self._started = threading.Event()
        threading.Thread(target=self._start_paths, args=(pending, store, timeout, fixed_gloo, forced), daemon=True,
                         name="inagg-start").start()
        interrupts.install()
        atexit.register(self._close_at_exit)   # after the local deployment's own: runs before it

    def _start_paths(self, pending: PendingEndpoint, store: dist.Store, timeout: timedelta,
                     fixed_gloo: dist.ProcessGroupGloo | None, forced: str | None) -> None:
        """The inagg paths, in the background from ``init_process_group`` on (thread
        ``inagg-start``): the endpoint (rank 0's local deployment coming up), the
        communicators' joins and the path chooser. ``init_process_group`` returns once the
        inner gloo group is up, as gloo's does; what the program does next (its model, its
        data, DDP's broadcasts on gloo) overlaps this, and the first call that needs the paths
        waits for the rest (``ready``). With the same bits on every path the paths are
        calibrated here too (the gloo path's calls then run on a gloo group of their own,
        ``fixed_gloo``, not the inner one the program's collectives use meanwhile). A failure
        leaves what was joined and is kept for that call to raise; a rank gone meanwhile ends
        the start at its next wait (``_start_stop``)."""
        try:
            self._open_paths(pending, store, timeout, fixed_gloo, forced)
        except BaseException as e:  # noqa: BLE001 - raised by ``ready``
            pending.cancel()
            self._leave_paths()
            self._start_error = e
        finally:
            self._started.set()

    def _open_paths(self, pending: PendingEndpoint, store: dist.Store, timeout: timedelta,
                    fixed_gloo: dist.ProcessGroupGloo | None, forced: str | None) -> None:
        rank, world_size = self.rank(), self.size()
        self.endpoint = pending.result(self._start_stop)
        try:
            self._join_paths(store, timeout, fixed_gloo)
        except Exception as e:
            raise InaggSetupError(f"rank {rank}: cannot join an inagg job at {self.endpoint.controller}: {e}") from e
        paths = tuple(p for p in PATHS if p != "host" or self.lane is not None)
        if forced is not None and forced not in paths:
            why = ("its ranks reduce on their one host; INAGG_HOST_REDUCE=off makes each rank a worker"
                   if self.host is not None else "its grant is on the host aggregator already")
            raise InaggSetupError(f"{PATH_ENV}={forced}: this job has no host lane ({why}); use inagg")
        self._last_done = {p: 0.0 for p in paths}
        self.paths = PathChooser(StoreMin(dist.PrefixStore("agree", store), rank, world_size, self.failure), paths,
                                 forced=forced,
                                 shared_clock=_ranks_share_a_clock(self._start_store(store, "clock"), rank, world_size),
                                 links=self._links(self.comm.grant), move=self._grant_move())
        if self._fixed is not None:
            self._calibrate()
            self._calibrated = True

    def _grant_move(self) -> GrantMove | None:
        """How the path choice sees the job's grant move; None where this rank's host reduces
        first (only a host's leader follows the job's grants)."""
        comm = self.comm
        if not isinstance(comm, Communicator):
            return None
        return GrantMove(lambda: comm.grant.epoch, lambda: (comm.pending_grant or comm.grant).epoch,
                         lambda: self._links(comm.pending_grant or comm.grant))

    def _links(self, grant: Grant) -> LinkShape | None:
        """The job's links under ``grant`` (and its host lane's), where their rate is known."""
        return job_links(self.endpoint.bind_ip, self.size(), grant, self.lane.grant if self.lane else None)

    def ready(self) -> None:
        """Wait for the inagg paths (``_start_paths``) and, the first time, calibrate them (the same
        calls on every rank: every rank's first call that needs the paths is the same call);
        raises what kept them from starting, or the rank gone meanwhile (a join waits for every
        rank). Every eligible allreduce asks first."""
        if self._ready:
            return
        with self._ready_lock:
            if self._ready:
                return
            while not self._started.wait(_FAILURE_CHECK_SECONDS):
                if (gone := self.failure()) is not None:
                    raise gone
            if self._start_error is not None:   # a rank's end may be what broke it (rank 0's, the store's host)
                error = InaggSetupError(str(self._start_error))
                error.__cause__ = self._start_error
                raise self.named(error)
            if not self._calibrated:
                self._calibrate()
            self._ready = True
        log.info("rank %d: inagg process group ready (job %d, %s mode%s, address %s)", self.rank(), self.comm.job_id,
                 self.comm.grant.mode, f", host lane job {self.lane.job_id}" if self.lane else "",
                 self.endpoint.bind_ip)

    def _start_stop(self) -> RankDied | None:
        """Why the start gives up now: a rank gone while it runs (its waits would wait for that
        rank until the group's timeout, and past the program's end). None once the start is
        over: a communicator's later store calls (its heartbeat's) are its own."""
        return None if self._started.is_set() else self.failure()

    def _start_store(self, store: dist.Store, prefix: str) -> AbortableStore:
        """``store`` under ``prefix``, for the start's joins: its waits end with ``_start_stop``."""
        return AbortableStore(dist.PrefixStore(prefix, store), self._start_stop)

    def _join_paths(self, store: dist.Store, timeout: timedelta, fixed_gloo: dist.ProcessGroupGloo | None) -> None:
        """Every path's communicator (and the host group): the joins of the jobs at the controller."""
        rank, world_size = self.rank(), self.size()
        self.host = open_host_group(self._start_store(store, "host"), rank, world_size, timeout)
        if self.host is not None and (gone := self.failure()) is not None:   # named before ``_rank_gone`` saw it
            self.host.fail(gone)
        self.comm = self._join(store, "comm", timeout)
        # every rank sees the same first grant (a change needs every rank's agreement); a job
        # on one host sends nothing between hosts, so a lane would be the same path again
        if self.comm.grant.mode == "switch" and (self.host is None or self.host.n_hosts > 1):
            self.lane = self._join(store, "comm-host", timeout, host_only=True)
        self._fixed = self._reproducible(fixed_gloo) if fixed_gloo is not None else None

    def _rank_gone(self, error: RankDied) -> None:
        """A rank ended without leaving (the peer watch's thread): every path's calls fail with
        ``error``, which names it, now and from now on."""
        for comm in (self.comm, self.lane):
            if comm is not None:
                comm.fail(str(error))
        if self.host is not None:   # its waits for a rank of the host (a stopped one: no end-of-file)
            self.host.fail(error)
        if self._fixed is not None:
            self._fixed.fail(self.failure)

    def failure(self) -> RankDied | None:
        """The rank gone that failed this group, if one has (an error of its own to raise)."""
        gone = self.peers.failure if self.peers is not None else None
        return RankDied(gone.rank, str(gone)) if gone is not None else None

    def named(self, error: BaseException) -> BaseException:
        """``error``, or one naming the rank whose end caused it: a rank's end fails its peers'
        calls in the words of whatever noticed first (gloo's "Connection closed by peer", a
        store that is gone with rank 0...: a RuntimeError); the peer watch names it. Any other
        error (a refused input: ValueError, FloatingPointError), one naming a rank already and a
        use after shutdown stay as they are."""
        if not isinstance(error, RuntimeError) or isinstance(error, JobFailed) or self.peers is None or self._closed:
            return error
        gone = self.peers.wait_for_failure(_NAMING_SECONDS)
        if gone is None:
            return error
        named = RankDied(gone.rank, f"{gone} (this rank's call failed: {error})")
        named.__cause__ = error
        return named

    def _join(self, store: dist.Store, prefix: str, timeout: timedelta,
              **kwargs) -> Communicator | HostCommunicator:
        """This rank's communicator of a job at the endpoint's controller (rank 0 creates it):
        every rank a worker, or each host's leader when the host reduces first."""
        def join(rank: int, size: int) -> Communicator:
            return Communicator(self._start_store(store, prefix), rank, size, self.endpoint.controller,
                                bind_ip=self.endpoint.bind_ip, timeout=timeout.total_seconds(),
                                name=os.environ.get("TORCHELASTIC_RUN_ID", ""), **kwargs)

        return join(self.rank(), self.size()) if self.host is None else HostCommunicator(self.host, join)

    def _reproducible(self, gloo: dist.ProcessGroupGloo) -> FixedPointGloo:
        """For ``INAGG_REPRODUCIBLE`` (on by default): one ``Reduction`` for every path, so a float call
        gives the same bits whichever it takes (``inagg.hostlib.pytorch.reproducible``). The
        communicators' streams share its exponent block (a multiple of each grant's K) and the
        limit of calls that ride in the control round (the smallest capacity); the gloo path runs
        their arithmetic. Decided from the first grants, the same on every rank."""
        comms = [c for c in (self.comm, self.lane) if c is not None]
        reduction = Reduction(block=math.lcm(*(c.grant.values_per_packet for c in comms)),
                              exact_limit=max(0, min(one_round_capacity(c.grant.values_per_packet, self.size(), True)
                                                     for c in comms)))
        for comm in comms:
            if isinstance(comm, Communicator):
                comm.stream.reduction = reduction
        if self.host is not None:   # its leader's calls between hosts are int32 sums
            self.host.reduce.reduction = reduction
        return FixedPointGloo(gloo, reduction)

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    # torch keeps a group's name and description on its backends; this group has none registered
    # (every collective is its own), so it keeps them itself: DeviceMesh (FSDP2) names groups
    def setGroupName(self, name: str) -> None:  # noqa: N802 - torch's name
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802 - torch's name
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802 - torch's name
        self._group_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802 - torch's name
        return self._group_desc

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
            if t.layout == _STRIDED and t.nbytes == self._run_nbytes and t.dtype in _INAGG_DTYPES and t.is_contiguous() and t.is_cpu:
                self._run_left -= 1
                self._to_sample -= 1
                if self._to_sample:
                    self._run_work = self._gloo_sum(tensors, opts)
                    return self._run_work
                self._to_sample = self._sample_period
                return self._sample(tensors, opts)
        return self._allreduce(tensors, opts if opts is not None else dist.AllreduceOptions())

    def _sample(self, tensors: list[torch.Tensor], opts) -> dist.Work:
        """A sample of gloo's time in the run (``PathChooser.run_length``): timed as ``_start``
        times a call, without asking the chooser (counted with the run, ``_end_run``)."""
        idle, started = self._idle("gloo"), time.perf_counter()
        work = self._run_work = self._gloo_sum(tensors, opts)
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
        self.ready()
        try:
            path, measure = self.paths.choose(nbytes)   # may agree with the other ranks (the store)
        except Exception as e:  # noqa: BLE001 - re-raised, naming the rank gone that caused it
            raise self.named(e)
        self.allreduces[path] += 1
        if path == "gloo" and op == _SUM:   # a run may follow, after a sampled call too
            self._run_nbytes = nbytes
            self._run_left, first, self._sample_period = self.paths.run_length(nbytes, path)
            self._run_length, self._to_sample = self._run_left, first or -1   # -1: none in this run
            if not measure:   # gloo's own Work
                work = self._gloo_sum(tensors, opts)
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
            work = self._gloo_sum([tensor], opts)
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
            return _CallWork(fut, lambda: _resolve_to(fut, [tensor], self.named), self)
        if self._fixed is not None and tensor.is_floating_point():
            return self._fixed_call(tensor, self.size() if average else 1)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM    # gloo has no AVG: sum, then divide

        def result(f: torch.futures.Future) -> list[torch.Tensor]:
            try:
                f.value()
            except Exception as e:  # noqa: BLE001 - gloo's error, into the returned future, naming the rank gone
                raise self.named(e)
            if average:
                tensor.div_(self.size())
            return [tensor]

        fut = self._gloo.allreduce([tensor], opts).get_future().then(result)
        return _CallWork(fut, lambda: fut, self)

    def _gloo_sum(self, tensors: list[torch.Tensor], opts) -> dist.Work:
        """An eligible SUM on the gloo path: gloo's own, or for a float tensor with reproducible
        results the fixed-point one (``_reproducible``)."""
        if self._fixed is not None and tensors[0].is_floating_point():
            return self._fixed_call(tensors[0], 1)
        return _GlooWork(self._gloo.allreduce(tensors, opts), self)

    def _fixed_call(self, tensor: torch.Tensor, divisor: int) -> dist.Work:
        """A float call on the gloo path in inagg's fixed point; a small one with nothing queued
        runs on the caller's thread (as ``_run``'s), and a future is delivered as ``_run``'s."""
        fut = self._fixed.allreduce(tensor, divisor, inline_if_idle=tensor.nbytes < _INLINE_BELOW_BYTES)
        return _CallWork(fut, lambda: _resolve_to(fut, [tensor], self.named), self)

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

    # -- reduce-scatter: an allreduce whose result each rank keeps its shard of ------------------

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002 - torch's name
                              opts: dist.ReduceScatterOptions | None = None) -> dist.Work:
        """``dist.reduce_scatter_tensor`` (``_reduce_scatter``)."""
        return self._reduce_scatter("reduce_scatter_single", [output], [input], opts, coalesced=False)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002 - torch's name
                             opts: dist.ReduceScatterOptions | None = None) -> dist.Work:
        """The older name of ``reduce_scatter_single`` (``_reduce_scatter``)."""
        return self._reduce_scatter("_reduce_scatter_base", [output], [input], opts, coalesced=False)

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: dist.ReduceScatterOptions | None = None) -> dist.Work:
        """Reduce-scatters gathered by ``dist._coalescing_manager`` (``_reduce_scatter``)."""
        return self._reduce_scatter("reduce_scatter_single_coalesced", outputs, inputs, opts, coalesced=True)

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: dist.ReduceScatterOptions | None = None) -> dist.Work:
        """The C++ name of ``reduce_scatter_single_coalesced`` (``_reduce_scatter``)."""
        return self._reduce_scatter("reduce_scatter_tensor_coalesced", outputs, inputs, opts, coalesced=True)

    def _reduce_scatter(self, collective: str, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                        opts: dist.ReduceScatterOptions | None, coalesced: bool) -> dist.Work:
        """Each input allreduced (a copy: the input stays as it was) on the path ``allreduce``
        chooses, and the rank's shard of the sum copied to its output: every rank's share of
        the work is the allreduce's, which INA does at line rate. Where an allreduce of the
        input could not use inagg (``_unshardable``), the inner gloo group's reduce-scatter."""
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        reason = self._unshardable(outputs, inputs, opts.reduceOp)
        if reason:
            args = (outputs, inputs) if coalesced else (outputs[0], inputs[0])
            return self._to_gloo(collective, reason, *args, opts)
        self.via_allreduce[collective] += 1
        allreduce_opts = dist.AllreduceOptions()
        allreduce_opts.reduceOp = opts.reduceOp
        calls = []
        for output, input_ in zip(outputs, inputs):
            full = input_.clone(memory_format=torch.contiguous_format)
            calls.append((output, full, self.allreduce([full], allreduce_opts)))
        return _ShardWork(calls, self.rank())

    def _unshardable(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], op) -> str:
        """Why these reduce-scatters cannot run as allreduces on inagg's paths ('' if they can)."""
        if len(outputs) != len(inputs) or not inputs:
            return f"{len(outputs)} outputs for {len(inputs)} inputs"
        for output, input_ in zip(outputs, inputs):
            reason = _ineligible([input_], op)
            if reason:
                return reason
            if output.dtype != input_.dtype or not output.is_contiguous() or not output.is_cpu:
                return "output not a contiguous CPU tensor of the input's dtype"
            if input_.numel() != output.numel() * self.size():
                return "input not the ranks' outputs end to end"
        return ""

    # -- everything else -----------------------------------------------------------------------

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """gloo's monitored barrier on the inner group: rank 0 names the ranks that did not
        arrive within ``timeout`` (the group's, if None). ``dist.monitored_barrier`` refuses
        every backend not named gloo before it gets here; ``monitored_barrier`` (this module)
        is the same call for any group."""
        self._to_gloo("monitored_barrier", _NOT_A_REDUCTION, timeout if timeout is not None else self._timeout,
                      wait_all_ranks=wait_all_ranks)

    def _to_gloo(self, collective: str, reason: str, *args: Any, **kwargs: Any) -> dist.Work:
        """Run ``collective`` on the inner gloo group, counted under ``reason`` (logged once)."""
        key = f"{collective}: {reason}"
        first = key not in self.fallbacks
        self.fallbacks[key] += 1
        if first:
            level = logging.WARNING if collective == "allreduce" else logging.INFO
            log.log(level, "rank %d: %s goes to gloo (%s); counted in stats()['fallbacks']",
                    self.rank(), collective, reason)
        gloo = self._gloo if collective == "allreduce" else self._gloo_group
        try:
            work = getattr(gloo, collective)(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - re-raised, naming the rank gone that caused it
            raise self.named(e)
        return _GlooWork(work, self) if isinstance(work, dist.Work) else work

    def stats(self) -> dict:
        """Calls by path, gloo fallbacks by kind, the agreed path model and the communicator's
        counters (mode, bytes, retransmissions, ...); once the paths are ready."""
        self.ready()
        return {"controller": self.endpoint.controller, "address": self.endpoint.bind_ip,
                "allreduce_paths": dict(self.allreduces + Counter(gloo=self._run_taken())),
                "fallbacks": dict(self.fallbacks), "via_allreduce": dict(self.via_allreduce),
                "path_model": self.paths.as_dict(), "inagg": self.comm.stats(),
                "host_lane": self.lane.stats() if self.lane is not None else None}

    def path_history(self) -> list[dict]:
        """The recent eligible allreduces' paths, runs of calls in order
        (``PathChooser.history``; the current fast-path run's calls included): what the backend
        chose over time."""
        self.ready()
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
        atexit.unregister(self._close_at_exit)
        # what the start joins must be there to be left; after a failure, what it has once it
        # gave up (at its next wait, ``_start_stop``): it leaves what it joins later itself
        self._started.wait(_GIVE_UP_SECONDS if self.failure() is not None else None)
        self._leave()
        if self._ready:
            log.info("rank %d: inagg process group closed: %s", self.rank(), self.stats())

    def _close_at_exit(self) -> None:
        """At interpreter exit, a group still open (the script ended without
        ``destroy_process_group``, or a Ctrl-C ended it) leaves as ``shutdown`` does, saying
        it exits (the other ranks' calls then fail at once, naming it) and while threads can
        still run: a gloo or communicator thread still running when the interpreter finalizes
        aborts the process. A second Ctrl-C (torchrun forwards one) does not cut it short.
        After a Ctrl-C, rank 0 says what became of the job in one line."""
        if self._closed:
            return
        self._closed = True
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        self._started.wait(_EXIT_WAIT_SECONDS)
        self._leave(_EXIT_WAIT_SECONDS, how=EXIT)
        if interrupts.interrupted() and self.rank() == 0:
            job = f"job {self.comm.job_id}" if self.comm is not None else "the job (still starting)"
            stopped = " and its local deployment stopped" if self.endpoint and self.endpoint.services else ""
            print(f"inagg: interrupted: {job} ended{stopped}", file=sys.stderr, flush=True)

    def _leave(self, timeout: float = 30.0, how: bytes = LEAVE) -> None:
        """Leave the jobs joined so far, let the inner gloo group go (its connections close, so
        a peer's gloo call stuck on this rank after a failure ends), leave the peer watch
        (``how``; rank 0 waits up to ``timeout`` for the other ranks to leave or end, unless
        the group failed: a failed job's ranks call its controller no more) and stop the local
        deployment this rank started."""
        with self._leave_lock:
            self._close_communicators()
            self._release_gloo()
            self._close_watch(timeout, how)

    def _leave_paths(self) -> None:
        """Leave what the start joined (it failed): the inner gloo group stays, the program's
        other collectives go on until ``destroy_process_group``."""
        with self._leave_lock:
            self._close_communicators()
            self._close_watch(0.0, LEAVE)

    def _close_communicators(self) -> None:
        for comm in (self.lane, self.comm):
            if comm is not None:
                comm.close()
        if self._fixed is not None:
            self._fixed.close()
        if self.host is not None:
            self.host.close()

    def _close_watch(self, timeout: float, how: bytes) -> None:
        """Leave the peer watch, then stop the local deployment this rank started (``_leave``)."""
        if self.peers is not None:
            self.peers.close(how, wait=0 if self.failure() is not None else timeout)
        if self.endpoint is not None:
            self.endpoint.close()

    def _release_gloo(self) -> None:
        """Destroy the inner gloo group (its backend and the process group around it) now, while the interpreter runs: its destructor joins
        its worker threads. A worker still letting go of a finished call (a tensor Python owns)
        needs the GIL; once the interpreter is finalizing, Python ends such a thread with a
        forced unwind that std::terminate()s the process (SIGABRT, "terminate called without an
        active exception", seen with PyTorch's own gloo groups, which outlive
        destroy_process_group under DDP). Nothing else holds the inner group, so dropping it
        destroys it (torch releases the GIL in that destructor). After a failure a failed
        call's Work may still hold its gloo context (and its connections: a peer's call stuck
        on them ends only when they close) in an exception's reference cycle: collected now."""
        self._run_work = None
        self._gloo = self._gloo_group = _ShutDownGloo()
        if self.failure() is not None:
            gc.collect()


def _gloo_collective(name: str) -> Callable[..., dist.Work]:
    """The method that hands collective ``name`` to the inner gloo group (counted)."""
    def forward(self: InaggProcessGroup, *args: Any, **kwargs: Any) -> dist.Work:
        return self._to_gloo(name, _NOT_A_REDUCTION, *args, **kwargs)

    forward.__name__ = forward.__qualname__ = name
    forward.__doc__ = f"``{name}`` through the inner gloo group (counted)."
    return forward


for _name in GLOO_COLLECTIVES:
    setattr(InaggProcessGroup, _name, _gloo_collective(_name))


def monitored_barrier(group: dist.ProcessGroup | None = None, timeout: timedelta | None = None,
                      wait_all_ranks: bool = False) -> None:
    """``dist.monitored_barrier`` that also takes an inagg group: torch's refuses every group
    whose backend is not named gloo, though all it does then is call the group's own
    ``monitored_barrier`` (``InaggProcessGroup.monitored_barrier``). Any other group goes to
    torch's, unchanged. Rank 0 raises naming the ranks that did not arrive within ``timeout``
    (default: the group's timeout)."""
    pg = group if group is not None else dist.group.WORLD
    if isinstance(pg, InaggProcessGroup):
        return pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)
    return dist.monitored_barrier(group, timeout, wait_all_ranks)
