"""The allreduce dispatch of an ``inagg`` process group (``inagg.hostlib.pytorch.backend``): which
path each allreduce takes, and running it there.

Design: an eligible allreduce (``_ineligible`` says which are) takes the path the chooser
(``inagg.hostlib.pytorch.path.choice``) predicts fastest; ineligible ones go to the inner gloo
group. A call is timed only when the chooser asks and its path is idle, where its caller waits
(``_TimedWork``), so every path's time is what its callers see. A run of gloo calls of one size
skips the chooser (``allreduce``'s fast path: a few attribute reads instead of the chooser's
per-call Python), its samples timed here (``_sample``) and its calls counted when it ends
(``_end_run``). A small call on a communicator with nothing queued runs on the caller's thread
(``_run``); with the same bits on every path, a float call on the gloo path sums inagg's fixed
point (``_fixed_call``, ``inagg.hostlib.pytorch.reproducible``), carrying the news of a grant move
(``_ticket``). A reduce-scatter takes the path
the chooser picks for an allreduce of its input, and its time feeds that path's model as one
(``reduce_scatter``: only the rank's shard where the path can deliver just that). A
non-contiguous tensor is staged through a contiguous copy (``_staged``), on every path alike.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import Counter
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from inagg.hostlib.pytorch.path.calibration import LADDER, CalibrationPlan
from inagg.hostlib.pytorch.path.choice import PATHS
from inagg.hostlib.pytorch.path.news import Ticket
from inagg.hostlib.pytorch.path.options import TINY_BYTES
from inagg.hostlib.pytorch.works import _CallWork, _DoneWork, _GlooWork, _resolve_to, _ShardWork, _TimedWork, failed_work
from inagg.hostlib.worker.tensors import ReduceOp

if TYPE_CHECKING:
    from inagg.hostlib.pytorch.backend import InaggProcessGroup
    from inagg.hostlib.pytorch.lifecycle import GroupLifecycle

# a job on one host (no deployment, nothing to wait for but the calibration) climbs only to the
# size that is cheap to time: its 1 MiB calls took ~0.2 s of a ~0.25 s calibration on 2 ranks,
# the whole of its first call's wait; a larger class is probed when first used, as any new one
_ONE_HOST_LADDER = LADDER[:2]
_CALIBRATION_ROUNDS = 3   # timed calls per path and size (the median of a few: the machine may be shared)
_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)   # each quantized from its own format
_INAGG_DTYPES = _FLOAT_DTYPES + (torch.int32,)
_NATIVE_TINY_DTYPES = (torch.float32, torch.int32)   # a tiny call of these runs in C++ (``_tiny``)
# a smaller call on a communicator with nothing queued runs on the caller's thread (``_run``):
# the hand-over to the I/O thread and back costs most of a small call's time; larger ones stay
# queued, so DDP overlaps them with its backward pass
_INLINE_BELOW_BYTES = 64 << 10
_SUM, _AVG = dist.ReduceOp.SUM, dist.ReduceOp.AVG
_STRIDED = torch.strided   # a dense tensor's layout (a sparse tensor has no nbytes, nor contiguity)


def _ineligible(tensors: list[torch.Tensor], op: dist.ReduceOp) -> str:
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
    if op == _SUM or (op == _AVG and t.dtype in _FLOAT_DTYPES):
        return ""
    return f"op {op_name(op)}"


def op_name(op: dist.ReduceOp | dist.ReduceOp.RedOpType) -> str:
    """``op``'s name (SUM, MAX, PREMUL_SUM...): a ``dist.ReduceOp`` prints as an object address."""
    return getattr(op, "op", op).name


class AllreduceDispatch:
    """The allreduces of ``group`` (module docstring), on the paths ``lifecycle`` opened. Its
    Works are ``group``'s (which names a rank gone); ``allreduces`` counts eligible calls by path,
    ``volume`` every allreduce's calls and bytes by route (``inagg.hostlib.pytorch.carriers``)."""

    def __init__(self, group: InaggProcessGroup, lifecycle: GroupLifecycle) -> None:
        """No call yet, no run: the paths are ``lifecycle``'s once it has started them."""
        self._group, self._life, self._gloo = group, lifecycle, lifecycle.gloo
        self.allreduces: Counter[str] = Counter()   # eligible calls by path
        self._calls: Counter[str] = Counter()   # every allreduce's calls by route (``volume``)
        self._bytes: Counter[str] = Counter()   # ... and their tensors' bytes
        self._lock = threading.Lock()
        # each path's latest call, weakly: a strong reference would keep the caller's tensor alive
        # until the next call, which would then free it inside the caller's timed call
        self._last_work: dict[str, weakref.ref] = {}
        self._last_done = dict.fromkeys(PATHS, 0.0)   # each path's latest call's end (``_observe``)
        # the fast path's run (allreduce): its size, calls, calls left, calls to its next sample,
        # the samples' period
        self._run_nbytes, self._run_length, self._run_left, self._to_sample, self._sample_period = 0, 0, 0, 0, 0
        self._run_dtype: torch.dtype | None = None
        self._run_work: dist.Work | None = None

    def allreduce(self, tensors: list[torch.Tensor], opts: dist.AllreduceOptions | None = None) -> dist.Work:
        """Allreduce ``tensors`` on the path the chooser picks (module docstring).

        The fast path first: a call in a run of gloo calls of one size (the chooser's
        ``run_length``; some of them samples, ``_sample``), counted later (``_end_run``), costs
        a few attribute reads instead of the chooser's per-call Python, which every call pays
        before gloo's own allreduce. The run's latest Work is held (``_run_work``) until the
        next call is on the wire, so the previous one, and the tensor its caller let go of, are
        freed here, not inside the caller's ``wait``."""
        if len(tensors) == 1 and tensors[0].layout == _STRIDED and not tensors[0].is_contiguous():
            return self._staged(tensors[0], opts)
        if self._run_left and opts is not None and len(tensors) == 1 and opts.reduceOp == _SUM:
            t = tensors[0]
            if t.layout == _STRIDED and t.nbytes == self._run_nbytes and t.dtype is self._run_dtype and t.is_cpu:
                self._run_left -= 1
                self._to_sample -= 1
                if self._to_sample:
                    self._run_work = self._gloo_sum(tensors, opts)
                    return self._run_work
                self._to_sample = self._sample_period
                return self._sample(tensors, opts)
        return self._allreduce(tensors, opts if opts is not None else dist.AllreduceOptions())

    def _staged(self, tensor: torch.Tensor, opts: dist.AllreduceOptions | None) -> dist.Work:
        """A non-contiguous tensor's allreduce: a contiguous copy takes the call, and the sum is
        copied back into ``tensor`` once it is done. Contiguity is a rank's own layout, never a
        reason to take another path than the other ranks (their calls would not meet)."""
        staged = tensor.contiguous()
        return _ShardWork.whole(tensor, staged, self.allreduce([staged], opts))

    def _sample(self, tensors: list[torch.Tensor], opts: dist.AllreduceOptions) -> dist.Work:
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

    def _allreduce(self, tensors: list[torch.Tensor], opts: dist.AllreduceOptions) -> dist.Work:
        """An allreduce the fast path did not take: the chooser picks its path."""
        previous = self._end_run()   # let go on return, once this call is on the wire  # noqa: F841
        op = opts.reduceOp
        reason = _ineligible(tensors, op)
        if reason:
            self._carry("gloo", 1, sum(t.nbytes for t in tensors if t.layout == _STRIDED))
            return self._gloo.run("allreduce", reason, tensors, opts)
        tensor = tensors[0]
        nbytes = tensor.nbytes
        self._life.ready()
        if nbytes <= TINY_BYTES and self._life.tiny_on_host and tensor.is_cpu:
            return self._tiny(tensor, op == _AVG)
        path, measure = self._choose(nbytes, tensor.dtype)
        if path == "gloo" and op == _SUM:   # a run may follow, after a sampled call too
            self._run_nbytes, self._run_dtype = nbytes, tensor.dtype
            self._run_left, first, self._sample_period = self._life.paths.run_length(nbytes, path)
            self._run_length, self._to_sample = self._run_left, first or -1   # -1: none in this run
            if not measure:   # gloo's own Work
                work = self._gloo_sum(tensors, opts)
                self._last_work["gloo"] = weakref.ref(work)
                return work
        return self._start(path, tensor, opts, measure)

    def _tiny(self, tensor: torch.Tensor, average: bool) -> dist.Work:
        """A tiny call of a job on one host (``TINY_BYTES``): on the host-local reduce, on the
        caller's thread when nothing is queued, with no chooser, timing or agreement: the same
        on every rank (its size decides), and the same bits as every path. A float32 or int32
        one runs in C++ (``inagg.hostlib.worker.host_tiny``) and returns a Work already done."""
        self.allreduces["inagg"] += 1
        self._carry("inagg", 1, tensor.nbytes)
        if tensor.dtype in _NATIVE_TINY_DTYPES:
            try:
                if self._life.comm.tiny(tensor.detach().numpy(), average):
                    return _DoneWork(tensor)
            except Exception as e:  # noqa: BLE001 - raised by the Work's wait, as a queued call's error
                return failed_work(e, tensor, self._group)
        work = self._run("inagg", tensor, average)
        self._last_work["inagg"] = weakref.ref(work)
        return work

    def _choose(self, nbytes: int, dtype: torch.dtype) -> tuple[str, bool]:
        """The path the chooser picks for an eligible call of ``nbytes`` (counted, its bytes
        carried on the path's route), and whether to time it; the chooser's error names the
        rank gone that caused it."""
        paths = self._life.chooser()
        try:
            path, measure = paths.choose(nbytes)   # may agree with the other ranks (the store)
        except Exception as e:  # noqa: BLE001 - re-raised, naming the rank gone that caused it
            raise self._group.named(e)
        self.allreduces[path] += 1
        self._carry(self._route(path, dtype), 1, nbytes)
        return path, measure

    def reduce_scatter(self, output: torch.Tensor, input_: torch.Tensor,
                       opts: dist.AllreduceOptions) -> tuple[torch.Tensor | None, dist.Work]:
        """One reduce-scatter of ``input_`` (eligible: ``_ineligible``) into ``output``, this
        rank's shard, on the path the chooser picks for an allreduce of ``input_``. On a path
        with a communicator (``reduce_scatter_async``: the host-local reduce, the switch's and
        the host lane's, which get only their shard's values from the aggregator) and contiguous
        tensors, the shard goes into ``output`` and ``input_`` is only read: returns (None, its
        Work). Else (gloo, a CUDA or non-contiguous tensor) a copy of ``input_`` is allreduced: returns
        (the copy, its Work), and the caller keeps the copy's shard once the Work is done."""
        previous = self._end_run()   # the chooser is asked: every rank's call numbers stay aligned  # noqa: F841
        path, measure = self._choose(input_.nbytes, input_.dtype)
        comm = None if path == "gloo" else self._life.comm if path == "inagg" else self._life.lane
        if not (hasattr(comm, "reduce_scatter_async") and input_.is_cpu and input_.is_contiguous()
                and output.is_contiguous()):
            full = input_.clone(memory_format=torch.contiguous_format)
            return full, self._start(path, full, opts, measure)
        idle, started = self._idle(path), time.perf_counter()
        op = ReduceOp.AVG if opts.reduceOp == _AVG else ReduceOp.SUM
        fut = comm.reduce_scatter_async(input_, output, op, inline_if_idle=input_.nbytes < _INLINE_BELOW_BYTES)
        work = _CallWork(fut, lambda: _resolve_to(fut, [output], self._group.named), self._group)
        self._last_work[path] = weakref.ref(work)
        return None, self._timed(path, work, input_.nbytes, started) if measure and idle else work

    def _end_run(self) -> dist.Work | None:
        """Count the current run's calls (``PathChooser.skip``) and end it: before the chooser
        is asked again, so every rank's call numbers stay the same. Its latest Work is held
        weakly from now on, as every other call's (``_start``'s idle), and returned: the caller
        lets go of it once its own call is submitted."""
        taken, latest = self.run_taken(), self._run_work
        if taken:
            self._life.paths.skip(taken)
            self.allreduces["gloo"] += taken
            self._carry(self._route("gloo", self._run_dtype), taken, taken * self._run_nbytes)
            self._last_work["gloo"] = weakref.ref(latest)
        self._run_length = self._run_left = 0
        self._run_work = None
        return latest

    def run_taken(self) -> int:
        """Calls the fast path took in the current run."""
        return self._run_length - self._run_left

    def _route(self, path: str, dtype: torch.dtype) -> str:
        """The route of an eligible call of ``dtype`` on ``path``: the path, or on the gloo path
        ``gloo:fixed`` where gloo sums inagg's fixed point (floats, same bits on every path)."""
        if path == "gloo" and self._life.fixed is not None and dtype.is_floating_point:
            return "gloo:fixed"
        return path

    def _carry(self, route: str, calls: int, nbytes: int) -> None:
        """Count ``calls`` allreduces of ``nbytes`` bytes in all on ``route``."""
        self._calls[route] += calls
        self._bytes[route] += nbytes

    def volume(self) -> dict[str, tuple[int, int]]:
        """Every allreduce so far by route (``gloo``: also those inagg cannot take): its calls
        and its tensors' bytes (one rank's), the current fast-path run's calls included."""
        calls, nbytes = self._calls.copy(), self._bytes.copy()
        if taken := self.run_taken():
            route = self._route("gloo", self._run_dtype)
            calls[route] += taken
            nbytes[route] += taken * self._run_nbytes
        return {route: (calls[route], nbytes[route]) for route in calls}

    def forget_run(self) -> None:
        """Let go of the run's latest Work (the inner gloo group is going: nothing may hold it)."""
        self._run_work = None

    def _start(self, path: str, tensor: torch.Tensor, opts: dist.AllreduceOptions, measure: bool) -> dist.Work:
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
        self._life.paths.observe(path, nbytes, now - began, began)

    def _run(self, path: str, tensor: torch.Tensor, average: bool) -> dist.Work:
        """Start one allreduce on ``path``; its future resolves to ``[tensor]`` (as gloo's).
        A small call on a communicator with nothing queued runs here, on the caller's thread:
        no hand-over to the communicator's I/O thread and back. A larger one is queued (DDP
        overlaps its bucket allreduces with the backward pass), and the caller waits on the
        communicator's future itself: only a caller that takes the Work's future gets one
        delivered on a thread of its own (``_resolve_to``)."""
        group = self._group
        if path != "gloo":
            comm = self._life.comm if path == "inagg" else self._life.lane
            fut = comm.allreduce_async(tensor, ReduceOp.AVG if average else ReduceOp.SUM,
                                       inline_if_idle=tensor.nbytes < _INLINE_BELOW_BYTES)
            return _CallWork(fut, lambda: _resolve_to(fut, [tensor], group.named), group)
        if self._life.fixed is not None and tensor.is_floating_point():
            return self._fixed_call(tensor, group.size() if average else 1)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.SUM    # gloo has no AVG: sum, then divide

        def result(f: torch.futures.Future) -> list[torch.Tensor]:
            """``[tensor]`` once gloo's sum is in it (divided for AVG), else gloo's error, named."""
            try:
                f.value()
            except Exception as e:  # noqa: BLE001 - gloo's error, into the returned future, naming the rank gone
                raise group.named(e)
            if average:
                tensor.div_(group.size())
            return [tensor]

        fut = self._gloo.backend.allreduce([tensor], opts).get_future().then(result)
        return _CallWork(fut, lambda: fut, group)

    def _gloo_sum(self, tensors: list[torch.Tensor], opts: dist.AllreduceOptions) -> dist.Work:
        """An eligible SUM on the gloo path: gloo's own, or for a float tensor with reproducible
        results the fixed-point one (``inagg.hostlib.pytorch.reproducible``)."""
        if self._life.fixed is not None and tensors[0].is_floating_point():
            return self._fixed_call(tensors[0], 1)
        return _GlooWork(self._gloo.backend.allreduce(tensors, opts), self._group)

    def _fixed_call(self, tensor: torch.Tensor, divisor: int) -> dist.Work:
        """A float call on the gloo path in inagg's fixed point; a small one with nothing queued
        runs on the caller's thread (as ``_run``'s), and a future is delivered as ``_run``'s. It
        carries this rank's news of a newer grant (``_ticket``)."""
        fut = self._life.fixed.allreduce(tensor, divisor, inline_if_idle=tensor.nbytes < _INLINE_BELOW_BYTES,
                                         ticket=self._ticket())
        return _CallWork(fut, lambda: _resolve_to(fut, [tensor], self._group.named), self._group)

    def _ticket(self) -> Ticket | None:
        """This gloo call's ticket where this rank has seen a grant newer than the one agreed
        (``inagg.hostlib.pytorch.path.news``), numbered as the chooser's call it is (a run's
        calls counted); a run it is in ends with it, so the next calls ask the chooser, which
        hears the news at the same call on every rank."""
        paths = self._life.paths
        news = paths.news if paths is not None else None
        if news is None:
            return None
        ticket = news.ticket(paths.calls + self.run_taken())
        if ticket is not None and self._run_left:
            self._run_length, self._run_left = self._run_length - self._run_left, 0
        return ticket

    def calibrate(self) -> None:
        """Time every path at a few sizes, round by round as ``CalibrationPlan`` says (the same
        calls on every rank; each call predicted cheap whatever the links; a lower ladder where
        the job runs on one host and joined no controller), the ranks agreeing after each
        round, so the first real calls are already chosen from measurements."""
        paths = self._life.paths
        plan = CalibrationPlan(paths, LADDER if self._life.endpoint is not None else _ONE_HOST_LADDER,
                               _CALIBRATION_ROUNDS)
        last = paths.paths[-1]
        while sizes := plan.next_round():
            # one path's calls after another's, each path's first untimed: a call right after
            # another path's is slow (that path's tail still holds the CPU), and a group's first
            # calls set up connections and buffers
            for path, nbytes in sizes.items():
                for timed in (False,) + (True,) * _CALIBRATION_ROUNDS:
                    self._start(path, torch.zeros(nbytes // 4, dtype=torch.float32), dist.AllreduceOptions(),
                                measure=timed).wait()
                last = path
            paths.agree()
            plan.ran(sizes)
        paths.stats.calibration = plan.record()
        paths.ran_last(last)   # a first size's probes start there, with no warm-up

    def history(self) -> list[dict]:
        """The recent eligible allreduces' paths, runs of calls in order
        (``PathChooser.history``; the current fast-path run's calls included)."""
        runs, taken = self._life.paths.history(), self.run_taken()
        if runs and taken:
            runs[-1]["calls"] += taken
        return runs
