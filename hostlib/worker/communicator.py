"""The communicator an ML engineer creates: allreduce through inagg for one rank of a job.

Bootstrap uses torch.distributed's rendezvous store (rank 0 creates the job at the controller
and publishes its id and token under ``inagg/job``). Every rank binds a UDP socket, joins the
job, and follows the controller's grant stream in a background thread.

A store is one launch's (``inagg.hostlib.worker.launch_identity``): the first rank of any launch to
reach it claims it for its launch id (compare-and-set), and every rank of another launch raises
``SharedStore`` there, naming both launches, before it reads the job. Rank 0 then creates the
job with a nonce made once per launch and publishes id, token and nonce; every rank joins with
the nonce (the controller refuses another), and every grant carries it: a rank takes no grant,
at start or at any change, that is not its own job's. So two launches with ids never share a
call, in any launch order. Two launches without an id (no ``$INAGG_LAUNCH_ID``, torchrun run id
or Slurm step) claim the store alike; then only the store can find them: rank 0 lists its job
under ``inagg/jobs`` and publishes it only where no other job is, every rank claims its rank
number (a counter), and a second rank 0 or a rank claimed twice sets ``inagg/shared``: every
rank of either job raises ``SharedStore``, while waiting for its first grant or at its next
heartbeat. A skewed pair of such launches (rank 0 of one and rank 1 of the other first) looks
like one whole job until the rest arrive, so it can run calls before then. Allreduces run on one
background I/O thread in submission order (every rank submits the same sequence), so
``allreduce_async`` returns at once with a ``torch.futures.Future``.

With ``host_only=True`` the controller places the job on the host aggregator whatever switch its
ranks sit on: the ``inagg`` backend's host lane beside a job on a switch.

With ``transport="roce"`` the job reaches the switch as RoCEv2 (``inagg.hostlib.wire.roce``; raw sockets,
so root): each rank also opens a RoCE endpoint whose QP number is its UDP port (unique per
host) and joins with it; host-mode grants still use UDP, as the host aggregator speaks UDP.

Each rank's calls run on the worker's stream: the native one (``inagg.hostlib.worker.stream``, C++
with the GIL released) for UDP jobs, the Python one (``inagg.hostlib.worker.stream_reference``, its specification) for
RoCE jobs or ``native=False``. Every call, even one this rank cannot run (a bad dtype, layout or
reduce op), takes part in the call's control round with its call number, so every rank fails
that call with the same error and the next call is exact; results are accepted only from the
grant's aggregator and only for an outstanding round.

Grant changes (host <-> switch, resize, new epoch) are applied at an allreduce boundary all
ranks agree on: each call carries the newest pending epoch the rank has seen (see
``inagg.hostlib.worker.call_protocol``), all ranks learn the smallest of them, and when it is newer than the active
grant they all ask the controller to activate it with the same boundary number and switch
together. Nothing in flight is lost: a call runs entirely under one grant.

Stalls: a call that gets no result for ``stuck_timeout`` in its blocks, or for ``stall_timeout``
in its control round, where a rank late to the call looks the same (a slot whose state no
resend clears: another job's or a corrupted round in it, a lost undo pass on Tofino, a switch
that lost its slot state) is reported to the controller (``_recover``); once every rank reported the same
call, the job gets a fresh epoch on the same slots (every aggregator resets a slot whose owner's
epoch changed), and every rank runs the call again from scratch with its input as it was
(``StreamBase.allreduce``: the call number and the calls before it are unchanged, so no sum
changes). A stall that comes back at that call moves the job to the host aggregator; a third,
or ranks stalled in different calls, fails the job naming what was tried. Each move is logged
on ``inagg.fallbacks`` with its reason.

Liveness: each rank renews its own lease at the controller; when a rank stops, the controller
fails the job and says so on the grant stream. The communicator then fails the pending and every
later allreduce with ``JobFailed`` naming the dead rank(s), at once instead of after the stall
timeout.
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Iterable

import numpy as np

from inagg.hostlib.worker.call_log import CallLog
from inagg.hostlib.worker.cost_model import LinkEstimator
from inagg.hostlib.worker.cuda_staging import CudaStaging, StagedCall
from inagg.hostlib.errors import InaggError, JobFailed
from inagg.hostlib.wire.grant import Grant
from inagg.hostlib.wire.protocol import ENCAPSULATIONS, HEADER_BYTES
from inagg.hostlib.wire.roce import RoceRawTransport
from inagg.hostlib.worker.stream import NativeSlotStream
from inagg.hostlib.worker.launch_identity import SharedStore, claim_store, launch_id
from inagg.hostlib.worker.neighbour import neighbour_problem
from inagg.hostlib.worker.call_protocol import Refusal, Shard, check_array
from inagg.hostlib.worker.stream_base import AllreduceError, SlotStalled
from inagg.hostlib.worker.stream_reference import SlotStream
from inagg.hostlib.worker.tensors import (
    ReduceOp, as_array, numpy_view, output_shard, reduce_kind, refuse_cuda_scatter, tensor_refusal,
)
from inagg.hostlib.wire.transport import UdpTransport

if TYPE_CHECKING:
    from inagg.hostlib.jobservice.proto import inagg_controller_pb2 as pb

log = logging.getLogger("inagg.communicator")
fallbacks = logging.getLogger("inagg.fallbacks")


# refusals of the job service that mean "your job is gone" (its lease ran out, the operator ended
# it, the controller lost its database: PERMISSION_DENIED) or "it failed" (FAILED_PRECONDITION):
# the job fails at once with the controller's words, instead of a log line per heartbeat
GONE = ("PERMISSION_DENIED", "FAILED_PRECONDITION")   # grpc.StatusCode names
SHARED_KEY = "inagg/shared"   # set when two jobs were found in one store: how they were found
JOBS_KEY = "inagg/jobs"       # the ids of the jobs rank 0s created with this store


@dataclass
class _Request:
    array: np.ndarray | None
    average: bool
    refusal: Refusal | None
    future: object  # torch.futures.Future
    result: object  # what the future resolves to
    staged: StagedCall | None = None  # a CUDA tensor's call: its pinned host copy
    shard: Shard | None = None        # a reduce-scatter's: ``array`` is a copy, this its part to keep
    keep: tuple[tuple[int, int], ...] | None = None   # ``allreduce``'s: the ranges of ``array`` this rank needs

    def part(self) -> tuple[tuple[int, int], ...] | None:
        """The stream's ``part``: the ranges of this rank's values (None: an allreduce)."""
        return self.keep if self.shard is None else ((self.shard.first, self.shard.first + self.shard.out.size),)

    def keep_shard(self) -> None:
        """A reduce-scatter's done: this rank's shard of the sum into its output."""
        if self.shard is not None:
            np.copyto(self.shard.out, self.array[self.shard.first:self.shard.first + self.shard.out.size])


class Communicator:
    """One rank's inagg endpoint. Use ``from_rendezvous`` or pass a torch.distributed Store."""

    def __init__(self, store, rank: int, world_size: int, controller: str, *, bind_ip: str = "127.0.0.1",
                 mac: str = "", bytes_per_iteration: int = 0, iteration_seconds: float = 1.0,
                 name: str = "", timeout: float = 60.0, stall_timeout: float = 30.0,
                 transport: str = "udp", native: bool = True, host_only: bool = False,
                 launch: str | None = None, stuck_timeout: float | None = None) -> None:
        """``stall_timeout``: the longest a call waits for ranks or results before it raises;
        ``stuck_timeout`` (default half of it): no result for this long in a call's blocks is a
        stall, and the call moves to a fresh epoch (module docstring, "Stalls"); a rank paused
        that long mid-call (a debugger, a starved process) is taken for one, hence not shorter."""
        from inagg.hostlib.jobservice.client import ControllerClient, to_grant  # gRPC stubs

        if transport not in ENCAPSULATIONS:
            raise ValueError(f"transport must be one of {', '.join(ENCAPSULATIONS)}, got {transport!r}")
        self.rank, self.world_size = rank, world_size
        self.host_only = host_only
        self.launch = launch_id(launch)   # "" when the launcher gave none (inagg.hostlib.worker.launch_identity)
        self._to_grant = to_grant
        # the endpoints first: a rank that cannot open them (RoCE needs root) fails before the
        # job exists
        ip, port = self._open_endpoints(bind_ip, transport)
        self.client = ControllerClient(controller)
        self._join_job(store, f"{ip}:{port}", mac, port if transport == "roce" else 0,
                       bytes_per_iteration=bytes_per_iteration, iteration_seconds=iteration_seconds,
                       name=name, transport=transport)
        grant = self._first_grant(timeout)
        # UDP jobs (the default) run the native stream; RoCE jobs (raw sockets) and native=False
        # the Python one
        stream_class = SlotStream if transport == "roce" or not native else NativeSlotStream
        self._start_stream(stream_class, grant, stall_timeout,
                           stall_timeout / 2 if stuck_timeout is None else stuck_timeout)
        self._start_calls()

    def _open_endpoints(self, bind_ip: str, transport: str) -> tuple[str, int]:
        """This rank's UDP socket (its address is the rank's endpoint) and, for a RoCE job, its
        RoCE endpoint on the same address (QP number = UDP port); returns (ip, port)."""
        udp = UdpTransport(("127.0.0.1", 9), bind=(bind_ip, 0))
        ip, port = udp.address
        self._transports = {"udp": udp}
        if transport == "roce":
            try:
                self._transports["roce"] = RoceRawTransport((ip, port), bind=(ip, port))
            except OSError:
                udp.close()
                raise
        self.transport = udp
        return ip, port

    def _join_job(self, store, address: str, mac: str, roce_qp: int, *, bytes_per_iteration: int,
                  iteration_seconds: float, name: str, transport: str) -> None:
        """Claim the store for this launch (``claim_store``: a rank of another launch is refused
        here), then rank 0 creates the job with a nonce made now, once per launch, and publishes
        id, token and nonce under ``inagg/job``; every rank reads them and joins with its
        endpoint and the nonce (the controller refuses one that is not the job's, and every grant
        carries it: ``_foreign``)."""
        self._store = store
        claim_store(store, self.rank, self.launch)
        claims = store.add(f"inagg/rank/{self.rank}", 1)
        if self.rank == 0:
            nonce = secrets.token_hex(16)
            job_id, token = self.client.create_job(self.world_size, bytes_per_iteration, iteration_seconds,
                                                   name, transport, self.host_only, nonce=nonce)
            store.append(JOBS_KEY, f"{job_id} ")
            published = f"{job_id}:{token}:{nonce}"
            if store.compare_set("inagg/job", "", published).decode() != published:
                self._shared("two rank 0s created a job")
        store.wait(["inagg/job"])
        job_id_text, self.token, self.nonce = store.get("inagg/job").decode().split(":")
        self.job_id = int(job_id_text)
        if claims > 1:
            self._shared(f"rank {self.rank} claimed {claims} times")
        reply = self.client.join(self.job_id, self.token, self.rank, address, mac, roce_qp=roce_qp,
                                 nonce=self.nonce)
        self.lease_seconds = reply.lease_seconds
        self.rank_lease_seconds = reply.rank_lease_seconds or reply.lease_seconds

    def _shared(self, how: str) -> None:
        """Two jobs are in this store: say so to every rank of both (``SHARED_KEY``), and raise."""
        self._store.set(SHARED_KEY, how)
        self._check_store()

    def _check_store(self, wait: float = 5.0) -> None:
        """Raise ``SharedStore`` naming the jobs when a rank found another job in this store
        (waiting up to ``wait`` s for the other launch's rank 0 to list its job)."""
        if not self._store.check([SHARED_KEY]):
            return
        deadline = time.monotonic() + wait
        while len(jobs := self._store.get(JOBS_KEY).decode().split()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        raise SharedStore(f"jobs {' and '.join(jobs)} share one rendezvous store "
                          f"({self._store.get(SHARED_KEY).decode()}); give each job its own "
                          f"(another MASTER_PORT or init_method)")

    def _first_grant(self, timeout: float) -> Grant:
        """Follow the job's grant stream (a background thread) and wait for its first active
        grant, which comes once every rank joined."""
        self.failure = ""  # set when the controller failed the job
        self._grants: dict[int, Grant] = {}
        self._pending_epoch = 0
        self._active_epoch = 0
        self._first = threading.Event()
        self._closed = threading.Event()
        self.stream_reopened = 0
        self.stream: SlotStream | NativeSlotStream | None = None  # once the first grant came
        self._grant_stream = self.client.watch(self.job_id, self.token, self.rank)
        self._threads = [threading.Thread(target=self._follow_grants, daemon=True, name="inagg-grants")]
        self._threads[0].start()
        deadline = time.monotonic() + timeout
        while not self._first.wait(0.2) and time.monotonic() < deadline:
            self._check_store()
        self._check_store()
        if not self._first.is_set():
            raise TimeoutError(f"job {self.job_id}: no grant from the controller within {timeout}s "
                               f"(did all {self.world_size} ranks join?)")
        if self.failure:
            raise JobFailed(f"job {self.job_id} failed: {self.failure}")
        return self._grants[self._active_epoch]

    def _start_stream(self, stream_class: type, grant: Grant, stall_timeout: float, stuck_timeout: float) -> None:
        """The stream this rank's calls run on, under the first grant."""
        self.stream = stream_class(grant, self.rank, self.world_size, self.transport, stall_timeout=stall_timeout,
                                   stuck_timeout=stuck_timeout)
        self.call_log = CallLog()   # the grants used and the calls' durations (stats)
        self._use(grant)
        self.boundary = 0
        self.grant_changes = 0

    def _start_calls(self) -> None:
        """The path model, the call queue and its I/O thread, and the lease thread."""
        # alpha/beta of this rank's path, measured: every call's control round is a latency
        # probe and every call a (wire bytes, seconds) transfer sample of 1 or 2 round trips
        # (a small call rides in the control round; inagg.hostlib.worker.cost_model)
        self.link = LinkEstimator(alpha=1e-4, beta=1e-8)
        self._staging = CudaStaging()   # CUDA tensors' copy streams and pinned buffers
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        # calls run one at a time (_running) in submission order; _queued counts the requests
        # given to the I/O thread and not yet finished: a blocking call with none queued runs
        # on its caller's thread (no hand-over to the I/O thread and back: a small call's latency)
        self._running = threading.RLock()   # reentrant: a future's callback may call again
        self._queued_lock = threading.Lock()
        self._queued = 0
        self._io_thread = threading.Thread(target=self._io_loop, daemon=True, name="inagg-io")
        self._threads += [self._io_thread, threading.Thread(target=self._heartbeat, daemon=True, name="inagg-lease")]
        for thread in self._threads[1:]:
            thread.start()

    @classmethod
    def from_rendezvous(cls, url: str, controller: str, **kwargs) -> "Communicator":
        """``url`` as for ``torch.distributed.rendezvous`` (e.g. ``env://`` or
        ``tcp://host:port?rank=R&world_size=N``)."""
        import torch.distributed as dist

        store, rank, world_size = next(dist.rendezvous(url))
        return cls(store, rank, world_size, controller, **kwargs)

    # -- grants ------------------------------------------------------------------------------

    def _follow_grants(self) -> None:
        """Consume the grant stream; reopen it when it breaks (a controller restart) until the
        communicator is closed. Grants in use are never changed here, only recorded. A grant
        without this launch's nonce (``_foreign``), a failure, or a refusal of the stream that
        means the job is gone (``GONE``: a controller that lost its database, a lease that ran
        out) fails the job at once with that reason."""
        import grpc

        while not self._closed.is_set():
            try:
                for g in self._grant_stream:
                    if problem := self._foreign(g) or g.failure:
                        self._fail(problem)
                        return
                    # each update is the active grant, then the pending one if there is one:
                    # the pending epoch is the latest update's (a withdrawn one is forgotten)
                    self._grants[g.epoch] = self._to_grant(g)
                    self._pending_epoch = g.epoch if g.pending else 0
                    if not g.pending and not self._first.is_set():
                        self._active_epoch = g.epoch
                        self._first.set()
            except grpc.RpcError as e:
                if e.code().name in GONE and not self._closed.is_set():
                    self._gone("its grant stream", f"{e.code().name}: {e.details()}")
                    return
                if not self._closed.is_set() and not self.failure:   # a failed job's controller may be gone with it
                    log.warning("job %d rank %d: grant stream from %s broke (%s: %s); reopening",
                                self.job_id, self.rank, self.client.address, e.code().name, e.details())
            if self._closed.wait(0.5):
                return
            self.stream_reopened += 1
            self._grant_stream = self.client.watch(self.job_id, self.token, self.rank)

    def _foreign(self, g: "pb.Grant") -> str:
        """Why grant ``g`` (a pb.Grant) is not this job's: it does not carry this launch's job
        nonce (the controller's job is another launch's, or another job under a reused id); ""
        when it does. The job then fails with that reason, and no call runs on the grant."""
        if g.nonce == self.nonce:
            return ""
        return (f"grant epoch {g.epoch} of job {g.job_id} carries job nonce {g.nonce[:8] or 'none'}..., "
                f"not this launch's {self.nonce[:8]}...: it is another launch's job; no call runs on it")

    def _own(self, g: "pb.Grant") -> Grant:
        """The grant ``g`` the controller answered with, as this rank uses it; one that is not
        this job's (``_foreign``) fails the job."""
        if problem := self._foreign(g):
            self._fail(problem)
            raise JobFailed(f"job {self.job_id} failed: {problem}")
        return self._to_grant(g)

    def _gone(self, what: str, refusal: str) -> None:
        """The controller refused ``what`` as ``GONE`` (``refusal``: its code and words): fail
        the job now with its reason; a failed job's own reason as the grant stream gives it (so
        every rank's ``JobFailed`` reads alike, whichever call learnt it first)."""
        failed = f"job {self.job_id} failed: "
        self.fail(refusal.split(failed, 1)[1] if failed in refusal else f"the controller refused {what}: {refusal}")

    def fail(self, failure: str) -> None:
        """Fail the job from outside (a rank is known to have ended: ``failure`` names it), as
        when the controller fails it (``_fail``)."""
        if not self.failure:
            self._fail(failure)

    def _fail(self, failure: str) -> None:
        """The job failed: its pending allreduce stops at its next tick (``abort``; ``_run``
        reports it as JobFailed) and every later one raises JobFailed at once."""
        self.failure = failure
        self._first.set()
        stream = self.stream
        if stream is not None:
            stream.abort()

    def _heartbeat(self) -> None:
        """Renew this rank's lease, four times per lease so one lost beat never expires it; a
        beat waits at most half a lease for a controller that is down or slow. Beats are paced
        from each one's start, so one that took its deadline (or any beat period) is followed at
        once, not a whole period later (the controller last heard this rank before it), and the
        store is checked for a shared launch only after the beat, so a slow store never delays
        it. A beat refused as ``GONE`` (the controller knows no such job any more, or it failed)
        fails the job at once with the controller's reason; any other failed beat (the controller
        is down) is logged and retried, as an error once a whole lease passed without one."""
        lease = min(self.lease_seconds, self.rank_lease_seconds)
        period = max(lease / 4, 0.1)
        last_ok = started = time.monotonic()
        while not self._closed.wait(max(started + period - time.monotonic(), 0.0)):
            if self.failure:
                return
            started = time.monotonic()
            try:
                self.client.heartbeat(self.job_id, self.token, self.rank, timeout=max(lease / 2, 0.2))
                last_ok = time.monotonic()
            except Exception as e:  # noqa: BLE001 - any failure: logged, retried
                if self._closed.is_set():   # close() cancelled it
                    return
                if getattr(getattr(e, "code", None), "name", "") in GONE:   # the job is gone or failed: say so now
                    self._gone("its heartbeat", str(e))
                    return
                silent = time.monotonic() - last_ok
                level = logging.ERROR if silent > lease else logging.WARNING
                log.log(level, "job %d rank %d: heartbeat failed (%s); no renewal for %.0fs of a %.0fs lease",
                        self.job_id, self.rank, e, silent, lease)
            try:
                self._check_store()
            except SharedStore as e:
                self._fail(str(e))
                return

    def _switch_if_agreed(self) -> None:
        agreed = self.stream.agreed_epoch
        if agreed <= self.stream.grant.epoch:
            return
        grant = self._own(self._activate(agreed).grant)
        if grant.epoch != self.stream.grant.epoch:
            self._use(grant)
            self.grant_changes += 1

    def _activate(self, epoch: int) -> "pb.ActivateReply":
        """Ask the controller to switch to pending grant ``epoch`` at this boundary, again
        until every rank has asked (the controller changes a grant only then, so no rank still
        resends in the old epoch)."""
        return self._until_all(lambda: self.client.activate(self.job_id, self.token, epoch, self.boundary,
                                                            self.rank), f"ask to switch to grant epoch {epoch}")

    def _until_all(self, ask: Callable[[], "pb.ActivateReply"], what: str) -> "pb.ActivateReply":
        """``ask()`` the controller (a reply with ``waiting_for``) again until every rank did
        (``what``, in words); polls from 1 ms, backing off to 50 ms, at most a stall timeout."""
        deadline = time.monotonic() + self.stream.stall_timeout
        pause = 1e-3
        while True:
            reply = ask()
            if not reply.waiting_for:
                return reply
            if self.failure:
                raise JobFailed(f"job {self.job_id} failed: {self.failure}")
            if self._closed.is_set():
                raise self._closed_error()
            if time.monotonic() > deadline:
                raise JobFailed(f"job {self.job_id} rank {self.rank}: {reply.waiting_for} rank(s) did not "
                                f"{what} within {self.stream.stall_timeout:.0f}s of this one")
            time.sleep(pause)
            pause = min(2 * pause, 0.05)

    def _allreduce(self, req: _Request) -> None:
        """The call on the stream; run again from scratch on the grant ``_recover`` gets each
        time it stalls, until it completes or the controller gives up on the job."""
        again = False
        while True:
            try:
                self.stream.allreduce(req.array, self._pending_epoch, average=req.average,
                                      refusal=req.refusal, again=again, part=req.part())
                req.keep_shard()
                return
            except SlotStalled as stall:
                if self.failure or self._closed.is_set():   # aborted, not stalled
                    raise
                self._recover(stall)
                again = True

    def _recover(self, stall: SlotStalled) -> None:
        """Report ``stall`` (this call's, in its grant's epoch) to the controller until every
        rank did, then use the grant it gives: a fresh epoch, or the host aggregator. A
        controller that fails the job (the stall came back after both) fails it here too."""
        epoch = self.stream.grant.epoch
        why = str(stall).split(": ", 1)[-1]
        try:
            reply = self._until_all(lambda: self.client.report_stall(self.job_id, self.token, epoch, self.boundary,
                                                                     self.rank, why), "report the stall")
        except JobFailed:
            raise
        except Exception as e:  # noqa: BLE001 - the controller's refusal or its absence, named
            if getattr(getattr(e, "code", None), "name", "") in GONE:
                self._gone("the stall report", str(e))
                raise JobFailed(f"job {self.job_id} failed: {self.failure}") from None
            raise AllreduceError(f"{stall}; the controller could not move the job: {e}") from e
        grant = self._own(reply.grant)
        if grant.epoch <= epoch:
            raise AllreduceError(f"{stall}; the controller kept the job at epoch {grant.epoch} (an older "
                                 f"controller that does not move stalled jobs?)")
        self._use(grant)
        self.grant_changes += 1
        fallbacks.log(logging.WARNING if self.rank == 0 else logging.DEBUG,
                      "job %d rank %d: call %d stalled at epoch %d (%s); running it again on %s epoch %d%s",
                      self.job_id, self.rank, self.boundary, epoch, why, grant.mode, grant.epoch,
                      f": {grant.reason}" if grant.mode == "host" else "")

    def _use(self, grant: Grant) -> None:
        """Send under ``grant`` from the next call on, in its encapsulation. The transport goes
        first: the stream takes the source results must come from from it (a RoCE result's is
        the switch's IP, a UDP one's IP and port)."""
        if grant.mode == "host":   # rank 0 says it for the job, as a warning unless asked for; the others in DEBUG
            log.log(logging.DEBUG if self.rank else logging.INFO if self.host_only else logging.WARNING,
                    "job %d rank %d: aggregating on the host aggregator %s:%d, not a switch: %s",
                    grant.job_id, self.rank, *grant.aggregator, grant.reason or "the controller's choice")
        else:
            # rank 0 says it for the job (every rank holds the same grant); the others in DEBUG
            log.log(logging.INFO if self.rank == 0 else logging.DEBUG,
                    "job %d rank %d: aggregating on the switch (%s:%d, slots [%d,%d), epoch %d)", grant.job_id,
                    self.rank, *grant.aggregator, grant.slot_base, grant.slot_base + grant.slot_count, grant.epoch)
            if grant.aggregator_mac and (problem := neighbour_problem(grant.aggregator[0], grant.aggregator_mac)):
                log.warning("job %d rank %d: %s", grant.job_id, self.rank, problem)
        self.transport = self.stream.transport = self._transports[grant.transport]
        # RoCE: the switch ignores the destination QP of contributions; the UDP port stands in
        self.transport.retarget(grant.aggregator)
        self.stream.set_grant(grant)
        self.call_log.use(grant)

    # -- allreduce ---------------------------------------------------------------------------

    def _io_loop(self) -> None:
        while (req := self._queue.get()) is not None:
            with self._running:
                self._run(req)
            with self._queued_lock:
                self._queued -= 1
            del req   # held until the next call came, it kept the caller's tensor alive

    def _run(self, req: _Request) -> None:
        """One call, start to end; its outcome goes to the request's future."""
        try:
            if self.failure:
                raise JobFailed(f"job {self.job_id} failed: {self.failure}")
            if self._closed.is_set():
                raise self._closed_error()
            if req.staged is not None:
                CudaStaging.ready(req.staged)
            sent, started = self.stream.stats.wire_bytes_sent, time.perf_counter()
            self._allreduce(req)
            seconds = time.perf_counter() - started
            self.call_log.call(seconds)
            self.link.observe(self.stream.stats.wire_bytes_sent - sent, seconds,
                              latencies=2 * self.stream.round_trips)
            self.link.observe(2 * (HEADER_BYTES + self.transport.overhead), self.stream.control_rtt,
                              latencies=2)
            self.boundary += 1
            self._switch_if_agreed()
            if req.staged is not None:
                self._staging.finish(req.staged)
            req.future.set_result(req.result)
        except Exception as e:  # noqa: BLE001 - delivered to the caller through the future
            if req.staged is not None:
                self._staging.release(req.staged)
            self.boundary += 1
            if self.failure and not isinstance(e, JobFailed):
                e = JobFailed(f"job {self.job_id} failed: {self.failure}")
            elif self._closed.is_set() and not isinstance(e, InaggError):   # close() aborted it
                e = self._closed_error()
            req.future.set_exception(e)

    def _closed_error(self) -> InaggError:
        return InaggError(f"job {self.job_id} rank {self.rank}: the communicator was closed before this call ended")

    def _request(self, tensor, op) -> _Request:
        import torch

        average, refusal = reduce_kind(op)
        if isinstance(tensor, torch.Tensor) and tensor.is_cuda and not tensor_refusal(tensor):
            staged = self._staging.stage(tensor, numpy_view)   # the copy to host starts now
            array, bad_input = staged.values, None
        else:
            staged, (array, bad_input) = None, as_array(tensor)
        refusal = bad_input or refusal or check_array(array, average)
        return _Request(array, average, refusal, torch.futures.Future(), tensor, staged)

    def allreduce_async(self, tensor, op=ReduceOp.SUM, *, inline_if_idle: bool = False):
        """Queue an allreduce of a torch tensor (float32, float16, bfloat16 or int32, contiguous;
        CUDA tensors are staged through pinned host memory, ``inagg.hostlib.worker.cuda_staging``: their copy
        to host starts here, on a stream of its own, and overlaps the calls queued before) or a
        numpy array; returns a ``torch.futures.Future``
        resolving to the same tensor, reduced in place. ``op``: SUM or AVG, this library's
        ``ReduceOp`` or ``torch.distributed.ReduceOp``.

        ``inline_if_idle``: when no call submitted before it is unfinished, run it here, on the
        caller's thread, and return its future already complete (no hand-over to the I/O thread
        and back: a small call's latency; the caller waits for the whole call). Otherwise it is
        queued behind the others, as without.

        A call this rank cannot run (another dtype, a non-contiguous tensor, another op...) is
        still queued: it takes part in the call's control round with its reason, so every rank
        fails that call with the same error naming this rank, and later calls stay aligned."""
        return self._queue_call(self._request(tensor, op), inline_if_idle)

    def reduce_scatter_async(self, tensor, output, op=ReduceOp.SUM, *, inline_if_idle: bool = False):
        """Queue a reduce-scatter: a ``torch.futures.Future`` of ``output``, this rank's shard
        of the sum (or mean) of ``tensor`` (the ranks' outputs end to end; CPU tensors or
        arrays) over the job's ranks; ``tensor`` stays as it was. A copy of ``tensor`` goes
        through the stream with this rank's shard (``StreamBase.allreduce``'s ``part``): the
        blocks wholly in it carry FLAG_MINE, so the soft switch, BMv2 and the host aggregator send
        each block's values only to the rank that owns it and the others the header alone;
        a block across two shards, and every block on an aggregator that ignores the flag,
        comes to every rank whole. A ValueError, before any call, when ``output`` is not one
        rank's share of ``tensor`` or either is a CUDA tensor; every rank fails a call alike."""
        refuse_cuda_scatter(tensor, output)
        req = self._request(tensor, op)
        if req.refusal is None:
            shard = output_shard(req.array, output, self.rank, self.world_size)
            req = replace(req, array=req.array.copy(), shard=shard, result=output)
        return self._queue_call(req, inline_if_idle)

    def _queue_call(self, req: _Request, inline_if_idle: bool):
        """Queue ``req`` (``allreduce_async``'s ``inline_if_idle``: run it here when nothing
        submitted before it is unfinished); its future."""
        if not inline_if_idle:
            self._submit(req)
            return req.future
        with self._running:
            with self._queued_lock:
                inline = not self._queued
            if inline:   # nothing submitted before it is unfinished: run it here, in order
                self._run(req)
            else:
                self._submit(req)
        return req.future

    def _submit(self, req: _Request) -> None:
        with self._queued_lock:
            self._queued += 1
        self._queue.put(req)

    def allreduce(self, tensor, op=ReduceOp.SUM, *, keep: Iterable[tuple[int, int]] | None = None):
        """Blocking allreduce (on the caller's thread when nothing is queued); raises what went
        wrong (on every rank alike). ``keep``: this rank needs only the values of the sum in
        these sorted, disjoint ``[first, end)`` ranges (the host-local reduce's leader in a
        reduce-scatter: its host's ranks' shards; bad ranges refuse the call on every rank,
        ``call_protocol.check_part``): the blocks wholly in one carry FLAG_MINE, as
        ``reduce_scatter_async``'s shard, and a block wholly outside all of them may come back
        without its values and keep this rank's own; no copy of ``tensor`` is made."""
        keep = None if keep is None else tuple(keep)   # a call run again (a stall) reads it again
        return self._queue_call(replace(self._request(tensor, op), keep=keep), inline_if_idle=True).wait()

    @property
    def grant(self) -> Grant:
        return self.stream.grant

    @property
    def pending_grant(self) -> Grant | None:
        """The grant the controller offers this job next (a move between the host aggregator
        and a switch, other slots), once this rank has seen it; the ranks take it together at
        the end of a call (``_switch_if_agreed``). None: no grant is offered."""
        epoch = self._pending_epoch
        return self._grants.get(epoch) if epoch > self.stream.grant.epoch else None

    def stats(self) -> dict:
        s = self.stream.stats.as_dict()
        g = self.grant
        s.update(mode=g.mode, transport=g.transport, window=self.stream.window, epoch=g.epoch, slots=f"[{g.slot_base},{g.slot_base + g.slot_count})",
                 grant_changes=self.grant_changes, grants=self.call_log.story(),
                 call_ms_median=self.call_log.median_ms(),
                 goodput_MBps=(4 * s["elements"] / s["seconds"] / 1e6) if s["seconds"] else 0.0)
        return s

    def close(self, leave: bool = True) -> None:
        """Stop the communicator; with ``leave`` the rank says it is done at the controller (the
        job ends when every rank did, or when its lease runs out; a failed job is ended already,
        and its controller may be gone with a dead rank 0: no call to wait on). A call
        still running or queued fails at once (its stream is aborted). Returns when its threads
        have ended: at interpreter exit, a thread still inside a native call (which releases
        the GIL) aborts the process when it takes the GIL back, and one writing a log line can
        too; and the sockets close only once no call can use them."""
        self._closed.set()
        self.stream.abort()
        self._queue.put(None)
        self._grant_stream.cancel()
        if leave and not self.failure:  # the rank is done (no longer watched); the last one's leave ends the job
            try:
                self.client.leave(self.job_id, self.token, self.rank)
            except Exception as e:  # noqa: BLE001 - logged; the lease expires anyway
                log.info("job %d rank %d: could not leave at the controller (%s); its lease expires "
                         "instead", self.job_id, self.rank, e)
        self._join(self._io_thread)
        for transport in self._transports.values():
            transport.close()
        self.client.close()   # ends a heartbeat in flight
        for thread in self._threads:
            self._join(thread)

    def _join(self, thread: threading.Thread, timeout: float = 10.0) -> None:
        """Wait for one of this communicator's threads to end (not when close() runs on it: a
        future's callback on the I/O thread); one that outlives ``timeout`` is logged."""
        if thread is threading.current_thread():
            return
        thread.join(timeout)
        if thread.is_alive():
            log.warning("job %d rank %d: thread %s still running %.0fs after close()", self.job_id, self.rank,
                        thread.name, timeout)
