"""A job's communicator for a rank whose host reduces locally first (``inagg.hostlib.worker.host_reduce``):
the ``Communicator``'s interface (``allreduce_async``, ``grant``, ``stats``, ``close``), with only
each host's leader a worker of the job at the controller (a job of one worker per host).

``open_host_group`` decides, once per process group, whether the ranks reduce on their host
first (``INAGG_HOST_REDUCE``: ``auto``, the default, when some host runs several ranks; ``off``:
every rank a worker of the job) and connects each host's ranks. One ``HostGroup`` serves every communicator of the process
group (the job's and its host lane's): their calls run on one thread, in submission order, so
every rank of a host runs them in the same order.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import queue
import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Callable

import numpy as np

from inagg.hostlib.errors import InaggSetupError
from inagg.hostlib.wire.grant import HOST_VALUES_PER_PACKET, Grant
from inagg.hostlib.worker.cuda_staging import CudaStaging
from inagg.hostlib.worker.host_group import (HostLayout, Link, Message, Stop, connect_star, discover_layout, listen,
                                             never)
from inagg.hostlib.worker.host_reduce import HostReduce
from inagg.hostlib.worker.host_tiny import TinyCalls
from inagg.hostlib.worker.call_protocol import check_array
from inagg.hostlib.worker.tensors import (
    ReduceOp, as_array, numpy_view, output_shard, reduce_kind, refuse_cuda_scatter, tensor_refusal,
)

if TYPE_CHECKING:   # a job on one host makes none: its module (streams, transports) is never imported
    from inagg.hostlib.worker.communicator import Communicator

log = logging.getLogger("inagg.host")

HOST_REDUCE_ENV = "INAGG_HOST_REDUCE"   # auto (default) | off
# K of a job on one host with no job at a controller (its calls never leave the host): the K a
# local deployment grants (its software switch's and host aggregator's), so the job's results
# are bit for bit those of the same job on a local deployment
ONE_HOST_VALUES_PER_PACKET = HOST_VALUES_PER_PACKET
_CONFIG = 16   # the leader's grant to its host's ranks (message kind, beside host_reduce's)


def host_reduce_setting(default: str = "auto") -> str:
    """``INAGG_HOST_REDUCE`` (auto or off; ``default`` when unset), or a setup error naming it."""
    value = os.environ.get(HOST_REDUCE_ENV, default).strip().lower()
    if value not in ("auto", "off"):
        raise InaggSetupError(f"{HOST_REDUCE_ENV} must be auto or off; got {value!r}")
    return value


def host_reduce_wanted(layout: HostLayout) -> bool:
    """Whether this job reduces on its hosts first (``INAGG_HOST_REDUCE``, module docstring)."""
    return host_reduce_setting() == "auto" and any(len(ranks) > 1 for ranks in layout.hosts)


class HostGroup:
    """This rank's host: its layout, its links, its ``HostReduce`` and the thread its calls run on."""

    def __init__(self, layout: HostLayout, links: dict[int, Link], timeout: float | None = None) -> None:
        """``timeout``: the longest wait for a rank of the host, in seconds (the process group's)."""
        self.layout, self.links = layout, links
        self.reduce = HostReduce(layout, links, timeout)
        self._tiny: TinyCalls | None = TinyCalls(self.reduce, links) if len(layout.local) > 1 else None
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._running = threading.RLock()   # reentrant: a future's callback may call again
        self._queued_lock = threading.Lock()
        self._queued = 0
        # started by the first call queued: a job whose calls all run on their callers' threads
        # (tiny ones) never waits for a thread to start (a re-init's time)
        self._thread: threading.Thread | None = None

    @property
    def n_hosts(self) -> int:
        return len(self.layout.hosts)

    def submit(self, work: Callable[[], None], inline_if_idle: bool) -> None:
        """Run ``work`` after every call submitted before it: here when ``inline_if_idle`` and
        none is unfinished, else on the group's thread."""
        if inline_if_idle:
            with self._running:
                with self._queued_lock:
                    idle = not self._queued
                if idle:
                    work()
                    return
        with self._queued_lock:
            self._queued += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True, name="inagg-host-io")
                self._thread.start()
        self._queue.put(work)

    def tiny(self, array: np.ndarray, average: bool, k: int) -> int | None:
        """A tiny call (``TinyCalls.allreduce``) here and now when no call is queued: the next
        call's K, or None when nothing was done (a call queued, or one C++ does not take)."""
        with self._running:
            if self._queued or self._tiny is None:
                return None
            return self._tiny.allreduce(array, average, k)

    def _loop(self) -> None:
        while (work := self._queue.get()) is not None:
            with self._running:
                work()
            with self._queued_lock:
                self._queued -= 1
            del work   # held until the next call came, it kept the caller's tensor alive

    def fail(self, error: BaseException) -> None:
        """The job failed with ``error`` (a rank named gone or stopped): the call waiting for a
        rank of the host ends with it, and so does every later one."""
        self.reduce.failed = error

    def close(self) -> None:
        """Stop the thread (after the calls submitted) and let the links and the memory go."""
        self._queue.put(None)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(30)
        self._tiny = None   # it writes on the links' descriptors, which close now
        for link in self.links.values():
            link.close()
        if self.reduce.buffer is not None:
            self.reduce.buffer.close()


def open_host_group(store, rank: int, world_size: int, timeout: timedelta) -> HostGroup | None:
    """This rank's ``HostGroup``, or None when the job does not reduce on its hosts first. A
    collective (``store``: the job's, prefixed): a round of the store (``discover_layout``),
    then the star (``connect_star``) and ``join_host_group``."""
    listener, name = listen(world_size)   # any rank may be its host's leader
    try:
        layout, names = discover_layout(store, rank, world_size, name)
        if not host_reduce_wanted(layout):
            return None
        return join_host_group(layout, connect_star(layout, listener, names, timeout), timeout)
    finally:
        listener.close()


def join_host_group(layout: HostLayout, links: dict[int, Link], timeout: timedelta, stop: Stop = never) -> HostGroup:
    """This rank's ``HostGroup`` over its host's star (``links``, ``connect_star``'s; the group
    closes them), with its first shared buffer. A collective of the host's ranks; a wait for one
    of them ends with ``stop()``'s error (``HostReduce.share_buffer``)."""
    group = HostGroup(layout, links, timeout.total_seconds())
    try:
        group.reduce.share_buffer(stop)
    except BaseException:
        group.close()
        raise
    log.debug("rank %d: reducing on this host first (%s; leader rank %d)", layout.rank, layout.describe(),
              layout.local[0])
    return group


class HostCommunicator:
    """One path's communicator through the host reduce (module docstring). ``join(rank, size)``
    makes the leader's ``Communicator``: worker ``rank`` (its host) of a job of ``size`` (hosts).
    Without ``join`` (a job whose ranks all share one host, no controller named) there is no
    job: no grant, no job id, and the host-local reduce alone carries every call, in blocks of
    ``ONE_HOST_VALUES_PER_PACKET``."""

    def __init__(self, group: HostGroup, join: Callable[[int, int], Communicator] | None) -> None:
        self.group = group
        self.comm: Communicator | None = None
        self._staging = CudaStaging()   # CUDA tensors' copy streams and pinned buffers
        self.rank, self.world_size = group.layout.rank, group.layout.world_size
        self.grant: Grant | None = None
        if join is not None:
            self.grant = self._lead(join) if group.layout.leader else self._follow()
        self.job_id = self.grant.job_id if self.grant is not None else None
        self.k = self.grant.values_per_packet if self.grant is not None else ONE_HOST_VALUES_PER_PACKET

    def _lead(self, join: Callable[[int, int], Communicator]) -> Grant:
        """Join as the host's worker and hand the first grant to the host's other ranks."""
        try:
            self.comm = join(self.group.layout.host, self.group.n_hosts)
        except Exception as e:
            self._tell(Message(_CONFIG, 0, 1, text=str(e)))
            raise
        grant = self.comm.grant
        self._tell(Message(_CONFIG, 0, 0, text=json.dumps(dataclasses.asdict(grant))))
        return grant

    def _tell(self, m: Message) -> None:
        for link in self.group.links.values():
            link.send(m)

    def _follow(self) -> Grant:
        m = self.group.links[0].recv()
        if m.kind != _CONFIG or m.a:
            raise InaggSetupError(f"rank {self.rank}: this host's leader could not join the job: {m.text}")
        fields = json.loads(m.text)
        return Grant(**fields | {"aggregator": tuple(fields["aggregator"])})

    def allreduce_async(self, tensor, op=ReduceOp.SUM, *, inline_if_idle: bool = False):
        """As ``Communicator.allreduce_async``: a ``torch.futures.Future`` of ``tensor``, summed
        (or averaged) over the job's ranks in place; every rank fails a call alike."""
        return self._call(tensor, None, op, inline_if_idle)

    def reduce_scatter_async(self, tensor, output, op=ReduceOp.SUM, *, inline_if_idle: bool = False):
        """A ``torch.futures.Future`` of ``output``: this rank's shard of the sum (or mean) of
        ``tensor`` (the ranks' outputs end to end, a CPU tensor or array) over the job's ranks;
        ``tensor`` stays as it was and no other shard reaches this rank (``HostReduce``'s
        ``Shard``); between hosts the leader receives its host's ranks' shards of the sum. A
        ValueError, before any call, when ``output`` is not one rank's share of ``tensor`` or
        either is a CUDA tensor; every rank fails a call alike."""
        refuse_cuda_scatter(tensor, output)
        return self._call(tensor, output, op, inline_if_idle)

    def _call(self, tensor, output, op: ReduceOp, inline_if_idle: bool):
        """One call of the host reduce (an allreduce, or with ``output`` a reduce-scatter)."""
        import torch

        average, refusal = reduce_kind(op)
        staged = None
        if output is None and isinstance(tensor, torch.Tensor) and tensor.is_cuda and not tensor_refusal(tensor):
            staged = self._staging.stage(tensor, numpy_view)   # the copy to host starts now
            array, bad_input = staged.values, None
        else:
            array, bad_input = as_array(tensor)
        refusal = bad_input or refusal or check_array(array, average)
        shard = output_shard(array, output, self.rank, self.world_size) if output is not None and refusal is None else None
        future = torch.futures.Future()

        def work() -> None:
            try:
                if staged is not None:
                    CudaStaging.ready(staged)
                self.k = self.group.reduce.allreduce(array, average, refusal, self.k, self.comm, shard)
                if staged is not None:
                    self._staging.finish(staged)
                future.set_result(tensor if output is None else output)
            except Exception as e:  # noqa: BLE001 - delivered to the caller through the future
                if staged is not None:
                    self._staging.release(staged)
                future.set_exception(e)

        self.group.submit(work, inline_if_idle)
        return future

    def tiny(self, array: np.ndarray, average: bool) -> bool:
        """A sum (``average``: mean) of ``array`` in place on this thread, in C++
        (``inagg.hostlib.worker.host_tiny``), where the job has no grant (its ranks all share one
        host, the same on every rank); False when nothing was done (the caller runs the call
        as any other). Raises what failed, on every rank alike."""
        if self.grant is not None:
            return False
        k = self.group.tiny(array, average, self.k)
        if k is None:
            return False
        self.k = k
        return True

    def allreduce(self, tensor, op=ReduceOp.SUM):
        """Blocking allreduce; raises what went wrong (on every rank alike)."""
        return self.allreduce_async(tensor, op, inline_if_idle=True).wait()

    def stats(self) -> dict:
        """The leader's communicator's counters (the others': the grant's mode; without a job:
        none), and the host reduce's."""
        if self.comm is not None:
            own = self.comm.stats()
        else:
            own = {"mode": self.grant.mode, "transport": self.grant.transport} if self.grant is not None else {}
        return own | {"host_reduce": dict(self.group.reduce.stats), "hosts": self.group.n_hosts,
                      "leader": self.group.layout.leader}

    def fail(self, failure: str) -> None:
        """Fail the leader's job (``Communicator.fail``); the host's other ranks learn it from
        the leader's next call, or from its end."""
        if self.comm is not None:
            self.comm.fail(failure)

    def close(self, leave: bool = True) -> None:
        """Close the leader's communicator (the group is the process group's to close)."""
        if self.comm is not None:
            self.comm.close(leave)
