"""The controller: job registry, allocation, switch/host-aggregator programming, gRPC service.

State changes go through one lock. After every change the switch is *reconciled*: the desired
table entries and multicast groups are computed from the allocator's active grants and diffed
against what the switch reports by Read, so a restarted controller (or a restarted switch)
converges to the same state from the SQLite store.
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import grpc

from hostlib.grant import parse_address
from hostlib.protocol import ENCAPSULATIONS, SWITCH_VALUES_PER_PACKET

from .allocator import HOST, SWITCH, Demand, Placement, SlotAllocator
from .config import ControllerConfig, SwitchConfig
from .p4info import BMV2_JSON_PATH, P4INFO_PATH, P4Info
from .proto import inagg_controller_pb2 as pb
from .proto import inagg_controller_pb2_grpc as pb_grpc
from .store import Store, state_from_json
from .switch import (
    DELETE, INSERT, MODIFY, Forwarding, JobAdmission, JobCounters, ReplicaRewrite,
    ResultReplication, SwitchConnection, SwitchJob, WorkerBinding,
)

log = logging.getLogger("inagg.controller")
MAX_JOBS_PER_SWITCH = 64  # INAGG_MAX_JOBS of the P4 program (counter rows)


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
    place: str | None = None          # switch name, or "" for host-only; None before placement
    job_index: int | None = None
    last_seen: float = field(default_factory=time.monotonic)


class SwitchRuntime:
    """One switch: its session, its allocator and the programming of its tables."""

    def __init__(self, cfg: SwitchConfig, allocator: SlotAllocator, p4info: P4Info,
                 program: tuple[str, str] = (str(P4INFO_PATH), str(BMV2_JSON_PATH))) -> None:
        self.cfg = cfg
        self.allocator = allocator
        self.sw = SwitchConnection(cfg.grpc, cfg.device_id, p4info=p4info)
        self.sw.ensure_pipeline(*map(Path, program))

    def desired(self, jobs: list[SwitchJob]):
        """Entries (by table and key) and multicast groups the switch should hold."""
        fwd = Forwarding(self.sw)
        updates = [fwd.host_update(INSERT, h.mac, h.port) for h in self.cfg.hosts.values()]
        updates += fwd.flood_updates(INSERT, self.cfg.ports)
        for job in jobs:
            updates.append(ResultReplication(self.sw).job_update(INSERT, job))
            updates += ReplicaRewrite(self.sw).updates(INSERT, job)
            updates += JobAdmission(self.sw).updates(INSERT, job)
        return updates

    def reconcile(self, jobs: list[SwitchJob]) -> None:
        """Make the switch hold exactly ``desired(jobs)``: insert/modify first (groups, then
        per-worker entries, then job_table), deletions last in reverse order."""
        want = self.desired(jobs)
        have_tables: dict[tuple, tuple] = {}
        for table in ("l2_table", "worker_table", "replica_table", "job_table"):
            for key, action, params in self.sw.table_entries(table):
                have_tables[(table, tuple(sorted(key.items())))] = (action, params)
        have_groups = ResultReplication(self.sw).groups()
        writes, seen_tables, seen_groups = [], set(), set()
        for u in want:
            ent = u.entity
            if ent.HasField("table_entry"):
                table, key_dict, action, params = self.sw.decode_entry(ent.table_entry)
                key, value = tuple(sorted(key_dict.items())), (action, params)
                seen_tables.add((table, key))
                have = have_tables.get((table, key))
                if have != value:
                    u.type = MODIFY if have is not None else INSERT
                    writes.append(u)
            else:
                g = ent.packet_replication_engine_entry.multicast_group_entry
                seen_groups.add(g.multicast_group_id)
                replicas = [(r.egress_port, r.instance) for r in g.replicas]
                have = have_groups.get(g.multicast_group_id)
                if have is None or sorted(have) != sorted(replicas):
                    u.type = MODIFY if have is not None else INSERT
                    writes.append(u)
        order = {"job_table": 0, "replica_table": 1, "worker_table": 1, "l2_table": 2}
        stale = sorted((k for k in have_tables if k not in seen_tables), key=lambda k: order[k[0]])
        for table, key in stale:
            writes.append(self.sw.table_update(DELETE, table, dict(key)))
        for gid in have_groups:
            if gid not in seen_groups:
                writes.append(ResultReplication(self.sw).update(DELETE, gid, []))
        self.sw.write(writes)


class Controller:
    """All controller state; the gRPC servicer below is a thin layer over it."""

    def __init__(self, config: ControllerConfig) -> None:
        self.config = config
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.version = 0
        self.store = Store(config.database)
        self.p4info = P4Info.load(config.p4info)
        n = len(config.switches) + 1
        share = config.host_slots // n
        self.allocators: dict[str, SlotAllocator] = {}
        self.switches: dict[str, SwitchRuntime] = {}
        for i, cfg in enumerate(config.switches):
            alloc = SlotAllocator(self.p4info.register_size("slot_tag"), config.min_window,
                                  SWITCH_VALUES_PER_PACKET, share, config.host_window, share * i)
            self.allocators[cfg.name] = alloc
            self.switches[cfg.name] = SwitchRuntime(cfg, alloc, self.p4info, (config.p4info, config.bmv2_json))
        # jobs whose workers sit on no configured switch aggregate on the host aggregator only
        self.allocators[""] = SlotAllocator(0, config.min_window, SWITCH_VALUES_PER_PACKET, share,
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
                      {r: Member(*w) for r, *w in row["workers"]}, row["transport"], row["switch"],
                      row["job_index"])
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
            bindings.append(WorkerBinding(rank, host.port, ip, host.mac or m.mac, udp_port, m.qp, m.rkey))
        return SwitchJob(job.job_id, job.job_index, p.epoch, p.slot_base, p.slot_count, tuple(bindings),
                         job.transport)

    def _sync(self) -> None:
        """Called with the lock held after any change: job indices, switches, store, watchers."""
        for name, sw in self.switches.items():
            alloc = self.allocators[name]
            on_switch = [j for j in sorted(self.jobs.values(), key=lambda j: j.job_id)
                         if j.place == name and alloc.jobs[j.job_id].active.mode == SWITCH]
            for job in self.jobs.values():   # a job off the switch gives its counter row back
                if job.place == name and job not in on_switch:
                    job.job_index = None
            used = {j.job_index for j in on_switch}
            for job in on_switch:
                if job.job_index is None:
                    job.job_index = min(set(range(MAX_JOBS_PER_SWITCH)) - used)
                    used.add(job.job_index)
            sw.reconcile([self._switch_job(j, sw, alloc.jobs[j.job_id].active) for j in on_switch])
        for job in self.jobs.values():
            self._persist(job)
        self.version += 1
        self.changed.notify_all()

    # -- job calls ---------------------------------------------------------------------------

    def _job(self, job_id: int, token: str) -> Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise Refused(grpc.StatusCode.NOT_FOUND, f"no job {job_id}")
        if not hmac.compare_digest(job.token, token):
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, f"wrong token for job {job_id}")
        job.last_seen = time.monotonic()
        return job

    def admin(self, token: str) -> None:
        if not self.config.admin_token or not hmac.compare_digest(self.config.admin_token, token):
            raise Refused(grpc.StatusCode.PERMISSION_DENIED, "wrong admin token")

    def create_job(self, n_workers: int, bytes_per_iteration: int, iteration_seconds: float,
                   name: str, transport: str = "") -> tuple[int, str]:
        if not 1 <= n_workers <= 32:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT, f"n_workers must be 1..32, got {n_workers}")
        transport = transport or "udp"
        if transport not in ENCAPSULATIONS:
            raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                          f"transport must be one of {', '.join(ENCAPSULATIONS)}, got {transport!r}")
        demand = Demand(n_workers, bytes_per_iteration, iteration_seconds or 1.0)
        with self.lock:
            job_id = self.store.next_job_id()
            token = secrets.token_hex(16)
            self.store.create_job(job_id, name, token, demand, transport)
            self.jobs[job_id] = Job(job_id, name, token, demand, transport=transport)
        log.info("job %d created (%d workers)", job_id, n_workers)
        return job_id, token

    def join(self, job_id: int, token: str, rank: int, address: str, mac: str, qp: int = 0,
             rkey: int = 0) -> Job:
        with self.lock:
            job = self._job(job_id, token)
            if not 0 <= rank < job.demand.n_workers:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                              f"rank {rank} not in 0..{job.demand.n_workers - 1}")
            try:
                parse_address(address)
            except ValueError as e:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None
            if job.transport == "roce" and not 1 <= qp <= 0xFFFFFF:
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                              f"job {job_id} uses RoCEv2: rank {rank} must give its QP (1..2^24-1), got {qp}")
            if job.transport != "roce" and (qp or rkey):
                raise Refused(grpc.StatusCode.INVALID_ARGUMENT,
                              f"job {job_id} uses {job.transport}, not RoCEv2: rank {rank} gave a QP/rkey")
            member, before = Member(address, mac, qp, rkey), job.workers.get(rank)
            if job.place is not None and before is not None and before.address != address:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION,
                              f"job {job_id} is placed already; rank {rank} cannot move "
                              f"from {before.address} to {address}")
            job.workers[rank] = member
            self.store.add_worker(job_id, rank, member)
            if job.place is None and len(job.workers) == job.demand.n_workers:
                self._place(job)
            elif job.place is not None and before != member:
                self._sync()  # a restarted worker's new MAC, QP or rkey reaches the switch
            return job

    def _place(self, job: Job) -> None:
        ips = {parse_address(m.address)[0] for m in job.workers.values()}
        job.place = next((name for name, sw in self.switches.items() if ips <= set(sw.cfg.hosts)), "")
        self.allocators[job.place].add_job(job.job_id, job.demand)
        log.info("job %d placed on %s", job.job_id, job.place or "host only")
        self._sync()

    def grants(self, job: Job) -> list[pb.Grant]:
        """The job's active grant, and its pending one if any (empty before placement)."""
        if job.place is None:
            return []
        state = self.allocators[job.place].jobs[job.job_id]
        out = [self._grant(job, state.active, False)]
        if state.pending:
            out.append(self._grant(job, state.pending, True))
        return out

    def _grant(self, job: Job, p: Placement, pending: bool) -> pb.Grant:
        if p.mode == SWITCH:
            aggregator, k = self.switches[job.place].cfg.aggregator, SWITCH_VALUES_PER_PACKET
        else:
            aggregator, k = self.config.host_aggregator, self.config.host_values_per_packet
        return pb.Grant(job_id=job.job_id, epoch=p.epoch, mode=p.mode, slot_base=p.slot_base,
                        slot_count=p.slot_count, values_per_packet=k, aggregator=aggregator,
                        pending=pending, transport=job.transport if p.mode == SWITCH else "udp")

    def activate(self, job_id: int, token: str, epoch: int, boundary: int) -> tuple[bool, pb.Grant]:
        with self.lock:
            job = self._job(job_id, token)
            if job.place is None:
                raise Refused(grpc.StatusCode.FAILED_PRECONDITION, f"job {job_id} has no grant yet")
            decided = self.store.activation(job_id, epoch, boundary)
            if decided is None:
                decided = self.allocators[job.place].activate(job_id, epoch)
                self.store.record_activation(job_id, epoch, boundary, decided)
                if decided:
                    log.info("job %d activated epoch %d at boundary %d", job_id, epoch, boundary)
                    self._sync()
            return decided, self.grants(job)[0]

    def leave(self, job_id: int) -> None:
        with self.lock:
            job = self.jobs.pop(job_id)
            if job.place is not None:
                self.allocators[job.place].remove_job(job_id)
            self.store.delete_job(job_id)
            log.info("job %d left", job_id)
            self._sync()

    def expire_leases(self) -> list[int]:
        now = time.monotonic()
        with self.lock:
            gone = [j.job_id for j in self.jobs.values() if now - j.last_seen > self.config.lease_seconds]
            for job_id in gone:
                log.warning("job %d lease expired", job_id)
                self.leave(job_id)
        return gone

    def drain(self, job_id: int) -> pb.Grant:
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None or job.place is None:
                raise Refused(grpc.StatusCode.NOT_FOUND, f"no placed job {job_id}")
            p = self.allocators[job.place].drain(job_id)
            self._sync()
            return self._grant(job, p, p.epoch != self.allocators[job.place].jobs[job_id].active.epoch)

    def host_jobs(self) -> pb.HostJobs:
        out = pb.HostJobs()
        with self.lock:
            for job in sorted(self.jobs.values(), key=lambda j: j.job_id):
                if job.place is None:
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
                                    joined=len(job.workers))
                grants = self.grants(job)
                if grants:
                    info.active.CopyFrom(grants[0])
                if len(grants) > 1:
                    info.pending.CopyFrom(grants[1])
                if grants and grants[0].mode == SWITCH and job.job_index is not None:
                    c = JobCounters(self.switches[job.place].sw).job(job.job_index)
                    info.counters.update({k: v for k, v in c.items() if k != "drops"})
                    info.counters.update({f"drop_{k}": v for k, v in c["drops"].items()})
            out.switch_slots = sum(a.switch_slots for a in self.allocators.values())
        return out

    def close(self) -> None:
        self.stopped.set()
        with self.lock:
            for sw in self.switches.values():
                sw.sw.close()


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
                                   request.transport)
        return pb.CreateJobReply(job_id=job_id, token=token)

    def JoinJob(self, request, context):
        job = self._call(context, self.ctl.join, request.job_id, request.token, request.rank,
                         request.address, request.mac, request.roce_qp, request.roce_rkey)
        return pb.JoinJobReply(n_workers=job.demand.n_workers, lease_seconds=self.ctl.config.lease_seconds)

    def WatchGrant(self, request, context):
        ctl = self.ctl
        job = self._call(context, lambda: ctl._job(request.job_id, request.token))
        sent = None
        while context.is_active():
            with ctl.lock:
                if request.job_id not in ctl.jobs:
                    return
                grants = ctl.grants(job)
                if grants == sent:
                    ctl.changed.wait(timeout=1.0)
                    continue
            sent = grants
            yield from grants

    def ActivateGrant(self, request, context):
        ok, grant = self._call(context, self.ctl.activate, request.job_id, request.token,
                               request.epoch, request.boundary)
        return pb.ActivateReply(activated=ok, grant=grant)

    def Heartbeat(self, request, context):
        self._call(context, lambda: self.ctl._job(request.job_id, request.token))
        return pb.HeartbeatReply(lease_seconds=self.ctl.config.lease_seconds)

    def LeaveJob(self, request, context):
        self._call(context, lambda: self.ctl._job(request.job_id, request.token))
        self.ctl.leave(request.job_id)
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
        if request.job_id not in self.ctl.jobs:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no job {request.job_id}")
        self.ctl.leave(request.job_id)
        return pb.Empty()


def serve(ctl: Controller, address: str) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
    pb_grpc.add_JobServiceServicer_to_server(JobServicer(ctl), server)
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot listen on {address}")
    server.start()

    def leases() -> None:
        while not ctl.stopped.wait(max(ctl.config.lease_seconds / 4, 0.05)):
            ctl.expire_leases()

    threading.Thread(target=leases, daemon=True, name="leases").start()
    return server
