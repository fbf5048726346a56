"""What one switch holds, as the controller knows it, and the writes that change it into another.

A ``SwitchState`` is every table entry (by table and key: action and parameters) and multicast
group (by id: its replicas) of the tables the controller programs. ``SwitchRuntime`` keeps the
state it last made the switch hold (``of`` what it wrote, after the write succeeded), so a placement diffs against memory and writes only its difference, reading
nothing; it reads the switch back in full (``read``) only where that memory may be wrong: a new
session or a switch restart, a new primary election, after a write error, and at the keeper's
periodic audit, where ``drift`` names what changed behind the controller's back.

``plan`` keeps P4Runtime's order: a new job's counter resets first (a job must not show its
row's previous holder's counts), then inserts and modifications in the wanted order
(``SwitchRuntime.desired``: forwarding, then per job its multicast group and replica rows before
its admission rows), deletions last, ``job_table`` rows first among them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from p4.v1 import p4runtime_pb2

from inagg.controller.p4info import P4Type
from inagg.controller.switch import DELETE, INSERT, MODIFY, JobCounters, ResultReplication, SwitchConnection, SwitchJob

EntryKey = tuple[str, tuple]            # (table, sorted key items)
Entry = tuple[str, dict[str, int]]      # (action, params)
Group = list[tuple[int, int]]           # sorted (egress port, instance)
# The order deletions go in: a job's row before its other entries, the ATP pool after its jobs.
DELETE_ORDER = {"job_table": 0, "uplink_table": 1, "replica_table": 1, "worker_table": 1, "l2_table": 2,
                "host_port_table": 2, "recirc_spread": 2, "atp_table": 3}
# Drift differences named in a log line; the rest are counted.
NAMED_DRIFT = 3


@dataclass(frozen=True)
class Wanted:
    """One update the switch should hold, decoded: a table entry (``table`` True: key (table,
    key items), value (action, params)) or a multicast group (key its id, value its replicas)."""

    update: p4runtime_pb2.Update
    table: bool
    key: EntryKey | int
    value: Entry | Group


def wanted(sw: SwitchConnection, updates: Iterable[p4runtime_pb2.Update]) -> list[Wanted]:
    """``updates`` (inserts) decoded, each once."""
    out = []
    for u in updates:
        if u.entity.HasField("table_entry"):
            table, key, action, params = sw.decode_entry(u.entity.table_entry)
            out.append(Wanted(u, True, (table, tuple(sorted(key.items()))), (action, params)))
        else:
            g = u.entity.packet_replication_engine_entry.multicast_group_entry
            out.append(Wanted(u, False, g.multicast_group_id, sorted((r.egress_port, r.instance) for r in g.replicas)))
    return out


@dataclass
class SwitchState:
    """Table entries and multicast groups of one switch."""

    tables: dict[EntryKey, Entry] = field(default_factory=dict)
    groups: dict[int, Group] = field(default_factory=dict)

    @classmethod
    def read(cls, sw: SwitchConnection, tables: Iterable[str]) -> "SwitchState":
        """What the switch holds of ``tables`` and its multicast groups, asked in one Read."""
        queries = []
        for table in tables:
            q = p4runtime_pb2.Entity()
            q.table_entry.table_id = sw.p4info.id(P4Type.table, table)
            queries.append(q)
        q = p4runtime_pb2.Entity()
        q.packet_replication_engine_entry.multicast_group_entry.multicast_group_id = 0   # all groups
        state = cls()
        for ent in sw.read(*queries, q):
            if ent.HasField("table_entry"):
                table, key, action, params = sw.decode_entry(ent.table_entry)
                state.tables[(table, tuple(sorted(key.items())))] = (action, params)
            else:
                g = ent.packet_replication_engine_entry.multicast_group_entry
                state.groups[g.multicast_group_id] = sorted((r.egress_port, r.instance) for r in g.replicas)
        return state

    @classmethod
    def of(cls, want: Iterable[Wanted]) -> "SwitchState":
        """The state that holds exactly the entries and groups of ``want``."""
        state = cls()
        for w in want:
            (state.tables if w.table else state.groups)[w.key] = w.value
        return state

    def has_job(self, job_id: int) -> bool:
        return ("job_table", (("job_id", job_id),)) in self.tables

    def drift(self, actual: "SwitchState") -> list[str]:
        """How ``actual`` (read from the switch) differs from this state, one phrase per entry
        or group: added, deleted or changed."""
        tables = [(f"{t} {dict(k)}", self.tables.get((t, k)), actual.tables.get((t, k)))
                  for t, k in sorted(self.tables.keys() | actual.tables.keys(), key=repr)]
        groups = [(f"multicast group {g}", self.groups.get(g), actual.groups.get(g))
                  for g in sorted(self.groups.keys() | actual.groups.keys())]
        return [f"{name} {'added' if mine is None else 'deleted' if theirs is None else 'changed'}"
                for name, mine, theirs in tables + groups if mine != theirs]

def plan(sw: SwitchConnection, want: list[Wanted], target: SwitchState, have: SwitchState,
         jobs: list[SwitchJob]) -> list[p4runtime_pb2.Update]:
    """The writes that turn ``have`` into ``target`` (= ``of(want)``), in P4Runtime's order
    (module docstring); each update of ``want`` that is written gets its type."""
    writes = [u for j in jobs if not have.has_job(j.job_id) for u in JobCounters(sw).reset_updates(j.job_index)]
    for w in want:
        now = (have.tables if w.table else have.groups).get(w.key)
        if now != w.value:
            w.update.type = MODIFY if now is not None else INSERT
            writes.append(w.update)
    stale = sorted((k for k in have.tables if k not in target.tables), key=lambda k: DELETE_ORDER[k[0]])
    writes += [sw.table_update(DELETE, table, dict(key)) for table, key in stale]
    writes += [ResultReplication(sw).update(DELETE, gid, []) for gid in have.groups if gid not in target.groups]
    return writes
