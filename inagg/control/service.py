"""The controller: job registry, allocation, switch/host-aggregator programming, gRPC service.

State changes go through one lock and are transactions (``Controller._change``): the new state
is computed, applied to the switches, then persisted; when any step fails (a switch refuses or is
unreachable) the in-memory state is restored and the switches re-synced, so one job's failure
never half-applies and never blocks another job. A switch is *reconciled* whenever its desired
entries change: the desired table entries and multicast groups are computed from the allocator's
active grants and diffed against what the switch reports by Read, so a restarted controller
converges to the same state from the SQLite store, and a restarted switch (its stream channel
breaks, or its pipeline is gone) is re-programmed by the keeper thread (``SwitchKeeper``).

Liveness: every rank renews its own lease (Heartbeat with its rank). When one rank of a placed job
is silent for ``rank_lease_seconds`` the job fails: its slots return to the pool and its
surviving ranks get a grant whose ``failure`` names the silent rank(s).
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
from concurrent import futures
from dataclasses import dataclass, field
from typing import NamedTuple

import grpc

from inagg.wire.grant import parse_address
from inagg.wire.protocol import ENCAPSULATIONS, MAX_WORKERS

from inagg.control.allocator import HOST, SWITCH, Demand, Placement, SlotAllocator
from inagg.control.config import ControllerConfig
from inagg.jobservice.credentials import is_unix, server_credentials
from inagg.jobservice.proto import inagg_controller_pb2 as pb
from inagg.jobservice.proto import inagg_controller_pb2_grpc as pb_grpc
from inagg.control.runtime import SwitchCapacity, SwitchRuntime
from inagg.control.store import Store, state_from_json
from inagg.control.switch import JobCounters, SwitchError, SwitchJob, WorkerBinding
from inagg.control.validation import MAX_NAME_CHARS, MAX_TOKEN_CHARS, check_address, check_demand, check_mac, check_text

log = logging.getLogger("inagg.controller")
# Largest request the job service reads: every valid one is far smaller.
MAX_REQUEST_BYTES = 64 << 10


class Refused(Exception):
    """A request the service refuses, with the gRPC code to answer."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class Member(NamedTuple):
    """A worker that joined: its UDP endpoint "ip:port", MAC, and RoCE QP/rkey (RoCE jobs)."""

    address: str
    mac: str
    qp: int = 0
    rkey: int = 0


@dataclass
class Job:
    job_id: int
    name: str
    token: str
    demand: Demand
    workers: dict[int, Member] = field(default_factory=dict)  # by rank
    transport: str = "udp"            # the switch encapsulation: "udp" or "roce"
    host_only: bool = False           # asked for the host aggregator only (a switch job's host lane)
    place: str | None = None          # switch name, or "" for host-only; None before placement
    job_index: int | None = None
    last_seen: float = field(default_factory=time.monotonic)
    rank_seen: dict[int, float] = field(default_factory=dict)  # last heartbeat of each rank
    left: set[int] = field(default_factory=set)                 # ranks that left cleanly
    failure: str = ""                                            # why it failed; "" while it runs
    # ranks that asked to activate (epoch, boundary), not decided yet (Controller.activate)
    activation_asks: dict[tuple[int, int], set[int]] = field(default_factory=dict)


class Controller:
    """All controller state; the gRPC servicer below is a thin layer over it."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.version = 0
        self.store = Store(config.database)
        n = len(config.switches) + 1
        share = config.host_slots // n
        self.allocators: dict[str, SlotAllocator] = {}
        self.switches: dict[str, SwitchRuntime] = {}
        for i, cfg in enumerate(config.switches):
            # the pool, rows and K are the switch's program's, read from its P4Info
            p4info = cfg.program.p4info
            cap = SwitchCapacity.from_p4info(p4info)
            alloc = SlotAllocator(cap.slots, config.min_window, p4info.values_per_packet, share,
                                  config.host_window, share * i, max_jobs=cap.job_rows,
                                  max_job_workers=cap.job_workers, worker_entries=cap.worker_entries)
            self.allocators[cfg.name] = alloc
            self.switches[cfg.name] = SwitchRuntime(cfg, alloc, p4info)
        # jobs whose workers sit on no configured switch aggregate on the host aggregator only
        self.allocators[""] = SlotAllocator(0, config.min_window, config.host_values_per_packet, share,
                                            config.host_window, share * (n - 1))
        self.jobs: dict[int, Job] = {}
        self.stopped = threading.Event()
        self._restore()
        with self.lock:
            self._sync()

    # -- persistence -------------------------------------------------------------------------

    def _restore(self) -> None:
        for row in self.store.jobs():
            raw = json.loads(row["state"])
            demand = Demand(**raw["demand"])
            job = Job(row["job_id"], row["name"], row["token"], demand,
                      {r: Member(*w) for r, *w in row["workers"]}, transport=row["transport"],
                      host_only=row["host_only"], place=row["switch"], job_index=row["job_index"])
            job.rank_seen = dict.fromkeys(job.workers, time.monotonic())
            self.jobs[job.job_id] = job
            if "active" in raw and job.place is not None:
                self.allocators[job.place].restore_job(state_from_json(row["state"]))
        log.info("restored %d job(s)", len(self.jobs))

    def _persist(self, job: Job) -> None:
        alloc = self.allocators.get(job.place) if job.place is not None else None
        if alloc is not None and job.job_id in alloc.jobs:
            self.store.save_state(alloc.jobs[job.job_id], job.place, job.job_index)

    # -- programming -------------------------------------------------------------------------

    def _switch_job(self, job: Job, sw: SwitchRuntime, p: Placement) -> SwitchJob:
        bindings = []
        for rank, m in sorted(job.workers.items()):
            ip, udp_port = parse_address(m.address)
            host = sw.cfg.hosts[ip]
            bindings.append(WorkerBinding(rank, sw.cfg.device_port(host.port), ip, host.mac or m.mac,
                                          udp_port, m.qp, m.rkey))
        return SwitchJob(job.job_id, job.job_index, p.epoch, p.slot_base, p.slot_count, tuple(bindings),
                         job.transport)

    def _switch_jobs(self, name: str) -> list[SwitchJob]:
        """The jobs switch ``name`` should hold now, each with a job row (counter index)."""
        alloc = self.allocators[name]
        on_switch = [j for j in sorted(self.jobs.values(), key=lambda j: j.job_id)
                     if j.place == name and j.job_id in alloc.jobs and alloc.jobs[j.job_id].active.mode == SWITCH]
        for job in self.jobs.values():   # a job off the switch gives its counter row back
            if job.place == name and job not in on_switch:
                job.job_index = None
        used = {j.job_index for j in on_switch}
        for job in on_switch:
            if job.job_index is None:
                free = set(range(self.switches[name].capacity.job_rows)) - used
                if not free:  # the allocator admits no more jobs than rows: a bug if reached
                    raise RuntimeError(f"switch {name}: no free job row for job {job.job_id}")
                job.job_index = min(free)
                used.add(job.job_index)
        return [self._switch_job(j, self.switches[name], alloc.jobs[j.job_id].active) for j in on_switch]

    def _sync(self, *, force: bool = False) -> None:
        """Called with the lock held after any change: job rows, switches whose entries changed,
        store, watchers. Raises when a switch refuses. ``force`` (after a rollback): program
        every switch, logging the ones that fail (the keeper retries them)."""
        for name, sw in self.switches.items():
            jobs = self._switch_jobs(name)
            if jobs == sw.wanted and not force:
                continue           # unchanged; a switch that is down is the keeper's
            try:
                sw.program(jobs)
            except SwitchError as e:
                if not force:
                    raise
                log.warning("switch %s: %s (the keeper retries)", name, e)
        for job in self.jobs.values():
            self._persist(job)
        self.version += 1
        self.changed.notify_all()

    @contextlib.contextmanager
    def _change(self, what: str):
        """A transaction over the jobs and allocators (lock held): the body changes them, then
        the switches are synced; on any error both are restored and the switches re-synced, so
        nothing is half applied. Errors other than ``Refused`` are answered ABORTED."""
        saved = copy.deepcopy((self.jobs, {n: (a.jobs, a._arrivals) for n, a in self.allocators.items()}))
        try:
            yield
            self._sync()
        except BaseException as e:
            self.jobs = saved[0]
            for n, (jobs, arrivals) in saved[1].items():
                self.allocators[n].jobs, self.allocators[n]._arrivals = jobs, arrivals
            self._sync(force=True)
            if isinstance(e, Refused) or not isinstance(e, Exception):
                raise
            if isinstance(e, SwitchError):
                log.warning("%s rolled back: %s", what, e)
            else:
                log.exception("%s failed; its change was rolled back", what)
            raise Refused(grpc.StatusCode.ABORTED, f"{what} failed and was rolled back: {e}") from None

    # -- job calls ---------------------------------------------------------------------------

    def _job(self, job_id: int, token: str) -> Job:
        """The job ``job_id`` if ``token`` is its token; one answer for an unknown job and a wrong
        token, so outsiders cannot probe which job ids exist."""
        job = self.jobs.get(job_id)
        if job is None or not hmac.compare_digest(job.token.encode(), token.encode()[:MAX_TOKEN_CHARS]):
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"job {job_id}: unknown job or wrong token")
        return job

    def _running(self, job: Job) -> Job:
        """``job`` if it has not failed; renews its lease."""
        if job.failure:
            raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"job {job.job_id} failed: {job.failure}")
        job.last_seen = time.monotonic()
        return job

    def admin(self, token: str) -> None:
        if not self.config.admin_token or not hmac.compare_digest(
                self.config.admin_token.encode(), token.encode()[:MAX_TOKEN_CHARS]):
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, "wrong admin token")

    def create_job(self, n_workers: int, bytes_per_iteration: int, iteration_seconds: float,
                   name: str, transport: str = "", host_only: bool = False) -> tuple[int, str]:
        """A new job: placed when its last rank joins, on a switch that has every rank as a host
        (unless ``host_only``: a job's host lane, which the ``inagg`` backend opens beside a job
        on a switch so that each call may take either aggregator) or else on the host
        aggregator."""
        transport = transport or "udp"
        try:
            seconds = check_demand(n_workers, MAX_WORKERS, bytes_per_iteration, iteration_seconds)
            check_text("name", name, MAX_NAME_CHARS)
            if transport not in ENCAPSULATIONS:
                raise ValueError(f"transport must be one of {', '.join(ENCAPSULATIONS)}, got {transport[:40]!r}")
        except ValueError as e:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
        demand = Demand(n_workers, bytes_per_iteration, seconds)
        with self.lock:
            if len(self.jobs) >= self.config.max_jobs:
                raise Refused(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"the controller holds {len(self.jobs)} jobs, its limit (max_jobs)")
            job_id = self.store.next_job_id()
            token = secrets.token_hex(16)
            self.store.create_job(job_id, name, token, demand, transport, host_only)
            self.jobs[job_id] = Job(job_id, name, token, demand, transport=transport, host_only=host_only)
        log.info("job %d created (%d workers%s)", job_id, n_workers, ", host only" if host_only else "")
        return job_id, token

    def _check_member(self, job: Job, rank: int, member: Member) -> None:
        """A joining rank's fields, and its address against the job's other ranks."""
        if not 0 <= rank < job.demand.n_workers:
            raise ValueError(f"rank {rank} not in 0..{job.demand.n_workers - 1}")
        check_address(member.address)
        check_mac(member.mac)
        if job.transport == "roce" and not 1 <= member.qp <= 0xFFFFFF:
            raise ValueError(f"job {job.job_id} uses RoCEv2: rank {rank} must give its QP (1..2^24-1), "
                             f"got {member.qp}")
        if job.transport != "roce" and (member.qp or member.rkey):
            raise ValueError(f"job {job.job_id} uses {job.transport}, not RoCEv2: rank {rank} gave a QP/rkey")
        host = parse_address(member.address)[0]
        for other, m in job.workers.items():
            if other != rank and m.address == member.address:
                raise ValueError(f"job {job.job_id}: rank {rank}'s address {member.address} is rank "
                                 f"{other}'s already (each rank needs its own UDP port)")
            if other != rank and job.transport == "roce" and parse_address(m.address)[0] == host:
                raise ValueError(f"job {job.job_id} uses RoCEv2: rank {rank} shares IP {host} with rank "
                                 f"{other}; the switch tells RoCEv2 ranks apart by IP (their UDP "
                                 f"source port is the flow label's), so each needs its own")

    def join(self, job_id: int, token: str, rank: int, address: str, mac: str, qp: int = 0,
             rkey: int = 0) -> Job:
        member = Member(address, mac, qp, rkey)
        with self.lock:
            job = self._running(self._job(job_id, token))
            try:
                self._check_member(job, rank, member)
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
                    self._place(job)
            self.store.add_worker(job_id, rank, member)
            return job

    def _place(self, job: Job) -> None:
        ips = {parse_address(m.address)[0] for m in job.workers.values()}
        job.place = "" if job.host_only else next(
            (name for name, sw in self.switches.items() if ips <= set(sw.cfg.hosts)
             and job.transport in sw.sw.p4info.encapsulations), "")
        self.allocators[job.place].add_job(job.job_id, job.demand)
        job.rank_seen = dict.fromkeys(job.workers, time.monotonic())
        log.info("job %d placed on %s", job.job_id, job.place or "host only")

    def grants(self, job: Job) -> list[pb.Grant]:
        """The job's active grant, and its pending one if any (empty before placement); a
        failed job's one grant carries only the failure."""
        if job.failure:
            return [pb.Grant(job_id=job.job_id, failure=job.failure)]
        if job.place is None:
            return []
        state = self.allocators[job.place].jobs[job.job_id]
        out = [self._grant(job, state.active, False)]
        if state.pending:
            out.append(self._grant(job, state.pending, True))
        return out

    def _grant(self, job: Job, p: Placement, pending: bool) -> pb.Grant:
        if p.mode == SWITCH:
            sw = self.switches[job.place]
            aggregator, k = sw.cfg.aggregator, sw.sw.p4info.values_per_packet
        else:
            aggregator, k = self.config.host_aggregator, self.config.host_values_per_packet
        return pb.Grant(job_id=job.job_id, epoch=p.epoch, mode=p.mode, slot_base=p.slot_base,
                        slot_count=p.slot_count, values_per_packet=k, aggregator=aggregator,
                        pending=pending, transport=job.transport if p.mode == SWITCH else "udp",
                        reason="" if p.mode == SWITCH else self._host_reason(job))

    def _host_reason(self, job: Job) -> str:
        """Why a job aggregates on the host aggregator, in words its workers log."""
        if job.host_only:
            return "the job asked for the host aggregator (a host lane beside a job on a switch)"
        if job.place:
            return (f"switch {job.place} has no free slots for it (or an operator drained it); "
                    f"it moves to the switch when slots free up")
        ips = sorted({parse_address(m.address)[0] for m in job.workers.values()})
        known = {ip for sw in self.switches.values() for ip in sw.cfg.hosts}
        strangers = [ip for ip in ips if ip not in known]
        if strangers:
            return (f"worker address(es) {', '.join(strangers)} are not hosts of any switch in the "
                    f"controller's config")
        return "its workers are attached to different switches (aggregation is one level)"

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
            job = self._running(self._job(job_id, token))
            if job.place is None:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"job {job_id} has no grant yet")
            if not 0 <= boundary < 1 << 63:   # stored as an SQLite INTEGER
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"boundary {boundary} is not below 2^63")
            if rank is None:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                              "an activation names the asking rank (a grant changes once every rank asked)")
            self._check_rank(job, rank)
            decided = self.store.activation(job_id, epoch, boundary)
            if decided is None:
                asked = job.activation_asks.setdefault((epoch, boundary), set())
                asked.add(rank)
                missing = job.demand.n_workers - len(asked)
                if missing > 0:
                    return False, self.grants(job)[0], missing
                del job.activation_asks[(epoch, boundary)]
                with self._change(f"activation of job {job_id} epoch {epoch}"):
                    decided = self.allocators[job.place].activate(job_id, epoch)
                self.store.record_activation(job_id, epoch, boundary, decided)
                if decided:
                    log.info("job %d activated epoch %d at boundary %d", job_id, epoch, boundary)
            return decided, self.grants(self.jobs[job_id])[0], 0

    @staticmethod
    def _check_rank(job: Job, rank: int) -> None:
        if not 0 <= rank < job.demand.n_workers:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"rank {rank} not in 0..{job.demand.n_workers - 1}")

    def heartbeat(self, job_id: int, token: str, rank: int | None) -> None:
        with self.lock:
            job = self._running(self._job(job_id, token))
            if rank is not None:
                self._check_rank(job, rank)
                job.rank_seen[rank] = time.monotonic()

    def leave(self, job_id: int, rank: int | None = None) -> None:
        """The job ends (``rank`` None), or rank ``rank`` is done: it is watched no more, and the
        job ends when every rank is done."""
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                return
            if rank is not None:
                self._check_rank(job, rank)
                job.left.add(rank)
                if len(job.left) < job.demand.n_workers:
                    return
            with self._change(f"end of job {job_id}"):
                job = self.jobs.pop(job_id)
                if job.place is not None and job.job_id in self.allocators[job.place].jobs:
                    self.allocators[job.place].remove_job(job_id)
            self.store.delete_job(job_id)
            log.info("job %d left", job_id)

    def fail(self, job_id: int, why: str) -> None:
        """Mark a job failed: its slots return to the pool, its ranks learn ``why`` on their
        grant stream; the job itself goes when its lease expires (its ranks stop renewing it)."""
        with self.lock:
            if job_id not in self.jobs or self.jobs[job_id].failure:
                return
            with self._change(f"failure of job {job_id}"):
                job = self.jobs[job_id]
                job.failure = why
                if job.place is not None and job.job_id in self.allocators[job.place].jobs:
                    self.allocators[job.place].remove_job(job_id)
            self.store.delete_job(job_id)
            log.warning("job %d failed: %s", job_id, why)

    def silent_ranks(self, job: Job, now: float) -> list[int]:
        """Ranks of a running, placed job whose lease ran out."""
        if job.failure or job.place is None:
            return []
        return sorted(r for r, seen in job.rank_seen.items()
                      if r not in job.left and now - seen > self.config.rank_lease_seconds)

    def expire_leases(self) -> list[int]:
        """End jobs whose lease ran out; fail jobs one of whose ranks stopped. Each job on its
        own: one that cannot be handled is logged and never stops the others."""
        now = time.monotonic()
        with self.lock:
            jobs = list(self.jobs.values())
        gone = []
        for job in jobs:
            try:
                if now - job.last_seen > self.config.lease_seconds:
                    log.warning("job %d lease expired", job.job_id)
                    self.leave(job.job_id)
                    gone.append(job.job_id)
                elif silent := self.silent_ranks(job, now):
                    names = ", ".join(f"rank {r} ({job.workers[r].address})" for r in silent)
                    self.fail(job.job_id, f"{names} stopped: no heartbeat for more than "
                                          f"{self.config.rank_lease_seconds:g}s")
            except Exception:  # noqa: BLE001 - logged; the next round tries again
                log.exception("lease handling of job %d failed", job.job_id)
        return gone

    def drain(self, job_id: int) -> pb.Grant:
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                raise Refused(grpc.StatusCode.NOT_FOUND, f"no job {job_id}")
            if job.place is None or job.failure:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION,
                              f"job {job_id} is not placed (not every rank joined, or it failed)")
            with self._change(f"drain of job {job_id}"):
                p = self.allocators[job.place].drain(job_id)
            job = self.jobs[job_id]
            return self._grant(job, p, p.epoch != self.allocators[job.place].jobs[job_id].active.epoch)

    def release(self, job_id: int) -> None:
        with self.lock:
            if job_id not in self.jobs:
                raise Refused(grpc.StatusCode.NOT_FOUND, f"no job {job_id}")
            self.leave(job_id)

    def host_jobs(self) -> pb.HostJobs:
        out = pb.HostJobs()
        with self.lock:
            for job in sorted(self.jobs.values(), key=lambda j: j.job_id):
                if job.place is None or job.failure:
                    continue
                p = self.allocators[job.place].jobs[job.job_id].active
                if p.mode == HOST:
                    out.jobs.add(job_id=job.job_id, epoch=p.epoch, slot_base=p.slot_base,
                                 slot_count=p.slot_count,
                                 workers=[job.workers[r].address for r in sorted(job.workers)])
        return out

    def list_jobs(self) -> pb.JobList:
        out = pb.JobList()
        with self.lock:
            for job in sorted(self.jobs.values(), key=lambda j: j.job_id):
                info = out.jobs.add(job_id=job.job_id, name=job.name, n_workers=job.demand.n_workers,
                                    joined=len(job.workers), failure=job.failure)
                grants = [] if job.failure else self.grants(job)
                if grants:
                    info.active.CopyFrom(grants[0])
                if len(grants) > 1:
                    info.pending.CopyFrom(grants[1])
                if grants and grants[0].mode == SWITCH and job.job_index is not None:
                    sw = self.switches[job.place]
                    try:
                        c = JobCounters(sw.sw).job(job.job_index)
                    except SwitchError as e:  # a switch being restarted: the listing still answers
                        log.warning("counters of job %d: %s", job.job_id, e)
                        continue
                    info.counters.update({k: v for k, v in c.items() if k != "drops"})
                    info.counters.update({f"drop_{k}": v for k, v in c["drops"].items()})
                    info.counters["switch_restarts"] = sw.restarts
            out.switch_slots = sum(a.switch_slots for a in self.allocators.values())
        return out

    # -- switch keeper -----------------------------------------------------------------------

    def keep_switch(self, name: str) -> None:
        """Re-program switch ``name`` when its session broke (restart) or its pipeline is not
        ours any more; called by the keeper thread."""
        sw = self.switches[name]
        if sw.sw.lost.is_set():
            log.warning("switch %s: P4Runtime stream lost; reconnecting", name)
            session = sw.reconnect()           # raises while the switch is still down
            with self.lock:
                sw.adopt(session)
        elif sw.sw.restore_pipeline():
            log.warning("switch %s: its pipeline was gone or replaced; pushed ours again", name)
            with self.lock:
                sw.adopt(None)
        with self.lock:
            if sw.applied is None:             # restarted, or a failed sync left it unknown
                sw.program(self._switch_jobs(name))
                self.version += 1
                self.changed.notify_all()
                log.warning("switch %s re-programmed (%d job(s))", name, len(sw.applied))

    def close(self) -> None:
        self.stopped.set()
        with self.lock:
            for sw in self.switches.values():
                sw.sw.close()


def run_forever(name: str, period: float, stopped: threading.Event, step) -> threading.Thread:
    """A daemon thread calling ``step()`` every ``period`` seconds until ``stopped``; an
    exception is logged and the thread goes on (a dead background thread would silently stop
    leases from expiring or switches from being re-programmed)."""
    def loop() -> None:
        while not stopped.wait(period):
            try:
                step()
            except Exception:  # noqa: BLE001 - logged; the next period tries again
                log.exception("%s: step failed", name)

    thread = threading.Thread(target=loop, daemon=True, name=name)
    thread.start()
    return thread


class JobServicer(pb_grpc.JobServiceServicer):
    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl

    def _call(self, context, fn, *args):
        try:
            return fn(*args)
        except Refused as e:
            context.abort(e.code, str(e))

    def CreateJob(self, request, context):
        job_id, token = self._call(context, self.ctl.create_job, request.n_workers,
                                   request.bytes_per_iteration, request.iteration_seconds, request.name,
                                   request.transport, request.host_only)
        return pb.CreateJobReply(job_id=job_id, token=token)

    def JoinJob(self, request, context):
        job = self._call(context, self.ctl.join, request.job_id, request.token, request.rank,
                         request.address, request.mac, request.roce_qp, request.roce_rkey)
        return pb.JoinJobReply(n_workers=job.demand.n_workers, lease_seconds=self.ctl.config.lease_seconds,
                               rank_lease_seconds=self.ctl.config.rank_lease_seconds)

    def WatchGrant(self, request, context):
        ctl = self.ctl
        self._call(context, lambda: ctl._job(request.job_id, request.token))
        sent = None
        while context.is_active():
            with ctl.lock:
                job = ctl.jobs.get(request.job_id)
                if job is None:
                    return
                grants = ctl.grants(job)
                if grants == sent:
                    ctl.changed.wait(timeout=1.0)
                    continue
            sent = grants
            yield from grants

    def ActivateGrant(self, request, context):
        ok, grant, waiting = self._call(context, self.ctl.activate, request.job_id, request.token,
                                        request.epoch, request.boundary,
                                        request.rank if request.HasField("rank") else None)
        return pb.ActivateReply(activated=ok, grant=grant, waiting_for=waiting)

    def Heartbeat(self, request, context):
        self._call(context, self.ctl.heartbeat, request.job_id, request.token,
                   request.rank if request.HasField("rank") else None)
        return pb.HeartbeatReply(lease_seconds=self.ctl.config.lease_seconds,
                                 rank_lease_seconds=self.ctl.config.rank_lease_seconds)

    def LeaveJob(self, request, context):
        self._call(context, lambda: self.ctl._job(request.job_id, request.token))
        self._call(context, self.ctl.leave, request.job_id,
                   request.rank if request.HasField("rank") else None)
        return pb.Empty()

    def WatchHostJobs(self, request, context):
        self._call(context, self.ctl.admin, request.admin_token)
        sent = None
        while context.is_active():
            snapshot = self.ctl.host_jobs()
            if snapshot != sent:
                sent = snapshot
                yield snapshot
            with self.ctl.lock:
                self.ctl.changed.wait(timeout=1.0)

    def ListJobs(self, request, context):
        self._call(context, self.ctl.admin, request.admin_token)
        return self.ctl.list_jobs()

    def DrainJob(self, request, context):
        self._call(context, self.ctl.admin, request.admin_token)
        return self._call(context, self.ctl.drain, request.job_id)

    def ReleaseJob(self, request, context):
        self._call(context, self.ctl.admin, request.admin_token)
        self._call(context, self.ctl.release, request.job_id)
        return pb.Empty()


def add_port(server: grpc.Server, address: str, config: ControllerConfig) -> None:
    """Listen on ``address``: TLS when the config has a certificate; plaintext only on a Unix
    socket or when the config asks for it (``insecure``), as tokens travel in every request."""
    if config.tls_cert:
        port = server.add_secure_port(address, server_credentials(config.tls_cert, config.tls_key))
    elif is_unix(address) or config.insecure:
        port = server.add_insecure_port(address)
    else:
        raise OSError(f"refusing to serve job tokens in plaintext on {address}: give tls_cert and "
                      f"tls_key, listen on a unix: socket, or set insecure (--insecure)")
    if port == 0:
        raise OSError(f"cannot listen on {address}")


def serve(ctl: Controller, address: str) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32),
                         options=[("grpc.max_receive_message_length", MAX_REQUEST_BYTES)])
    pb_grpc.add_JobServiceServicer_to_server(JobServicer(ctl), server)
    add_port(server, address, ctl.config)
    server.start()
    run_forever("leases", max(min(ctl.config.lease_seconds, ctl.config.rank_lease_seconds) / 8, 0.05),
                ctl.stopped, ctl.expire_leases)
    for name in ctl.switches:
        run_forever(f"keeper-{name}", ctl.config.switch_check_seconds, ctl.stopped,
                    lambda name=name: ctl.keep_switch(name))
    return server
