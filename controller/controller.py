"""The controller: the job table, its changes as transactions, and the calls jobs and operators make.

State changes go through one lock and are transactions (``Controller._change``): the new state
is computed, applied to the switches, then persisted; when any step fails (a switch refuses or is
unreachable, the database cannot be written) the in-memory state is restored and the switches
re-synced, so one job's failure never half-applies and never blocks another job. Decisions that
end or fail a job are not undone by a database that cannot be written (a full disk): they hold in
memory, reach the ranks, and are saved once the database takes writes again (``_save_if_behind``). A switch is *reconciled* whenever its desired
entries change: the desired table entries and multicast groups are computed from the allocator's
active grants and diffed against what the controller last made the switch hold, or against what
the switch reports by Read where that is not known (a new session: so a restarted controller
converges to the same state from the SQLite store; a failed write; another primary elected); a
restarted switch (its stream channel breaks, or its pipeline is gone) is re-programmed by the
keeper thread (``keep_switch``), which also reads each switch back in full every
``switch_audit_seconds`` and repairs what was changed behind the controller's back.

At start, before anything is programmed, the switches' jobs and job-id marks are read over
P4Runtime and reconciled with the database (``_check_switches``): ids never repeat, and jobs a
lost or emptied database forgot are named and refused with why, never silently forgotten.

Liveness: every rank renews its own lease (Heartbeat with its rank). When one rank of a placed job
is silent for ``rank_lease_seconds`` of the controller's own running time (its stalls pause the
lease clocks: ``expire_leases``) the job fails: its slots return to the pool and its surviving
ranks get a grant whose ``failure`` names the silent rank(s).

The parts: ``jobs`` (the job records and the checks on requests), ``fabric`` (switches, slot
pools, placement, programming), ``grants`` (what is told about jobs) and ``service`` (the gRPC
servicer over this class).
"""

from __future__ import annotations

import contextlib
import copy
import hmac
import json
import logging
import secrets
import threading
import time
from typing import Iterator

import grpc

from inagg.controller import grants
from inagg.controller.allocator import SWITCH, Demand, Placement
from inagg.controller.config import ControllerConfig
from inagg.controller.fabric import Fabric
from inagg.controller.jobs import (Job, Member, Refused, authenticated, check_member, check_nonce,
                                   check_rank, job_from_row, pause_leases, running, silence,
                                   stall_record)
from inagg.controller.store import Store, StoreError, state_from_json
from inagg.controller.switch import SwitchError
from inagg.controller.tree_place import restore_tree, tree_record
from inagg.controller.validation import MAX_NAME_CHARS, MAX_NONCE_CHARS, MAX_TOKEN_CHARS, check_demand, check_text
from inagg.hostlib.jobservice.client import CALL_SECONDS
from inagg.hostlib.jobservice.proto import inagg_controller_pb2 as pb
from inagg.hostlib.wire.protocol import ENCAPSULATIONS, MAX_WORKERS

log = logging.getLogger("inagg.controller")


class Controller:
    """All controller state; the gRPC servicer (``inagg.controller.service``) is a thin layer over it."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.version = 0
        self.store = Store(config.database)
        self.fabric = Fabric(config)
        self.jobs: dict[int, Job] = {}
        self._listing: tuple[pb.JobList, list[grants.OnSwitch]] = (pb.JobList(), [])
        self.unsaved = False   # the store is behind the memory (it could not be written)
        self.stopped = threading.Event()
        self.lost: dict[int, str] = {}   # jobs a switch held that the database did not: why they are gone
        self.id_floor = 1                # job ids start above every job a switch held at start
        self._restore()
        with self.lock:
            self._check_switches()
            self._sync()

    # -- persistence -------------------------------------------------------------------------

    def _restore(self) -> None:
        """The jobs of the store. Each rank gets a heartbeat's deadline on top of its lease: a
        beat it sent while the controller was down waits that long for it (a healthy rank is
        never failed for the controller's own absence)."""
        for row in self.store.jobs():
            job = job_from_row(row, grace=CALL_SECONDS)
            self.jobs[job.job_id] = job
            if "active" in json.loads(row["state"]) and job.place is not None:
                self.fabric.allocators[job.place].restore_job(state_from_json(row["state"]))
            if row["tree"]:
                restore_tree(job, row["tree"], self.fabric.allocators)
        log.info("restored %d job(s)", len(self.jobs))

    def _check_switches(self) -> None:
        """Reconcile what the switches hold with the database, before anything is programmed
        (lock held). Job ids continue above every job a switch holds, above the job-id mark
        the switches keep (``JobAdmission.mark_update``) and the database's marks
        (``Store.next_job_id``), so a database that was deleted or emptied never hands out an id
        whose entries or slot tags are still on a switch. A job a switch holds that the database
        does not know is *lost*: it cannot be rebuilt (its token is gone), so it is said loudly,
        its entries go with the first reconcile, and its ranks are refused with the reason
        (``authenticate``: they fail at once)."""
        installed, mark = self.fabric.installed_jobs()
        held = {job_id: name for name, jobs in installed.items() for job_id in jobs}
        self.id_floor = max(1 + max(held, default=0), mark)
        self.fabric.keep_id_mark(max(self.id_floor, self.store.job_id_mark()))
        lost = sorted(set(held) - set(self.jobs))
        if lost:
            why = (f"the controller's database {self.store.path} had no record of it when the controller "
                   f"restarted (deleted, emptied or an older copy); its switch entries were removed")
            self.lost.update((job_id, f"job {job_id} is gone: {why}") for job_id in lost)
            log.error("controller database %s holds no record of job(s) %s that switch(es) %s hold: it was "
                      "deleted, emptied or replaced; they are removed and their ranks told so; job ids continue "
                      "from %d", self.store.path, ", ".join(map(str, lost)),
                      ", ".join(sorted({held[j] for j in lost})), max(self.id_floor, self.store.job_id_mark()))
        self._fail_older_epochs(installed)

    def _fail_older_epochs(self, installed: dict[str, dict[int, int]]) -> None:
        """Fail each known job a switch holds at a later epoch than the database's (an older copy
        of the database): its next epochs would repeat ones whose slot tags the switch may hold."""
        for name, jobs in installed.items():
            for job_id, epoch in jobs.items():
                state = self.fabric.allocators[name].jobs.get(job_id)
                if job_id in self.jobs and state is not None and epoch > state.active.epoch:
                    job = self.jobs[job_id]
                    job.failure = (f"switch {name} holds it at epoch {epoch}, the controller's database at "
                                   f"{state.active.epoch} (an older copy): its epochs could repeat")
                    self.fabric.remove(job)
                    log.error("job %d failed: %s", job_id, job.failure)

    def _save(self, *, durable: bool) -> None:
        """Persist every placed job's state and delete the rows of jobs that ended or failed.
        When the database cannot be written: raise if ``durable``, else log it and remember
        that the store is behind (the change holds in memory)."""
        try:
            states = [(state, job.place, job.job_index, tree_record(job, self.fabric.allocators), stall_record(job))
                      for job in self.jobs.values()
                      if not job.failure and (state := self.fabric.state(job)) is not None]
            gone = [i for i in self.store.job_ids() if i not in self.jobs or self.jobs[i].failure]
            self.store.save(states, gone)
            self.unsaved = False
        except StoreError as e:
            if durable:
                raise
            self.unsaved = True
            log.error("%s (the change holds in memory; it is saved once the database takes writes)", e)

    def _save_if_behind(self) -> None:
        """Retry saving what a full or read-only database refused before."""
        with self.lock:
            if self.unsaved:
                self._save(durable=False)

    # -- transactions ------------------------------------------------------------------------

    def _announce(self) -> None:
        """Wake the grant and host-job watchers and publish the listing: the state changed."""
        self.version += 1
        self._publish_listing()
        self.changed.notify_all()

    def _publish_listing(self) -> None:
        """The listing ``list_jobs`` answers from, built with the lock held after every change
        (a new job, a committed or rolled back transaction), so a listing never waits for the
        lock: ListJobs answers during a storm of placements, as Heartbeat does."""
        self._listing = grants.list_jobs(self.fabric, self.jobs.values())

    def _sync(self, *, force: bool = False, durable: bool = True) -> None:
        """Called with the lock held after any change: switches whose entries changed, store
        (``_save``), watchers. Raises when a switch refuses. ``force`` (after a rollback):
        program every switch, logging the ones that fail (the keeper retries them)."""
        self.fabric.program(self.jobs, force=force)
        self._save(durable=durable and not force)
        self._announce()

    @contextlib.contextmanager
    def _change(self, what: str, *, durable: bool = True) -> Iterator[None]:
        """A transaction over the jobs and allocators (lock held): the body changes them, then
        the switches are synced; on any error both are restored and the switches re-synced, so
        nothing is half applied. ``durable=False``: a database that cannot be written does not
        undo the change (``_save``). A database error is answered with its own code (full:
        RESOURCE_EXHAUSTED), other errors but ``Refused`` ABORTED."""
        saved_jobs, saved_pools = copy.deepcopy(self.jobs), self.fabric.snapshot()
        try:
            yield
            self._sync(durable=durable)
        except BaseException as e:
            self.jobs = _keep_leases(saved_jobs, self.jobs)
            self.fabric.restore(saved_pools)
            self._sync(force=True)
            if isinstance(e, Refused) or not isinstance(e, Exception):
                raise
            if isinstance(e, StoreError):
                raise Refused(e.code, f"{what} was rolled back: {e}") from None
            if isinstance(e, SwitchError):
                log.warning("%s rolled back: %s", what, e)
            else:
                log.exception("%s failed; its change was rolled back", what)
            raise Refused(grpc.StatusCode.ABORTED, f"{what} failed and was rolled back: {e}") from None

    # -- job calls ---------------------------------------------------------------------------

    def authenticate(self, job_id: int, token: str) -> Job:
        """The job ``job_id`` if ``token`` is its token (``jobs.authenticated``); a job lost
        with the database (``_check_switches``) is refused with why it is gone (its ranks fail
        at once with that reason)."""
        if job_id in self.lost and job_id not in self.jobs:
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, self.lost[job_id])
        return authenticated(self.jobs, job_id, token)

    def admin(self, token: str) -> None:
        if not self.config.admin_token or not hmac.compare_digest(
                self.config.admin_token.encode(), token.encode()[:MAX_TOKEN_CHARS]):
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, "wrong admin token")

    def create_job(self, n_workers: int, bytes_per_iteration: int, iteration_seconds: float,
                   name: str, transport: str = "", host_only: bool = False,
                   nonce: str = "") -> tuple[int, str]:
        """A new job: placed when its last rank joins, on a switch that has every rank as a host
        (unless ``host_only``: a job's host lane, which the ``inagg`` backend opens beside a job
        on a switch so that each call may take either aggregator) or else on the host
        aggregator. ``nonce``: its launch's (``jobs.check_nonce``), carried by every grant."""
        transport = transport or "udp"
        try:
            seconds = check_demand(n_workers, MAX_WORKERS, bytes_per_iteration, iteration_seconds)
            check_text("name", name, MAX_NAME_CHARS)
            check_text("nonce", nonce, MAX_NONCE_CHARS)
            if transport not in ENCAPSULATIONS:
                raise ValueError(f"transport must be one of {', '.join(ENCAPSULATIONS)}, got {transport[:40]!r}")
        except ValueError as e:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        demand = Demand(n_workers, bytes_per_iteration, seconds)
        with self.lock:
            if len(self.jobs) >= self.config.max_jobs:
                raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"the controller holds {len(self.jobs)} jobs, its limit (max_jobs)")
            job_id = self.store.next_job_id(self.id_floor)
            self.fabric.keep_id_mark(job_id + 1)
            token = secrets.token_hex(16)
            self.store.create_job(job_id, name, token, demand, transport, host_only, nonce)
            self.jobs[job_id] = Job(job_id, name, token, demand, transport=transport, host_only=host_only,
                                    nonce=nonce)
            self._publish_listing()
        log.info("job %d created (%d workers%s)", job_id, n_workers, ", host only" if host_only else "")
        return job_id, token

    def join(self, job_id: int, token: str, rank: int, address: str, mac: str, qp: int = 0,
             rkey: int = 0, nonce: str = "") -> Job:
        """Rank ``rank`` joins with its endpoint and its launch's nonce (one that is not the
        job's is refused: ``check_nonce``); the last rank to join places the job."""
        member = Member(address, mac, qp, rkey)
        with self.lock:
            job = running(self.authenticate(job_id, token))
            check_nonce(job, rank, nonce)
            try:
                check_member(job, rank, member)
            except ValueError as e:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
            before = job.workers.get(rank)
            if job.place is not None and before is not None and before.address != address:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION,
                              f"job {job_id} is placed already; rank {rank} cannot move "
                              f"from {before.address} to {address}")
            with self._change(f"join of job {job_id} rank {rank}"):
                job = self.jobs[job_id]
                job.workers[rank] = member
                job.rank_seen[rank] = time.monotonic()
                job.left.discard(rank)
                if job.place is None and len(job.workers) == job.demand.n_workers:
                    self.fabric.place(job)
                    job.rank_seen = dict.fromkeys(job.workers, time.monotonic())
            self.store.add_worker(job_id, rank, member)
            return job

    def grants(self, job: Job, rank: int | None = None) -> list[pb.Grant]:
        """The job's active grant, and its pending one if any; on a tree, rank ``rank``'s
        (``grants.grants``)."""
        return grants.grants(self.fabric, job, rank)

    def activate(self, job_id: int, token: str, epoch: int, boundary: int,
                 rank: int | None) -> tuple[bool, pb.Grant, int]:
        """Rank ``rank`` finished the call before ``boundary`` and asks to use pending grant
        ``epoch`` from there on. Returns (activated, the grant to use, ranks still to ask).

        The change is decided only once every rank has asked: a rank asks only after it has
        every result of the call before the boundary, so no rank can still need a resend in the
        old epoch when the switch is reprogrammed (deciding at the first ask stalled a rank whose
        last result was lost: its resend carried an epoch the switch no longer had). Until then
        the answer is "not yet" with the number of ranks missing, and the rank asks again. The
        decision is stored, so every rank gets the same answer, also after a restart."""
        with self.lock:
            job = running(self.authenticate(job_id, token))
            if job.place is None:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"job {job_id} has no grant yet")
            if not 0 <= boundary < 1 << 63:   # stored as an SQLite INTEGER
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"boundary {boundary} is not below 2^63")
            if rank is None:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                              "an activation names the asking rank (a grant changes once every rank asked)")
            check_rank(job, rank)
            decided = self.store.activation(job_id, epoch, boundary)
            if decided is None:
                asked = job.activation_asks.setdefault((epoch, boundary), set())
                asked.add(rank)
                missing = job.demand.n_workers - len(asked)
                if missing > 0:
                    return False, self.grants(job, rank)[0], missing
                del job.activation_asks[(epoch, boundary)]
                decided = self._decide_activation(job, epoch, boundary)
            return decided, self.grants(self.jobs[job_id], rank)[0], 0

    def _decide_activation(self, job: Job, epoch: int, boundary: int) -> bool:
        """Every rank asked: activate pending grant ``epoch`` if it still is the pending one,
        and store the decision."""
        allocator = self.fabric.allocators[job.place]
        before = allocator.jobs[job.job_id].active
        with self._change(f"activation of job {job.job_id} epoch {epoch}"):
            decided = allocator.activate(job.job_id, epoch)
        self.store.record_activation(job.job_id, epoch, boundary, decided)
        if decided:
            now = allocator.jobs[job.job_id].active
            log.info("job %d epoch %d active at boundary %d: %s (%s, was %s)", job.job_id, epoch, boundary,
                     now.describe(), _move_name(before, now), before.describe())
        return decided

    def stalled(self, job_id: int, token: str, epoch: int, boundary: int, rank: int,
                why: str) -> tuple[pb.Grant, int]:
        """Rank ``rank``'s call before ``boundary`` made no progress in grant ``epoch`` (``why``:
        its words). Returns (the grant to run the call again on, ranks still to report).

        The job moves once every rank reported the same stalled call, as an activation does:
        a stalled round holds every rank, so none can still use the old epoch. The first move
        at a boundary is a fresh epoch on the same slots (every aggregator resets a slot whose
        owner's epoch changed); a second at that boundary, the stall having survived it, moves
        the job to the host aggregator; a third, or ranks stalled in different calls (one that
        finished a call cannot contribute to it again), fail the job naming what was tried.
        A rank asking about an epoch the job left gets its grant now."""
        with self.lock:
            job = running(self.authenticate(job_id, token))
            check_rank(job, rank)
            if job.place is None:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"job {job_id} has no grant yet")
            if job.tree is not None:
                self._fail_stall(job, f"its call at boundary {boundary} stalled on its {job.tree.describe()}, "
                                      f"whose parts are fixed: a stall does not move it ({why})")
            active = self.fabric.allocators[job.place].jobs[job_id].active
            if epoch > active.epoch:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"job {job_id} has no epoch {epoch} yet (its "
                                                                f"grant is at {active.epoch}): report the epoch the call ran in")
            if epoch < active.epoch:   # the job left that epoch: its reports are moot
                job.stall_asks.pop(epoch, None)
                return self.grants(job, rank)[0], 0
            asks = job.stall_asks.setdefault(epoch, {})
            asks[rank] = boundary
            if len(set(asks.values())) > 1:
                self._fail_stall(job, f"its ranks stalled in different calls ({_calls(asks)}) of epoch {epoch}: "
                                      f"a rank that finished a call cannot send it again ({why})")
            if len(asks) < job.demand.n_workers:
                return self.grants(job, rank)[0], job.demand.n_workers - len(asks)
            del job.stall_asks[epoch]
            self._move_stalled(job, active, boundary, why)
            return self.grants(self.jobs[job_id], rank)[0], 0

    def _move_stalled(self, job: Job, active: Placement, boundary: int, why: str) -> None:
        """Every rank reported the stall: move the job (``stalled``) or fail it."""
        moves = job.stall_moves.get(boundary, 0)
        to_host = moves == 1 and active.mode == SWITCH
        if moves and not to_host:
            tried = "a fresh epoch and the host aggregator" if moves > 1 else "a fresh epoch"
            self._fail_stall(job, f"the call at boundary {boundary} stalled again on {active.describe()} "
                                  f"epoch {active.epoch} after {tried} ({why})")
        allocator = self.fabric.allocators[job.place]
        with self._change(f"stall move of job {job.job_id} epoch {active.epoch}"):
            moved = self.jobs[job.job_id]
            moved.stall_moves[boundary] = moves + 1
            if to_host:
                moved.stall_reason = (f"the stall at boundary {boundary} came back on a fresh epoch of "
                                      f"{active.describe()} ({why}); the job stays on the host aggregator")
            now = allocator.restart(job.job_id, to_host)
        log.warning("job %d: the call at boundary %d stalled on %s epoch %d (%s): now %s epoch %d", job.job_id,
                    boundary, active.describe(), active.epoch, why, now.describe(), now.epoch)

    def _fail_stall(self, job: Job, why: str) -> None:
        """A stall that no move can end: fail the job (its ranks raise ``why``) and refuse."""
        self.fail(job.job_id, why)
        raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"job {job.job_id} failed: {why}")

    def heartbeat(self, job_id: int, token: str, rank: int | None) -> None:
        """Renew the job's lease and rank ``rank``'s, without the lock: a beat never waits
        behind a placement. It only assigns times of a job and a rank that exist (no dict
        grows under a transaction's copy), and a rollback keeps them (``_keep_leases``)."""
        job = running(self.authenticate(job_id, token))
        if rank is not None:
            check_rank(job, rank)
            if rank in job.rank_seen:
                job.rank_seen[rank] = time.monotonic()

    def leave(self, job_id: int, rank: int | None = None) -> None:
        """The job ends (``rank`` None: its lease expired, or the operator's call), or rank
        ``rank`` is done: it is watched no more, and the job ends when every rank is done."""
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                return
            if rank is not None:
                check_rank(job, rank)
                job.left.add(rank)
                if len(job.left) < job.demand.n_workers:
                    return
            with self._change(f"end of job {job_id}", durable=False):
                self.fabric.remove(self.jobs.pop(job_id))
            log.info("job %d left", job_id)

    def fail(self, job_id: int, why: str) -> None:
        """Mark a job failed: its slots return to the pool, its ranks learn ``why`` on their
        grant stream; the job itself goes when its lease expires (its ranks stop renewing it)."""
        with self.lock:
            if job_id not in self.jobs or self.jobs[job_id].failure:
                return
            with self._change(f"failure of job {job_id}", durable=False):
                job = self.jobs[job_id]
                job.failure = why
                self.fabric.remove(job)
            log.warning("job %d failed: %s", job_id, why)

    @property
    def lease_check_seconds(self) -> float:
        """How often the lease thread looks: an eighth of the shorter lease (50 ms at least)."""
        return max(min(self.config.lease_seconds, self.config.rank_lease_seconds) / 8, 0.05)

    def expire_leases(self, stall: float = 0.0) -> list[int]:
        """End jobs whose lease ran out; fail jobs one of whose ranks stopped. ``stall``: how
        much later than its period the lease thread looks (the controller was not scheduled):
        every lease clock stops for that long first (``pause_leases``), so a controller that was
        stopped or starved never fails a rank whose beats wait in its queue; a dead rank is still
        named after a lease of the controller's own running time. Each job on its own: one that
        cannot be handled is logged and never stops the others. First, what the database
        refused before is saved if it takes writes again."""
        self._save_if_behind()
        now = time.monotonic()
        with self.lock:
            jobs = list(self.jobs.values())
        gone = []
        for job in jobs:
            try:
                if stall > 0:
                    pause_leases(job, stall, now)
                if now - job.last_seen > self.config.lease_seconds:
                    log.warning("job %d lease expired", job.job_id)
                    self.leave(job.job_id)
                    gone.append(job.job_id)
                elif why := silence(job, now, self.config.rank_lease_seconds):
                    self.fail(job.job_id, why)
            except Exception:  # noqa: BLE001 - logged; the next round tries again
                log.exception("lease handling of job %d failed", job.job_id)
        return gone

    # -- operator calls ----------------------------------------------------------------------

    def drain(self, job_id: int) -> pb.Grant:
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                raise Refused(grpc.StatusCode.NOT_FOUND, f"no job {job_id}")
            if job.place is None or job.failure:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION,
                              f"job {job_id} is not placed (not every rank joined, or it failed)")
            if job.tree is not None:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION,
                              f"job {job_id} runs on its {job.tree.describe()}: a tree is not "
                              f"drained (its parts are fixed); ReleaseJob ends it")
            with self._change(f"drain of job {job_id}"):
                p = self.fabric.allocators[job.place].drain(job_id)
            job = self.jobs[job_id]
            active = self.fabric.allocators[job.place].jobs[job_id].active
            return grants.grant(self.fabric, job, p, p.epoch != active.epoch, job.place)

    def release(self, job_id: int) -> None:
        """The operator ends a job: its slots free at once and its ranks are told, as a failure
        "ended by the operator", so their calls fail at once (a job that failed already goes)."""
        with self.lock:
            if job_id not in self.jobs:
                raise Refused(grpc.StatusCode.NOT_FOUND, f"no job {job_id}")
            if self.jobs[job_id].failure:
                self.leave(job_id)
            else:
                self.fail(job_id, "ended by the operator (ReleaseJob)")

    def host_jobs(self) -> pb.HostJobs:
        with self.lock:
            return grants.host_jobs(self.fabric, self.jobs.values())

    def list_jobs(self) -> pb.JobList:
        """Every job as of the last change (``_publish_listing``), without the lock: a listing
        never waits behind a placement; the switches' counters (the jobs' and the recirculation
        ports') are read now."""
        published, on_switches = self._listing
        listing = pb.JobList()
        listing.CopyFrom(published)    # the published one is shared by every reader: never changed
        for on in on_switches:
            grants.add_counters(listing.jobs[on.entry], self.fabric, on)
        grants.add_recirculation(listing, self.fabric)
        return listing

    # -- switch keeper -----------------------------------------------------------------------

    def keep_switch(self, name: str) -> None:
        """Re-program switch ``name`` when its session broke (restart), its pipeline is not
        ours any more or another primary was elected, and audit it every
        ``switch_audit_seconds``; called by the keeper thread."""
        self.fabric.reconnect(name, self.lock)
        with self.lock:
            if self.fabric.reprogram(name, self.jobs, self.config.switch_audit_seconds):
                self._announce()

    def close(self) -> None:
        """Stop: the grant and host-job watchers end now (a server stopping waits out its grace
        for the streams still open), then the switch sessions close."""
        self.stopped.set()
        with self.lock:
            self.changed.notify_all()
            self.fabric.close()


def _move_name(before: Placement, after: Placement) -> str:
    """What an activation did to a job's place: upgrade (host aggregator to switch), drain
    (switch to host aggregator), grow, shrink or move (on the switch), or same place."""
    if before.mode != after.mode:
        return "upgrade" if after.mode == SWITCH else "drain"
    if after.same_place(before) or after.mode != SWITCH:
        return "same place"
    if after.slot_base == before.slot_base:
        return "grow" if after.slot_count > before.slot_count else "shrink"
    return "move"


def _calls(asks: dict[int, int]) -> str:
    """Which rank stalled at which boundary, in words."""
    return ", ".join(f"rank {r} at boundary {b}" for r, b in sorted(asks.items()))


def _keep_leases(saved: dict[int, Job], current: dict[int, Job]) -> dict[int, Job]:
    """``saved`` (a transaction's copy, being restored) with the lease times of ``current``:
    heartbeats renewed during the transaction stand."""
    for job_id, job in saved.items():
        if job_id in current:
            job.last_seen = current[job_id].last_seen
            job.rank_seen.update((r, t) for r, t in current[job_id].rank_seen.items() if r in job.rank_seen)
    return saved
