"""One switch as the controller runs it: what it can hold (read from its P4Info), its P4Runtime
session (replaced when the switch restarts), and the reconciliation that makes its tables and
multicast groups hold exactly what the controller's state says: forwarding to its own hosts and,
along the links, to the other switches' hosts and aggregator addresses; its jobs and its parts
of aggregation trees (their uplinks included).

Reconciling diffs against what the controller knows the switch holds (``known``: what its last
successful write made it hold, ``switch_state.py``), so a placement writes only its own entries
and reads nothing. The switch is read back in full where that knowledge may be wrong: nothing
known yet (a new session, a switch found restarted, a write that failed), a primary election
since it was known (another controller may have written), and the keeper's audit every
``switch_audit_seconds``; what an audit finds changed behind the controller's back is logged,
counted (``drift_repairs``) and rewritten."""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import time
from dataclasses import dataclass

from inagg.hostlib.wire.protocol import MAX_WORKERS

from inagg.controller.allocator import SlotAllocator
from inagg.controller.config import SwitchConfig
from inagg.controller.p4info import P4Info
from inagg.controller.switch import (
    INSERT, AtpPoolBinding, Forwarding, JobAdmission, ReplicaRewrite,
    RecircSpread, ResultReplication, SourceGuard, SwitchConnection, SwitchError, SwitchJob, TreeUplink,
    check_no_traffic_on_reserved_ports, recirculation_rows,
)
from inagg.controller.switch_state import NAMED_DRIFT, SwitchState, Wanted, plan, wanted
from inagg.hostlib.wire.grant import parse_address
from inagg.controller.p4info import P4Type

log = logging.getLogger("inagg.controller")


def _ipv4_host(address: str) -> str | None:
    """The IPv4 of ``"ip:port"``; None for "" or a host name."""
    if not address:
        return None
    host = parse_address(address)[0]
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return None
    return host


@dataclass(frozen=True)
class SwitchCapacity:
    """What one switch can hold, read from its P4Info (never from a copy of the P4 sizes)."""

    slots: int            # slot pool (P4Info.slot_pool)
    job_rows: int         # job_table entries and job counter rows
    worker_entries: int   # worker_table / replica_table entries, all jobs together
    job_workers: int      # ranks of one job: the width of a slot's worker bitmap
    trees: bool = False   # has uplink_table: can be a switch below the root of a tree
    guard: bool = False   # has host_port_table: drops hosts' frames that claim an aggregator's place
    recirc_spread: bool = False   # has recirc_spread: recirculates through loopback ports too
    atp: bool = False     # has atp_table: can run ATP's pool (docs/atp.md; BMv2 forwards such jobs)

    @classmethod
    def from_p4info(cls, p4info: P4Info) -> "SwitchCapacity":
        return cls(slots=p4info.slot_pool,
                   job_rows=min(p4info.table_size("job_table"), p4info.counter_size("job_packets")),
                   worker_entries=min(p4info.table_size("worker_table"),
                                      p4info.table_size("replica_table")),
                   job_workers=MAX_WORKERS, trees=p4info.has(P4Type.table, "uplink_table"),
                   guard=p4info.has(P4Type.table, "host_port_table"),
                   recirc_spread=p4info.has(P4Type.table, "recirc_spread"),
                   atp=p4info.has(P4Type.table, "atp_table"))


class SwitchRuntime:
    """One switch: its session, its allocator and the programming of its tables."""

    def __init__(self, cfg: SwitchConfig, allocator: SlotAllocator, p4info: P4Info,
                 routes: dict[str, int] | None = None, host_aggregator: str = "") -> None:
        self.cfg = cfg
        self.host_aggregator = host_aggregator   # "ip:port" of the host aggregator ("" = none)
        self.allocator = allocator
        self.p4info = p4info
        self.capacity = SwitchCapacity.from_p4info(p4info)
        recirculation_rows(p4info, cfg.loopback_device_ports)   # a port it cannot use: ValueError
        traffic = {cfg.device_port(p): who for p, who in cfg.port_users().items()
                   if p not in cfg.loopback_ports}
        check_no_traffic_on_reserved_ports(p4info, traffic)
        self.routes = routes or {}   # MAC -> front-panel port of the link toward it
        self.wanted: list[SwitchJob] | None = None   # what the switch should hold
        self.applied: list[SwitchJob] | None = None  # ... and what it was last made to hold
        self.restarts = 0                            # times it was found restarted and re-programmed
        self.known: SwitchState | None = None        # what it holds, as last written or read (None: unknown)
        self.known_mastership = 0                    # the session's mastership when ``known`` was taken
        self._job_wanted: dict[SwitchJob, list[Wanted]] = {}   # each wanted job's updates (``desired``)
        self.audited = time.monotonic()              # when it was last read back in full
        self.full_reads = 0                          # times it was read back in full
        self.updates_written = 0                     # updates written to it (counter resets included)
        self.drift_repairs = 0                       # entries and groups found changed behind our back
        self.id_mark = 0   # the next job id, kept on the switch with its entries (JobAdmission.mark_update)
        self.atp_pool: AtpPoolBinding | None = None   # sharing = "atp": its pool (Fabric)
        self.sw = SwitchConnection(cfg.grpc, cfg.device_id, program=cfg.program,
                                   push_timeout=cfg.push_timeout)
        try:
            self.sw.ensure_pipeline()
        except BaseException:
            self.sw.close()   # its stream thread would keep a failing controller alive
            raise

    def reconnect(self) -> SwitchConnection:
        """A new session after the old one broke, with our pipeline pushed if the switch lost
        it (or runs another); raises SwitchError while the switch is down. The caller swaps it
        in (``adopt``)."""
        sw = SwitchConnection(self.cfg.grpc, self.cfg.device_id, program=self.cfg.program,
                              push_timeout=self.cfg.push_timeout)
        try:
            sw.restore_pipeline()
        except BaseException:
            sw.close()
            raise
        return sw

    def adopt(self, sw: SwitchConnection | None) -> None:
        """Use session ``sw`` (None: keep the current one) for a switch found restarted: its
        entries are unknown until the next reconcile."""
        if sw is not None:
            with contextlib.suppress(Exception):
                self.sw.close()
            self.sw = sw
        self.applied = self.known = None
        self.restarts += 1

    def knows(self) -> bool:
        """Whether ``known`` can stand for the switch: taken in this session, under the same
        primary election, with the stream still up."""
        return (self.known is not None and self.known_mastership == self.sw.mastership
                and not self.sw.lost.is_set())

    def audit_due(self, period: float) -> bool:
        """Whether the last full read back is ``period`` seconds old."""
        return time.monotonic() - self.audited >= period

    def desired(self, jobs: list[SwitchJob]) -> list[Wanted]:
        """Entries (by table and key) and multicast groups the switch should hold, the job-id
        mark among them (``JobAdmission.mark_update``), decoded (``switch_state.wanted``)."""
        fwd = Forwarding(self.sw)
        ports = {**self.routes, **{h.mac: h.port for h in self.cfg.hosts.values()}}
        updates = [fwd.host_update(INSERT, m, self.cfg.device_port(p)) for m, p in ports.items()]
        updates += fwd.flood_updates(INSERT, self.cfg.ports)
        if self.id_mark:
            updates.append(JobAdmission(self.sw).mark_update(INSERT, self.id_mark))
        updates += self.guard_updates()
        updates += RecircSpread(self.sw).updates(INSERT, self.cfg.loopback_device_ports)
        if self.atp_pool is not None:   # before the jobs that use it
            updates.append(JobAdmission(self.sw).atp_pool_update(INSERT, self.atp_pool))
        # a job's updates are built and decoded once while it stays the same (protobuf in pure
        # Python is most of a placement's CPU): kept for the jobs wanted now, the others dropped
        self._job_wanted = {job: self._job_wanted.get(job) or wanted(self.sw, self.job_updates(job))
                            for job in jobs}
        return wanted(self.sw, updates) + [w for job in jobs for w in self._job_wanted[job]]

    def job_updates(self, job: SwitchJob) -> list:
        """One job's entries: its multicast group, replica rows, uplink and admission rows (an
        ATP job: its ``admit_atp`` rows)."""
        if job.atp:
            return JobAdmission(self.sw).atp_updates(INSERT, job)
        return [ResultReplication(self.sw).job_update(INSERT, job), *ReplicaRewrite(self.sw).updates(INSERT, job),
                *TreeUplink(self.sw).updates(INSERT, job), *JobAdmission(self.sw).updates(INSERT, job)]

    def guard_updates(self) -> list:
        """SourceGuard's entries: every port a configured host is on is guarded against
        frames from this switch's aggregator address; the host aggregator's port (where its IP
        is one of the hosts) may send results from its address, no other port may."""
        switch_ip = _ipv4_host(self.cfg.aggregator)
        if not self.capacity.guard or switch_ip is None:
            return []
        # no host aggregator (or a name): guard the switch's address twice rather than invent one
        host_ip = _ipv4_host(self.host_aggregator) or switch_ip
        ports: dict[int, bool] = {}
        for ip, h in self.cfg.hosts.items():
            port = self.cfg.device_port(h.port)
            ports[port] = ports.get(port, False) or ip == host_ip
        guard = SourceGuard(self.sw)
        return [u for port, agg in sorted(ports.items())
                for u in guard.port_updates(INSERT, port, switch_ip, host_ip, agg)]

    def program(self, jobs: list[SwitchJob]) -> None:
        """Make the switch hold ``jobs``; until that succeeds its state counts as unknown."""
        self.wanted, self.applied = list(jobs), None
        self.reconcile(jobs)

    def reconcile(self, jobs: list[SwitchJob], *, audit: bool = False) -> None:
        """Make the switch hold exactly ``desired(jobs)``, writing the difference from what it
        holds (``switch_state.plan``): from ``known`` when that can stand (``knows``) and this is
        no ``audit``, else from a full read back. A write that fails leaves the switch unknown."""
        want = self.desired(jobs)
        target = SwitchState.of(want)
        have = self.known if self.knows() and not audit else self.read_back()
        writes = plan(self.sw, want, target, have, jobs)
        try:
            self.sw.write(writes)
        except SwitchError:
            self.known = None
            raise
        self.updates_written += len(writes)
        self.known, self.known_mastership = target, self.sw.mastership
        self.applied = list(jobs)

    def tables(self) -> tuple[str, ...]:
        """The tables the controller programs on this switch's program."""
        return ("l2_table", "worker_table", "replica_table", "job_table") + \
            (("uplink_table",) if self.capacity.trees else ()) + \
            (("host_port_table",) if self.capacity.guard else ()) + \
            (("recirc_spread",) if self.capacity.recirc_spread else ()) + \
            (("atp_table",) if self.capacity.atp else ())

    def read_back(self) -> SwitchState:
        """Everything the switch holds, read over P4Runtime. Where the controller believed it
        knew (an audit, or a primary election since), each difference is drift from outside:
        logged and counted; the reconcile that asked rewrites it."""
        actual = SwitchState.read(self.sw, self.tables())
        self.full_reads += 1
        self.audited = time.monotonic()
        if self.known is not None:
            drift = self.known.drift(actual)
            if drift:
                self.drift_repairs += len(drift)
                more = f" and {len(drift) - NAMED_DRIFT} more" if len(drift) > NAMED_DRIFT else ""
                log.warning("switch %s: %d entr%s changed behind the controller's back (%s%s)%s; repairing",
                            self.cfg.name, len(drift), "y" if len(drift) == 1 else "ies",
                            ", ".join(drift[:NAMED_DRIFT]), more,
                            "" if self.sw.mastership == self.known_mastership else " under another primary")
        return actual
