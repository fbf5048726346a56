"""Reduce-scatter of an ``inagg`` process group (``inagg.hostlib.pytorch.backend``): FSDP's
collective, on inagg's paths.

Design: each input goes on the path the allreduce dispatch chooses for it
(``AllreduceDispatch.reduce_scatter``). Every communicator delivers only the rank's shard into
its output, the input only read: the host-local reduce moves S/N of the result out of shared
memory instead of S, and the switch and the host aggregator send each block's values only to the
rank whose shard holds it (``Communicator.reduce_scatter_async``: ~S/N down per rank instead of
S), or with several ranks per host to the leader of the host whose ranks' shards hold it
(``inagg.hostlib.worker.host_reduce``, "Between hosts"). The gloo path allreduces a copy of the
input (the input stays as it was), and the rank's shard of the sum is copied to its output once
every call is done (``_ShardWork``). A CUDA input takes that way on every path: its copy's
allreduce is staged through pinned host memory (``inagg.hostlib.worker.cuda_staging``), so its
ranks receive the whole sum, not their shard. Where an allreduce of the input could not use inagg
(``_unshardable``), the inner gloo group's reduce-scatter runs instead.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

import torch
import torch.distributed as dist

from inagg.hostlib.pytorch.dispatch import _ineligible
from inagg.hostlib.pytorch.inner_gloo import InnerGloo
from inagg.hostlib.pytorch.works import _ShardWork


class ReduceScatter:
    """One rank's reduce-scatters (module docstring) over ``scatter`` (the dispatch's
    ``reduce_scatter``) and ``gloo`` (for what inagg cannot shard); ``via_allreduce`` counts them
    by collective."""

    def __init__(self, scatter: Callable[[torch.Tensor, torch.Tensor, dist.AllreduceOptions],
                                         tuple[torch.Tensor | None, dist.Work]],
                 gloo: InnerGloo, rank: int, world_size: int) -> None:
        """Nothing run yet."""
        self._scatter, self._gloo, self._rank, self._size = scatter, gloo, rank, world_size
        self.via_allreduce: Counter[str] = Counter()   # collective -> calls run as allreduces

    def run(self, collective: str, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
            opts: dist.ReduceScatterOptions | None, coalesced: bool) -> dist.Work:
        """``collective`` (torch's name of this reduce-scatter, counted under it) of ``inputs``
        into ``outputs``: one call on inagg's paths per input, else the inner gloo group's, given
        the one pair or the lists (``coalesced``) as torch gave them."""
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        reason = self._unshardable(outputs, inputs, opts.reduceOp)
        if reason:
            args = (outputs, inputs) if coalesced else (outputs[0], inputs[0])
            return self._gloo.run(collective, reason, *args, opts)
        self.via_allreduce[collective] += 1
        allreduce_opts = dist.AllreduceOptions()
        allreduce_opts.reduceOp = opts.reduceOp
        calls = [(output, *self._scatter(output, input_, allreduce_opts)) for output, input_ in zip(outputs, inputs)]
        return _ShardWork(calls, self._rank)

    def _unshardable(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], op: dist.ReduceOp) -> str:
        """Why these reduce-scatters cannot run as allreduces on inagg's paths ('' if they can)."""
        if len(outputs) != len(inputs) or not inputs:
            return f"{len(outputs)} outputs for {len(inputs)} inputs"
        for output, input_ in zip(outputs, inputs):
            reason = _ineligible([input_], op)
            if reason:
                return reason
            if output.dtype != input_.dtype or output.device != input_.device:
                return "output not a tensor of the input's dtype on its device"
            if input_.numel() != output.numel() * self._size:
                return "input not the ranks' outputs end to end"
        return ""
