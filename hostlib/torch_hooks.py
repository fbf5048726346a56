"""DDP communication hooks that aggregate gradients through inagg.

Modelled on PyTorch's PowerSGD hook: a state object plus a hook function, registered with
``ddp.register_comm_hook(state, hook)``; torch itself is not patched.

* ``inagg_hook``: every bucket is averaged by an inagg allreduce (asynchronously: DDP keeps
  computing gradients of the next buckets while earlier ones are on the wire).
* ``artopk_hook``: AR-Topk with error feedback over all buckets at once (one fused top-k of the
  whole gradient, as in the paper). Buckets are collected until DDP hands over the last one of
  the iteration; then one AR-Topk step runs and every bucket's future completes. While DDP
  rebuilds its buckets (the first iterations) it runs plain inagg allreduce, so the residual's
  layout never changes under it.

Registering inagg as a ``torch.distributed`` backend (``Backend.register_backend``) needs a
C++-level ProcessGroup or a Python ProcessGroup subclass implementing every collective with
Work objects; the comm hook gives DDP the same aggregation with a small, stable API, so inagg
does not register a backend (see docs/training.md).
"""


from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from .artopk import ARTopk, CompressionSchedule, broadcast_int32
from .communicator import Communicator, ReduceOp
from .cost_model import CollectiveChooser


@dataclass
class InaggHookState:
    comm: Communicator


def inagg_hook(state: InaggHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket over all ranks through inagg."""
    return state.comm.allreduce_async(bucket.buffer(), ReduceOp.AVG)


@dataclass
class ARTopkHookState:
    """State of ``artopk_hook``: the communicator, AR-Topk's settings and its residual."""

    comm: Communicator
    cr: float | CompressionSchedule = 0.01
    selection: str = "star"
    dense_iterations: int = 2          # DDP rebuilds buckets after the first iteration
    adaptive: bool = False             # choose dense or AR-Topk per iteration by the cost model
    iteration: int = 0
    artopk: ARTopk | None = None
    chooser: CollectiveChooser | None = None
    last_choice: str = ""
    _buckets: dict[int, tuple[torch.Tensor, torch.futures.Future]] = field(default_factory=dict)
    _layout: tuple[tuple[int, int], ...] | None = None  # (bucket index, numel), in index order


def artopk_hook(state: ARTopkHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    if state.iteration < state.dense_iterations:
        fut = state.comm.allreduce_async(bucket.buffer(), ReduceOp.AVG)
        if bucket.is_last():
            state.iteration += 1
        return fut
    fut = torch.futures.Future()
    state._buckets[bucket.index()] = (bucket.buffer(), fut)
    if not bucket.is_last():
        return fut
    buckets = sorted(state._buckets.items())
    layout = tuple((i, b.numel()) for i, (b, _) in buckets)
    if state._layout is None:
        state._layout = layout
        comm = state.comm
        state.artopk = ARTopk(comm.rank, comm.world_size, lambda x: comm.allreduce(x),
                              selection=state.selection, cr=state.cr)
    elif layout != state._layout:
        raise RuntimeError(f"DDP bucket layout changed after warm-up: {state._layout} -> {layout}")
    flat = np.concatenate([b.detach().view(-1).numpy() for _, (b, _) in buckets])
    try:
        update = state.artopk.step(flat, cr=1.0 if _choose_dense(state, flat.size) else None)
    except Exception as e:  # noqa: BLE001 - every bucket's future carries the error
        for _, (_, f) in buckets:
            f.set_exception(e)
        state._buckets.clear()
        return fut
    offset = 0
    for _, (b, f) in buckets:
        n = b.numel()
        b.view(-1).copy_(torch.from_numpy(update[offset: offset + n]))
        offset += n
        f.set_result(b)
    state._buckets.clear()
    state.iteration += 1
    return fut


def _choose_dense(state: ARTopkHookState, numel: int) -> bool:
    """With ``adaptive``: rank 0 asks the cost model (alpha/beta measured by its communicator)
    whether dense or AR-Topk is cheaper on the job's current path, and broadcasts the answer
    so every rank runs the same collective."""
    if not state.adaptive:
        return False
    comm = state.comm
    path = "ina" if comm.grant.mode == "switch" else "host"
    if state.chooser is None:
        state.chooser = CollectiveChooser(comm.link, comm.world_size, selection=state.selection,
                                          options=(f"dense_{path}", f"artopk_{path}"))
    cr = state.cr if isinstance(state.cr, float) else (state.cr.cr or state.cr.target)
    choice = np.array([0], np.int32)
    if comm.rank == 0:
        choice[0] = state.chooser.options.index(state.chooser.choose(4.0 * numel, cr))
    choice = broadcast_int32(choice, 1, 0, comm.rank, lambda x: comm.allreduce(x))
    state.last_choice = state.chooser.options[int(choice[0])]
    return state.last_choice.startswith("dense")
