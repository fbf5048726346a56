"""One switch as the controller runs it: what it can hold (read from its P4Info), its P4Runtime
session (replaced when the switch restarts), and the reconciliation that makes its tables and
multicast groups hold exactly what the controller's state says: forwarding to its own hosts and,
along the links, to the other switches' hosts and aggregator addresses; its jobs and its parts
of aggregation trees (their uplinks included)."""

from __future__ import annotations

import contextlib
import ipaddress
from dataclasses import dataclass

from inagg.hostlib.wire.protocol import MAX_WORKERS

from inagg.controller.allocator import SlotAllocator
from inagg.controller.config import SwitchConfig
from inagg.controller.p4info import P4Info
from inagg.controller.switch import (
    DELETE, INSERT, MODIFY, Forwarding, JobAdmission, JobCounters, ReplicaRewrite,
    RecircSpread, ResultReplication, SourceGuard, SwitchConnection, SwitchJob, TreeUplink,
    check_no_traffic_on_reserved_ports, recirculation_rows,
)
from inagg.hostlib.wire.grant import parse_address
from inagg.controller.p4info import P4Type


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

    @classmethod
    def from_p4info(cls, p4info: P4Info) -> "SwitchCapacity":
        return cls(slots=p4info.slot_pool,
                   job_rows=min(p4info.table_size("job_table"), p4info.counter_size("job_packets")),
                   worker_entries=min(p4info.table_size("worker_table"),
                                      p4info.table_size("replica_table")),
                   job_workers=MAX_WORKERS, trees=p4info.has(P4Type.table, "uplink_table"),
                   guard=p4info.has(P4Type.table, "host_port_table"),
                   recirc_spread=p4info.has(P4Type.table, "recirc_spread"))


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
        self.id_mark = 0   # the next job id, kept on the switch with its entries (JobAdmission.mark_update)
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
        self.applied = None
        self.restarts += 1

    def desired(self, jobs: list[SwitchJob]):
        """Entries (by table and key) and multicast groups the switch should hold, the job-id
        mark among them (``JobAdmission.mark_update``)."""
        fwd = Forwarding(self.sw)
        ports = {**self.routes, **{h.mac: h.port for h in self.cfg.hosts.values()}}
        updates = [fwd.host_update(INSERT, m, self.cfg.device_port(p)) for m, p in ports.items()]
        updates += fwd.flood_updates(INSERT, self.cfg.ports)
        if self.id_mark:
            updates.append(JobAdmission(self.sw).mark_update(INSERT, self.id_mark))
        updates += self.guard_updates()
        updates += RecircSpread(self.sw).updates(INSERT, self.cfg.loopback_device_ports)
        for job in jobs:
            updates.append(ResultReplication(self.sw).job_update(INSERT, job))
            updates += ReplicaRewrite(self.sw).updates(INSERT, job)
            updates += TreeUplink(self.sw).updates(INSERT, job)
            updates += JobAdmission(self.sw).updates(INSERT, job)
        return updates

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

    def reconcile(self, jobs: list[SwitchJob]) -> None:
        """Make the switch hold exactly ``desired(jobs)``: insert/modify first (groups, then
        per-worker entries, then job_table), deletions last in reverse order."""
        want = self.desired(jobs)
        have_tables: dict[tuple, tuple] = {}
        tables = ("l2_table", "worker_table", "replica_table", "job_table") + \
            (("uplink_table",) if self.capacity.trees else ()) + \
            (("host_port_table",) if self.capacity.guard else ()) + \
            (("recirc_spread",) if self.capacity.recirc_spread else ())
        for table in tables:
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
        # a job new on the switch starts from zeroed counters (its row may have had another job,
        # or the switch restarted); they go before its job_table row makes it visible
        fresh = [j for j in jobs if ("job_table", (("job_id", j.job_id),)) not in have_tables]
        writes[:0] = [u for j in fresh for u in JobCounters(self.sw).reset_updates(j.job_index)]
        order = {"job_table": 0, "uplink_table": 1, "replica_table": 1, "worker_table": 1, "l2_table": 2,
                 "host_port_table": 2, "recirc_spread": 2}
        stale = sorted((k for k in have_tables if k not in seen_tables), key=lambda k: order[k[0]])
        for table, key in stale:
            writes.append(self.sw.table_update(DELETE, table, dict(key)))
        for gid in have_groups:
            if gid not in seen_groups:
                writes.append(ResultReplication(self.sw).update(DELETE, gid, []))
        self.sw.write(writes)
        self.applied = list(jobs)
