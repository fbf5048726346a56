"""The software data plane's pipeline in C++ (``inagg.hostlib._native.SwitchPipeline``), behind the
interface of :class:`inagg.bmv2_env.softswitch.pipeline_reference.SoftPipeline`, which stays the reference.

The P4Runtime server keeps writing and reading the Python state (``TableStore``,
``MulticastGroups``); this class is their ``StateMirror``: every accepted change, undos included,
is copied into the core's tables as it happens, and the counters P4Runtime reads are live views of
the core's. The packet loop (``inagg.hostlib._native.SwitchLoop``) runs the core on its own thread;
``process()`` is the per-frame slow path (``--log-console``) and the test hook.
"""

from __future__ import annotations

import numpy as np

from inagg.controller.p4info import P4Info
from inagg.hostlib.native_build import _native

from inagg.bmv2_env.softswitch.pipeline_reference import (
    GLOBAL_DROPS,
    GUARD_DROPS,
    GUARD_TABLE,
    JOB_AGGREGATED,
    JOB_DROPS,
    JOB_DUPLICATES,
    JOB_PACKETS,
    JOB_RESULTS,
    JOB_TABLE,
    L2_TABLE,
    RECIRC_SPREAD,
    REPLICA_TABLE,
    UPLINK_TABLE,
    WORKER_TABLE,
    engine_refusal,
    job_configs,
)
from inagg.bmv2_env.softswitch.state import Action, Counters, MulticastGroups, Replica, TableStore

# The core's counters, in the order of its Counter enum (native/switch_tables.hpp).
CORE_COUNTERS = (JOB_PACKETS, JOB_AGGREGATED, JOB_DUPLICATES, JOB_RESULTS, JOB_DROPS, GLOBAL_DROPS,
                 GUARD_DROPS)
# The ternary fields of the TNA program's host_port_table, in the core's order (GuardRow).
GUARD_ROW_FIELDS = ("ipv4_valid", "src_addr", "inagg_valid", "msg_type", "flags")
# l2_table actions as the core codes them (L2Kind).
_L2_KIND = {"drop": 0, "forward": 1, "flood": 2}


def _short(action: Action) -> str:
    return action.name.rsplit(".", 1)[-1]


class NativePipeline:
    """Tables, multicast groups, counters and the slot engine of one software switch, in C++."""

    def __init__(self, p4info: P4Info) -> None:
        self.p4info = p4info
        sizes = {p4info.local_name(c.preamble.name): c.size for c in p4info.message.counters}
        # K and the drop-counter row are the pushed P4Info's (the software target's K, BMv2's
        # 64 or Tofino's, and DROP_REASONS), read from it as the controller reads them
        # a counter the P4Info lacks gets no cells
        self.core = _native.SwitchPipeline(
            p4info.slot_pool, p4info.values_per_packet, [sizes.get(n, 0) for n in CORE_COUNTERS],
            p4info.drop_row_length)
        self.tables = TableStore(p4info, mirror=self)
        self.tables.set_default(L2_TABLE, Action("InaggIngress.forwarding.drop"))
        self.pre = MulticastGroups(mirror=self)
        # counters the core does not count (the TNA program's recirculation counters: this
        # switch never recirculates) are cells of their own that stay as written, as in the
        # Python reference
        arrays = {n: self.core.counter(CORE_COUNTERS.index(n)) if n in CORE_COUNTERS
                  else np.zeros(size, dtype=np.int64) for n, size in sizes.items()}
        self.counters = Counters(p4info, arrays, lambda name, index, value: self._set_counter(
            arrays, name, index, value))

    def _set_counter(self, arrays: dict[str, np.ndarray], name: str, index: int, value: int) -> None:
        """Write one cell: the core's own counters through the core, the others in place."""
        if name in CORE_COUNTERS:
            self.core.set_counter(CORE_COUNTERS.index(name), index, value)
        else:
            arrays[name][index] = value

    # -- control plane -----------------------------------------------------------------------

    def sync_jobs(self) -> None:
        """Configure the core's engine from job_table + worker_table (SoftPipeline.sync_jobs)."""
        wanted = job_configs(self.tables, _native.bound_sender_id, _native.unbound_sender_id, None)
        with engine_refusal():
            self.core.replace_jobs([(j.job_id, j.epoch, j.slot_base, j.slot_count, list(j.members),
                                     j.uplink and (j.uplink.rank, j.uplink.slot_base), j.n_children)
                                    for j in wanted])

    def job_ids(self) -> list[int]:
        """The jobs the slot engine serves."""
        return list(self.core.job_ids())

    def writing(self):
        """Held around one P4Runtime Write: the packet loop sees all of it or none of it."""
        return self.core.hold()

    # -- StateMirror ---------------------------------------------------------------------------

    def entry_changed(self, table: str, key: tuple[int, ...], action: Action | None) -> None:
        if table == JOB_TABLE:
            job_id, = key
            if action is None or _short(action) != "admit":
                self.core.remove_job_admit(job_id)
            else:
                p = dict(action.params)
                self.core.set_job_admit(job_id, p["job_index"], p["slot_base"], p["slot_count"],
                                        p["n_workers"], p["epoch"], p["mcast_grp"], p["encap"])
        elif table == REPLICA_TABLE:
            self._replica_changed(*key, action)
        elif table == L2_TABLE:
            mac, = key
            if action is None:
                self.core.remove_l2(mac)
            else:
                self.core.set_l2(mac, *self._l2_action(action))
        elif table == UPLINK_TABLE:   # admission's parent check and UpstreamSend's address;
            self._uplink_changed(*key, action)   # the uplink reaches the engine through sync_jobs
        elif table == GUARD_TABLE and self.tables[GUARD_TABLE].ternary:
            self._guard_row_changed(key, action)
        elif table == GUARD_TABLE:
            self._guard_changed(*key, action)
        elif table == WORKER_TABLE:   # admission's binding check; the ranks reach the engine
            job_id, rank = key        # through sync_jobs
            if action is None or _short(action) != "bind_worker":
                self.core.remove_worker(job_id, rank)
            else:
                p = dict(action.params)
                self.core.set_worker(job_id, rank, p["port"], p["addr"], p["mac"], p["udp_port"])
        elif table != RECIRC_SPREAD:   # kept by the TableStore: this engine never recirculates
            raise KeyError(f"the native pipeline has no table {table}")

    def default_changed(self, table: str, action: Action | None) -> None:
        if table == L2_TABLE:
            self.core.set_l2_default(*self._l2_action(action))
        # the other tables' defaults are NoAction: a miss, which the core treats as such

    def group_changed(self, group: int, replicas: tuple[Replica, ...] | None) -> None:
        if replicas is None:
            self.core.remove_group(group)
        else:
            self.core.set_group(group, [(r.port, r.instance) for r in replicas])

    def _replica_changed(self, job_id: int, replica: int, action: Action | None) -> None:
        name = None if action is None else _short(action)
        if name not in ("set_worker_address", "set_roce_worker_address"):
            self.core.remove_replica(job_id, replica)
            return
        p = dict(action.params)
        roce = name == "set_roce_worker_address"
        self.core.set_replica(job_id, replica, p["mac"], p["addr"], roce, p.get("udp_port", 0),
                              p.get("qp", 0), p.get("rkey", 0))

    def _uplink_changed(self, job_id: int, action: Action | None) -> None:
        if action is None or _short(action) != "set_uplink":
            self.core.remove_uplink(job_id)
            return
        p = dict(action.params)
        self.core.set_uplink(job_id, *(p[n] for n in (
            "port", "rank", "slot_base", "mac", "addr", "udp_port", "src_mac", "src_addr", "src_udp_port")))

    def _guard_changed(self, port: int, action: Action | None) -> None:
        if action is None or _short(action) != "guard_host_port":
            self.core.remove_host_port(port)
            return
        p = dict(action.params)
        self.core.set_host_port(port, p["aggregator_addr"], p["host_aggregator"], bool(p["is_aggregator"]))

    def _guard_row_changed(self, key: tuple, action: Action | None) -> None:
        """A row of the TNA program's host_port_table: (port, each ternary field's (value,
        mask) in the P4Info's order, priority) -> the core's GuardRow (GUARD_ROW_FIELDS' order)."""
        names = [mf.name for mf in self.tables[GUARD_TABLE].info.match_fields]
        fields = dict(zip(names, key))
        value, mask = zip(*(fields[n] for n in GUARD_ROW_FIELDS))
        port, priority = fields["port"], key[-1]
        if action is None or _short(action) != "refuse":
            self.core.remove_guard_row(port, priority, value, mask)
        else:
            self.core.set_guard_row(port, priority, value, mask, action.param("reason"))

    @staticmethod
    def _l2_action(action: Action | None) -> tuple[int, int]:
        name = "drop" if action is None else _short(action)
        arg = {"forward": "port", "flood": "group"}.get(name)
        return _L2_KIND[name], action.param(arg) if arg else 0

    # -- data plane (slow path) ----------------------------------------------------------------

    def process(self, port: int, data: bytes) -> list[tuple[int, bytes]]:
        return self.core.process(port, data)


