"""What a communicator takes (``inagg.hostlib.worker.communicator`` for a job at a controller,
``inagg.hostlib.worker.host_communicator`` for a host's ranks): its reduce ops, the refusal of a
tensor it cannot allreduce, and the numpy view of one it can. A module of its own, light, so that
a job whose ranks all share one host (the host-local reduce alone) never imports the switch's
communicator, its streams and transports: the ``inagg`` backend's start-up pays only for what
the job uses."""

from __future__ import annotations

import enum

import numpy as np

from inagg.hostlib.wire import codec
from inagg.hostlib.worker.call_protocol import OP_NAMES, CallError, Refusal, Shard, dtype_refusal, rank_shard


class ReduceOp(enum.Enum):
    SUM = "sum"
    AVG = "avg"


def reduce_kind(op) -> tuple[bool, Refusal | None]:
    """(average, refusal) for this library's ``ReduceOp`` or a ``torch.distributed.ReduceOp``:
    SUM and AVG are honoured; every other op is refused (on every rank, in the control round)."""
    if isinstance(op, ReduceOp):
        return op is ReduceOp.AVG, None
    import torch.distributed as dist

    for name in dist.ReduceOp.RedOpType.__members__:
        try:
            same = op == getattr(dist.ReduceOp, name)
        except TypeError:
            same = False
        if same:
            if name in ("SUM", "AVG"):
                return name == "AVG", None
            return False, Refusal(CallError.REDUCE_OP, OP_NAMES.index(name) if name in OP_NAMES else 0)
    return False, Refusal(CallError.REDUCE_OP)


def as_array(tensor) -> tuple[np.ndarray | None, Refusal | None]:
    """(flat host array, refusal) for a CPU torch tensor or a numpy array; a tensor this library
    cannot allreduce gives its refusal (a CUDA one it can is staged: ``Communicator._request``)."""

    if isinstance(tensor, np.ndarray):
        array = tensor.reshape(-1)
        if not np.shares_memory(array, tensor):
            return None, Refusal(CallError.LAYOUT)
        return array, None
    refusal = tensor_refusal(tensor)
    return (None, refusal) if refusal else (numpy_view(tensor), None)


def refuse_cuda_scatter(tensor, output) -> None:
    """A ValueError when a reduce-scatter's ``tensor`` or ``output`` is a CUDA tensor: only an
    allreduce stages CUDA tensors."""
    if any(getattr(t, "is_cuda", False) for t in (tensor, output)):
        raise ValueError("reduce_scatter_async takes CPU tensors or arrays; got a CUDA tensor: allreduce it "
                         "(allreduce_async stages CUDA tensors) and keep this rank's shard")


def output_shard(array: np.ndarray, output, rank: int, world_size: int) -> Shard:
    """Rank ``rank``'s ``Shard`` of ``array`` into ``output`` (a CPU tensor or an array); a
    ValueError naming the problem when ``output`` is not one rank's share of ``array``."""
    out, bad = as_array(output)
    if bad is not None:
        raise ValueError(f"a reduce-scatter's output must be a contiguous CPU tensor or array; got "
                         f"{bad.describe()}")
    return rank_shard(array, out, rank, world_size)


def tensor_refusal(tensor) -> Refusal | None:
    """Why this library cannot allreduce ``tensor`` (a CPU or CUDA torch tensor), else None."""
    import torch

    if not isinstance(tensor, torch.Tensor):
        return Refusal(CallError.NOT_A_TENSOR)
    if tensor.dtype not in (torch.float32, torch.int32, torch.float16, torch.bfloat16):
        return dtype_refusal(str(tensor.dtype).removeprefix("torch."))
    if not tensor.is_contiguous():
        return Refusal(CallError.LAYOUT)
    return None


def numpy_view(tensor) -> np.ndarray:
    """The flat numpy array over a contiguous CPU tensor's memory; a bfloat16 tensor's as
    ``codec.BFLOAT16`` (numpy has no bfloat16)."""
    import torch

    flat = tensor.detach().view(-1)
    if flat.dtype == torch.bfloat16:
        return flat.view(torch.int16).numpy().view(codec.BFLOAT16)
    return flat.numpy()
