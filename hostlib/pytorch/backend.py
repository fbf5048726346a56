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
  the error's type and text, as a gloo Work's future's (``works._resolve_to``).
* Every path gives the same bits (unless ``INAGG_REPRODUCIBLE=0``): the communicators share one
  exponent block and ride limit, and the gloo path sums inagg's fixed point, not floats
  (``inagg.hostlib.pytorch.reproducible``), so a run does not depend on the paths its calls took.
* Everything else (other collectives, dtypes, ops, several tensors) goes to an inner
  ``ProcessGroupGloo`` on the same store, unchanged. Each kind is counted (``stats()``) and
  logged once per reason on rank 0 (``inagg.hostlib.pytorch.inner_gloo``).
* What carried the calls is said in words (``inagg.hostlib.pytorch.carriers``): rank 0's one
  line once the paths are up, and ``stats()['carriers']``, calls and bytes per carrier.

So DDP (its broadcasts, allgathers and bucket allreduces), ``dist.all_reduce`` of metrics and

The group is up once its ranks have met, in one round of the store
(``inagg.hostlib.pytorch.roll_call``); its gloo groups are made at their first call. The inagg
paths (rank 0's local deployment, the joins at the controller) start in the background and the
first call that needs them waits for them (``InaggProcessGroup.ready``). Every rank watches the others (``inagg.hostlib.pytorch.peer_watch``):
a rank that ends fails every call of the others at once, on every path, with an error naming
it (a rank that stops without ending: once its lease at the peer watch runs out), and a start
still under way gives up at its next wait instead of waiting for that rank. Every wait ends by
the process group's timeout at the latest. A Ctrl-C is a plain ``KeyboardInterrupt`` (``inagg.hostlib.pytorch.interrupts``), and a group left
open at exit leaves its job and stops its deployment while the interpreter can still run.

This module is the thin front torch sees (the c10d names, the collectives' entry points, the
stats); the work is its parts': start and stop (``lifecycle``), the allreduce dispatch
(``dispatch``), reduce-scatter (``reduce_scatter``), the inner gloo group (``inner_gloo``) and the
Works they return (``works``). Every method torch calls here, and on those Works, runs outside
``torch.compile``'s Dynamo (``outside_dynamo``): torch calls them from C++ inside compiled code too.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from inagg.hostlib import BACKEND_NAME
from inagg.hostlib.pytorch.carriers import by_carrier, route_names
from inagg.hostlib.pytorch.dispatch import AllreduceDispatch
from inagg.hostlib.pytorch.lifecycle import GroupLifecycle
from inagg.hostlib.pytorch.outside_dynamo import mark_if_dynamo_loaded, torch_calls
from inagg.hostlib.pytorch.reduce_scatter import ReduceScatter
from inagg.hostlib.worker.host_group import RankDied
from inagg.hostlib.worker.launch_identity import claim_store, launch_id

LAUNCH_PREFIX = "inagg"   # the launch's claim of the store (worker/launch_identity.py): inagg/inagg/launch

# Collectives inagg does not implement, by the names torch's c10d calls on a process group: the
# inner gloo group runs them as they are (``inagg.hostlib.pytorch.inner_gloo``)
GLOO_COLLECTIVES = (
    "broadcast", "allgather", "_allgather_base", "all_gather_single", "allgather_coalesced",
    "allgather_into_tensor_coalesced", "all_gather_single_coalesced", "allreduce_coalesced", "reduce",
    "reduce_scatter", "gather", "scatter", "alltoall", "alltoall_base", "all_to_all_single", "barrier",
    "send", "recv", "recv_anysource",
)
# the other methods torch calls on a process group (kept out of Dynamo: ``outside_dynamo``)
TORCH_CALLS = GLOO_COLLECTIVES + (
    "getBackendName", "setGroupName", "getGroupName", "setGroupDesc", "getGroupDesc", "allreduce",
    "reduce_scatter_single", "_reduce_scatter_base", "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor_coalesced", "monitored_barrier", "shutdown",
)
_NOT_A_REDUCTION = "inagg runs allreduce and reduce-scatter only"


class InaggProcessGroup(dist.ProcessGroup):
    """One rank's ``inagg`` process group (module docstring): ``lifecycle`` starts and stops its
    paths, ``dispatch`` runs its allreduces, ``reduce_scatters`` its reduce-scatters and ``gloo`` (the
    inner gloo group) everything else."""

    def __init__(self, store: dist.Store, rank: int, world_size: int, timeout: timedelta) -> None:
        """Up once the ranks have met (a collective: ``GroupLifecycle``); the paths start in the
        background."""
        super().__init__(rank, world_size)
        mark_if_dynamo_loaded()
        # the launch claims the store before anything uses it: a rank of another launch given
        # the same store is refused here, before its gloo groups or jobs could meet this one's
        claim_store(dist.PrefixStore(LAUNCH_PREFIX, store), rank, launch_id())
        self._group_name = self._group_desc = ""
        self.lifecycle = GroupLifecycle(self, store, timeout)
        self.gloo = self.lifecycle.gloo
        self.dispatch = AllreduceDispatch(self, self.lifecycle)
        self.reduce_scatters = ReduceScatter(self.dispatch.reduce_scatter, self.gloo, rank, world_size)
        self.lifecycle.start(self.dispatch)

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        """``inagg``: what ``dist.get_backend`` says of this group."""
        return BACKEND_NAME

    # torch keeps a group's name and description on its backends; this group has none registered
    # (every collective is its own), so it keeps them itself: DeviceMesh (FSDP2) names groups
    def setGroupName(self, name: str) -> None:  # noqa: N802 - torch's name
        """Keep the name torch gives this group."""
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802 - torch's name
        """The name torch gave this group."""
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802 - torch's name
        """Keep the description torch gives this group."""
        self._group_desc = desc

    def getGroupDesc(self) -> str:  # noqa: N802 - torch's name
        """The description torch gave this group."""
        return self._group_desc

    def allreduce(self, tensors: list[torch.Tensor], opts: dist.AllreduceOptions | None = None) -> dist.Work:
        """Allreduce ``tensors`` on the path the chooser picks (``AllreduceDispatch.allreduce``)."""
        return self.dispatch.allreduce(tensors, opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002 - torch's name
                              opts: dist.ReduceScatterOptions | None = None) -> dist.Work:
        """``dist.reduce_scatter_tensor`` (``ReduceScatter.run``)."""
        return self.reduce_scatters.run("reduce_scatter_single", [output], [input], opts, coalesced=False)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor,  # noqa: A002 - torch's name
                             opts: dist.ReduceScatterOptions | None = None) -> dist.Work:
        """The older name of ``reduce_scatter_single`` (``ReduceScatter.run``)."""
        return self.reduce_scatters.run("_reduce_scatter_base", [output], [input], opts, coalesced=False)

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: dist.ReduceScatterOptions | None = None) -> dist.Work:
        """Reduce-scatters gathered by ``dist._coalescing_manager`` (``ReduceScatter.run``)."""
        return self.reduce_scatters.run("reduce_scatter_single_coalesced", outputs, inputs, opts, coalesced=True)

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: dist.ReduceScatterOptions | None = None) -> dist.Work:
        """The C++ name of ``reduce_scatter_single_coalesced`` (``ReduceScatter.run``)."""
        return self.reduce_scatters.run("reduce_scatter_tensor_coalesced", outputs, inputs, opts, coalesced=True)

    def monitored_barrier(self, timeout: timedelta | None = None, wait_all_ranks: bool = False) -> None:
        """gloo's monitored barrier on the inner group: rank 0 names the ranks that did not
        arrive within ``timeout`` (the group's, if None). ``dist.monitored_barrier`` refuses
        every backend not named gloo before it gets here; ``monitored_barrier`` (this module)
        is the same call for any group."""
        self.gloo.run("monitored_barrier", _NOT_A_REDUCTION,
                      timeout if timeout is not None else self.lifecycle.timeout, wait_all_ranks=wait_all_ranks)

    def stats(self) -> dict:
        """Where the allreduces went, by what carried them (``carriers``: calls and one rank's
        bytes per carrier, ``inagg.hostlib.pytorch.carriers``), calls by path, gloo fallbacks by
        kind, the agreed path model and the communicator's counters (mode, bytes,
        retransmissions, ...); once the paths are ready. ``controller`` and ``address`` are None
        for a job on one host, which joins no controller."""
        self.ready()
        life = self.lifecycle
        endpoint = life.endpoint
        return {"controller": endpoint.controller if endpoint else None, "address": endpoint.bind_ip if endpoint else None,
                "carriers": by_carrier(self.dispatch.volume(), route_names(life)),
                "allreduce_paths": dict(self.dispatch.allreduces + Counter(gloo=self.dispatch.run_taken())),
                "fallbacks": dict(self.gloo.fallbacks), "via_allreduce": dict(self.reduce_scatters.via_allreduce),
                "path_model": life.paths.as_dict(), "inagg": life.comm.stats(),
                "host_lane": life.lane.stats() if life.lane is not None else None}

    def path_history(self) -> list[dict]:
        """The recent eligible allreduces' paths, runs of calls in order
        (``AllreduceDispatch.history``): what the backend chose over time."""
        self.ready()
        return self.dispatch.history()

    def ready(self) -> None:
        """Wait for the inagg paths (``GroupLifecycle.ready``); every eligible allreduce asks first."""
        self.lifecycle.ready()

    def failure(self) -> RankDied | None:
        """The rank gone that failed this group, if one has (``GroupLifecycle.failure``)."""
        return self.lifecycle.failure()

    def named(self, error: BaseException) -> BaseException:
        """``error``, or one naming the rank whose end caused it (``GroupLifecycle.named``)."""
        return self.lifecycle.named(error)

    def shutdown(self) -> None:
        """Leave the inagg job and let the paths go (``GroupLifecycle.shutdown``). Called by
        ``dist.destroy_process_group``; idempotent."""
        self.lifecycle.shutdown()


def _gloo_collective(name: str) -> Callable[..., dist.Work]:
    """The method that hands collective ``name`` to the inner gloo group (counted)."""
    def forward(self: InaggProcessGroup, *args: Any, **kwargs: Any) -> dist.Work:
        """Run ``name`` on the inner gloo group (``InnerGloo.run``)."""
        return self.gloo.run(name, _NOT_A_REDUCTION, *args, **kwargs)

    forward.__name__ = forward.__qualname__ = name
    forward.__doc__ = f"``{name}`` through the inner gloo group (counted)."
    return forward


for _name in GLOO_COLLECTIVES:
    setattr(InaggProcessGroup, _name, _gloo_collective(_name))
torch_calls(*TORCH_CALLS)(InaggProcessGroup)


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
