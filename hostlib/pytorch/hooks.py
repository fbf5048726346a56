"""DDP communication hooks that aggregate gradients through inagg.

Modelled on PyTorch's PowerSGD hook: a state object plus a hook function, registered with
``ddp.register_comm_hook(state, hook)``; torch itself is not patched. A state takes either the
``inagg`` process group (``process_group=``; None: the default group, which must be inagg) or a
``Communicator`` (``comm=``, for jobs that do not use the backend).

* ``inagg_hook``: every bucket is averaged by one allreduce, asynchronously (DDP keeps computing
  gradients of the next buckets while earlier ones are on the wire). Through the process group,
  each bucket takes the path the backend chooses (the switch, the host aggregator or gloo).
* ``artopk_hook``: AR-Topk with error feedback over all buckets at once (one fused top-k of the
  whole gradient, as in the paper). Buckets are collected until DDP hands over the last one of
  the iteration; then one AR-Topk step runs and every bucket's future completes. While DDP
  rebuilds its buckets (the first iterations) it runs plain dense allreduce, so the residual's
  layout never changes under it. Its state checkpoints (``torch.save(state)``): settings,
  iteration and residual, as PowerSGD's state does; the process group is not saved.

A hook's failure is raised as an ``InaggHookError`` naming the hook, job, rank and the original
error. torch.futures carry errors across callbacks (and into DDP's C++ reducer) as text, so the
caller sees ``RuntimeError: ... InaggHookError: artopk_hook (job 1 rank 0): ValueError: ...``.
"""


import logging
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from inagg.hostlib.worker.artopk import ARTopk, CompressionSchedule, broadcast_int32
from inagg.hostlib.worker.communicator import Communicator, ReduceOp
from inagg.hostlib.worker.cost_model import CollectiveChooser, CostModel
from inagg.hostlib.errors import InaggHookError

log = logging.getLogger("inagg.hooks")


def _inagg_group(process_group: dist.ProcessGroup | None):
    """The inagg process group a hook state was given (None: the default group), its paths
    ready (``InaggProcessGroup.ready``)."""
    from inagg.hostlib.pytorch.backend import InaggProcessGroup

    group = process_group if process_group is not None else dist.group.WORLD
    if group is None:
        raise InaggHookError("no process group: call init_process_group('inagg') first, or give "
                             "the hook state a Communicator")
    if not isinstance(group, InaggProcessGroup):
        raise InaggHookError(f"inagg hooks need the 'inagg' process group or a Communicator, "
                             f"got a {type(group).__name__}")
    group.ready()
    return group


class _Bound:
    """What a hook state aggregates through: the communicator it was given, else the inagg
    process group's allreduce (which chooses each call's path)."""

    comm: Communicator | None
    process_group: dist.ProcessGroup | None

    def communicator(self) -> Communicator:
        return self.comm if self.comm is not None else _inagg_group(self.process_group).lifecycle.comm

    def allreduce_async(self, tensor: torch.Tensor, average: bool) -> torch.futures.Future:
        """Average (or sum) ``tensor`` in place; the future resolves to it."""
        if self.comm is not None:
            return self.comm.allreduce_async(tensor, ReduceOp.AVG if average else ReduceOp.SUM)
        work = dist.all_reduce(tensor, op=dist.ReduceOp.AVG if average else dist.ReduceOp.SUM,
                               group=_inagg_group(self.process_group), async_op=True)
        return work.get_future().then(lambda f: f.value()[0])

    def allreduce_numpy(self, x: np.ndarray) -> np.ndarray:
        """Blocking sum-allreduce of a contiguous numpy array, in place (AR-Topk's primitive)."""
        return self.allreduce_async(torch.from_numpy(x), average=False).wait().numpy()


def _failing_as(hook: str, bound: _Bound, fut: torch.futures.Future) -> torch.futures.Future:
    """``fut``, whose failure becomes an InaggHookError that DDP's reducer reports as such."""

    def check(f: torch.futures.Future):
        try:
            value = f.value()
        except Exception as e:  # noqa: BLE001 - re-raised as the library's type
            error = e
        else:
            if not isinstance(value, BaseException):
                return value
            error = value
        try:
            comm = bound.communicator()
            where = f"job {comm.job_id} rank {comm.rank}"
        except InaggHookError:   # bound to nothing usable: that is the error to report
            where = "no inagg job"
        raise InaggHookError(f"{hook} ({where}): {type(error).__name__}: {error}") from error

    return fut.then(check)


@dataclass
class InaggHookState(_Bound):
    comm: Communicator | None = None
    process_group: dist.ProcessGroup | None = None


def inagg_hook(state: InaggHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket over all ranks through inagg."""
    return _failing_as("inagg_hook", state, state.allreduce_async(bucket.buffer(), average=True))


@dataclass
class ARTopkHookState(_Bound):
    """State of ``artopk_hook``: where to aggregate, AR-Topk's settings and its residual."""

    comm: Communicator | None = None
    cr: float | CompressionSchedule = 0.01
    selection: str = "star"
    dense_iterations: int = 2          # DDP rebuilds buckets after the first iteration
    adaptive: bool = False             # choose dense or AR-Topk per iteration by the cost model
    iteration: int = 0
    artopk: ARTopk | None = None
    chooser: CollectiveChooser | None = None
    last_choice: str = ""
    process_group: dist.ProcessGroup | None = None
    _buckets: dict[int, tuple[torch.Tensor, torch.futures.Future]] = field(default_factory=dict)
    _layout: tuple[tuple[int, int], ...] | None = None  # (bucket index, numel), in index order
    _restored: tuple[np.ndarray | None, int] | None = None  # (residual, steps) from a checkpoint

    _SAVED = ("cr", "selection", "dense_iterations", "adaptive", "iteration", "last_choice", "_layout")

    def __getstate__(self) -> dict:
        """Settings, progress and the residual; not the process group, communicator or the
        cost-model chooser (rebuilt from fresh measurements), nor a schedule's ``predict``."""
        state = {k: getattr(self, k) for k in self._SAVED}
        if isinstance(self.cr, CompressionSchedule):
            schedule = CompressionSchedule.__new__(CompressionSchedule)
            schedule.__dict__.update(self.cr.__dict__, predict=None)
            state["cr"] = schedule
        if self.artopk is not None:
            residual = None if self.artopk.residual is None else self.artopk.residual.copy()
            state["residual"], state["steps"] = residual, self.artopk.steps
        elif self._restored is not None:
            state["residual"], state["steps"] = self._restored
        return state

    def __setstate__(self, state: dict) -> None:
        self.__init__(**{k: state[k] for k in self._SAVED if not k.startswith("_")})
        self._layout = state["_layout"]
        if "residual" in state:
            self._restored = (state["residual"], state["steps"])
        if isinstance(self.cr, CompressionSchedule):
            log.warning("AR-Topk state loaded: assign state.cr.predict again (a schedule's cost "
                        "function is not saved)")
        log.info("AR-Topk state loaded at iteration %d; the process group is not saved: the "
                 "default group is used unless state.process_group is set", self.iteration)

    def _make_artopk(self) -> ARTopk:
        comm = self.communicator()
        return self.restore_into(ARTopk(comm.rank, comm.world_size, self.allreduce_numpy,
                                        selection=self.selection, cr=self.cr))

    def restore_into(self, artopk: ARTopk) -> ARTopk:
        """Give ``artopk`` the residual and step count of the checkpoint this state was loaded
        from, if any (once)."""
        if self._restored is not None:
            artopk.residual, artopk.steps = self._restored
            self._restored = None
        return artopk


def artopk_hook(state: ARTopkHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    if state.iteration < state.dense_iterations:
        fut = state.allreduce_async(bucket.buffer(), average=True)
        if bucket.is_last():
            state.iteration += 1
        return _failing_as("artopk_hook", state, fut)
    raw = torch.futures.Future()   # resolves to the bucket, or to the step's exception
    state._buckets[bucket.index()] = (bucket.buffer(), raw)
    fut = _failing_as("artopk_hook", state, raw)
    if bucket.is_last():
        _artopk_step(state)
    return fut


def _artopk_step(state: ARTopkHookState) -> None:
    """One AR-Topk step over the collected buckets; completes every bucket's future (with the
    step's exception if it failed: the state is then as before the step)."""
    buckets = sorted(state._buckets.items())
    state._buckets.clear()
    try:
        layout = tuple((i, b.numel()) for i, (b, _) in buckets)
        if state._layout is None:
            state._layout = layout
        elif layout != state._layout:
            raise ValueError(f"DDP bucket layout changed after warm-up: {state._layout} -> {layout}")
        if state.artopk is None:
            state.artopk = state._make_artopk()
        flat = np.concatenate([b.detach().view(-1).numpy() for _, (b, _) in buckets])
        update = state.artopk.step(flat, cr=1.0 if _choose_dense(state, flat.size) else None)
    except Exception as e:  # noqa: BLE001 - every bucket's future carries the error
        for _, (_, f) in buckets:
            f.set_result(e)
        return
    offset = 0
    for _, (b, f) in buckets:
        n = b.numel()
        b.view(-1).copy_(torch.from_numpy(update[offset: offset + n]))
        offset += n
        f.set_result(b)
    state.iteration += 1


def _choose_dense(state: ARTopkHookState, numel: int) -> bool:
    """With ``adaptive``: rank 0 asks the cost model (alpha/beta measured by its communicator)
    whether dense or AR-Topk is cheaper on the job's current path, and broadcasts the answer
    so every rank runs the same collective."""
    if not state.adaptive:
        return False
    cr = state.cr if isinstance(state.cr, float) else (state.cr.cr or state.cr.target)
    if state.comm is None:
        return _choose_dense_by_paths(state, _inagg_group(state.process_group), numel, cr)
    comm = state.communicator()
    path = "ina" if comm.grant.mode == "switch" else "host"
    if state.chooser is None:
        state.chooser = CollectiveChooser(comm.link, comm.world_size, selection=state.selection,
                                          options=(f"dense_{path}", f"artopk_{path}"))
    choice = np.array([0], np.int32)
    if comm.rank == 0:
        choice[0] = state.chooser.options.index(state.chooser.choose(4.0 * numel, cr))
    choice = broadcast_int32(choice, 1, 0, comm.rank, state.allreduce_numpy)
    state.last_choice = state.chooser.options[int(choice[0])]
    return state.last_choice.startswith("dense")


def _choose_dense_by_paths(state: ARTopkHookState, group, numel: int, cr: float) -> bool:
    """Through the inagg process group: dense or AR-Topk, each priced as the allreduces it makes
    (``CostModel.calls``), each allreduce on its faster path (inagg or gloo) at the group's
    agreed alpha and beta. Those figures are identical on every rank, so is the choice: no
    broadcast needed."""
    m = 4.0 * numel
    plan_calls = CostModel(0.0, 0.0, group.size(), selection=state.selection).calls
    seconds = {plan: sum(group.lifecycle.paths.fastest_seconds(b) for b, _ in plan_calls(plan, m, cr))
               for plan in ("dense", "artopk")}
    state.last_choice = min(seconds, key=seconds.__getitem__)
    return state.last_choice == "dense"
