"""The software data plane's pipeline: ``p4/inagg.p4`` executed in Python.

It runs whichever inagg P4Info it is given: BMv2's, or the Tofino program's (a "Tofino-shaped"
switch: TNA names, its K values per packet, its counter layout), so the controller's Tofino
path is exercised without the chip.

Each method below mirrors one P4 control and its decision table (see the P4 file for the
table); the slot logic itself is ``inagg.hostlib.aggregator.engine_reference.AggregationEngine``, the specification the
native engine is held to, configured from the job_table and worker_table entries the controller
wrote.
``process()`` takes one frame from an ingress port and returns the frames to send.
"""

from __future__ import annotations

import contextlib
import struct
from dataclasses import dataclass
from typing import Callable, Hashable

import grpc

from inagg.controller.p4info import P4Info
from inagg.hostlib.aggregator.engine_reference import AggregationEngine, Emit, JobConfig, Uplink
from inagg.hostlib.wire.protocol import (
    DROP_REASONS,
    DUPLICATE_OUTCOMES,
    MSG_RESULT,
    ENCAP_CODE,
    FLAG_FROM_SWITCH,
    GLOBAL_DROP_REASONS,
    GUARD_DROP_REASONS,
    HEADER_BYTES,
    MAX_WORKERS,
    ROCE_HEADER_BYTES,
    ROCE_ICRC_BYTES,
    ROCE_INAGG_IMMEDIATE,
    ROCE_OPCODE_UC_WRITE_ONLY_IMM,
    ROCE_UDP_PORT,
    UDP_PORT,
    VERSION,
    Outcome,
    ipv4_checksum,
)
from inagg.hostlib.wire.roce import BTH_BYTES, BTH_FIELDS, RETH_FIELDS, byte_offset, icrc

from inagg.bmv2_env.softswitch.state import Action, Counters, MulticastGroups, StatusError, Table, TableStore

# Fully qualified P4 names (as in the P4Info).
JOB_TABLE = "InaggIngress.admission.job_table"
WORKER_TABLE = "InaggIngress.admission.worker_table"
L2_TABLE = "InaggIngress.forwarding.l2_table"
REPLICA_TABLE = "InaggEgress.replica_rewrite.replica_table"
UPLINK_TABLE = "InaggIngress.tree_uplink.uplink_table"   # none in the TNA program
GUARD_TABLE = "InaggIngress.source_guard.host_port_table"
# the TNA program's recirculation ports by slot (p4/tofino/recirc_spread.p4): only the Tofino
# model recirculates (tna_slot_model); the one-pass engines keep its rows and use none
RECIRC_SPREAD = "InaggIngress.recirc_spread.recirc_spread"
ATP_TABLE = "InaggIngress.admission.atp_table"      # none in the TNA program
GUARD_DROPS = "InaggIngress.source_guard.guard_drops"
_CTR = "InaggIngress.job_counters."
JOB_PACKETS, JOB_AGGREGATED, JOB_DUPLICATES, JOB_RESULTS, JOB_DROPS, GLOBAL_DROPS, JOB_COLLISIONS = (
    _CTR + n for n in ("job_packets", "job_aggregated", "job_duplicates", "job_results",
                       "job_drops", "global_drops", "job_collisions"))

ETH, IP, UDP = 14, 20, 8
INAGG_AT = ETH + IP + UDP                      # the inagg header, UDP encapsulation
ROCE_INAGG_AT = INAGG_AT + ROCE_HEADER_BYTES   # ... after BTH, RETH and ImmDt
# field offsets in BTH|RETH|ImmDt
_ROCE_QP = byte_offset(BTH_FIELDS, "dst_qp")
_ROCE_RKEY = BTH_BYTES + byte_offset(RETH_FIELDS, "rkey")
_ROCE_DMA_LEN = BTH_BYTES + byte_offset(RETH_FIELDS, "dma_len")
ENCAP_UDP, ENCAP_ROCE = ENCAP_CODE["udp"], ENCAP_CODE["roce"]
_DROP_CODE = {name: code for code, name in enumerate(DROP_REASONS)}
_GLOBAL_CODE = {name: code for code, name in enumerate(GLOBAL_DROP_REASONS)}
_GUARD_CODE = {name: code for code, name in enumerate(GUARD_DROP_REASONS)}
# A forward to DROP_PORT leaves nowhere: v1model's drop port (BMv2 drops a packet whose
# egress_spec is 511), and on Tofino a port no pipe has (P4Testgen's tests expect a drop).
DROP_PORT = 511
PARENT = ("parent",)   # the engine's id of a job's parent (its uplink's address) in a tree
ATP_PEER = ("atp_peer",)   # the engine's id of the host aggregator of the switch's ATP jobs


@dataclass(frozen=True)
class AtpPool:
    """The switch's ATP state (docs/atp.md): its slots [base, base + count) for ATP jobs'
    rounds; the host aggregator those jobs' workers address (IPv4 and UDP port: the parser takes
    a frame to or from that port as inagg too, so it sees contributions and the results that
    free aggregators); and the switch's aggregator address (MAC, IPv4, UDP port), the source of
    the sums it sends up, which the host aggregator knows as the jobs' ``atp_peer``: atp_table's
    one row (``set_atp_pool``, p4/include/job_admission.p4)."""

    base: int
    count: int
    host_addr: int
    host_port: int
    switch_mac: int
    switch_addr: int
    switch_udp_port: int


@dataclass(frozen=True)
class AtpAdmit:
    """An ATP job's admission (job_table's action ``admit_atp``): its counter index,
    its window at the host aggregator (the wire slots its workers address), its workers and
    epoch. Its ranks are bound by worker_table, as a window job's."""

    job_index: int
    slot_base: int
    slot_count: int
    n_workers: int
    epoch: int


@dataclass(frozen=True)
class Frame:
    """The parsed outer headers of a frame (only what the pipeline reads)."""

    data: bytes
    dst_mac: int
    encap: int  # ENCAP_UDP or ENCAP_ROCE when the inagg header follows, else 0
    atp: bool = False  # UDP to or from the host aggregator's port (AtpPool), not the inagg port

    @property
    def inagg_at(self) -> int:
        return ROCE_INAGG_AT if self.encap == ENCAP_ROCE else INAGG_AT


def parse(data: bytes, atp_port: int = 0) -> Frame:
    """InaggParser: Ethernet / IPv4 / UDP, and whether the inagg header follows in either
    encapsulation (the table in p4/include/parser.p4); with ``atp_port`` (the host aggregator's
    UDP port, AtpPool) a UDP frame to or from it is taken as inagg too (``Frame.atp``)."""
    if len(data) < ETH:
        return Frame(data, -1, 0)
    dst_mac = int.from_bytes(data[:6], "big")
    encap = 0
    if (len(data) >= INAGG_AT and data[12:14] == b"\x08\x00" and data[ETH] == 0x45
            and (struct.unpack_from("!H", data, ETH + 6)[0] & 0x1FFF) == 0 and data[ETH + 9] == 17):
        dport = struct.unpack_from("!H", data, ETH + IP + 2)[0]
        atp = bool(atp_port) and atp_port in (dport, struct.unpack_from("!H", data, ETH + IP)[0])
        if (dport == ROCE_UDP_PORT and len(data) >= ROCE_INAGG_AT
                and data[INAGG_AT] == ROCE_OPCODE_UC_WRITE_ONLY_IMM
                and struct.unpack_from("!I", data, ROCE_INAGG_AT - 4)[0] == ROCE_INAGG_IMMEDIATE):
            encap = ENCAP_ROCE
        elif dport == UDP_PORT or atp:
            return Frame(data, dst_mac, ENCAP_UDP, atp=atp)
    return Frame(data, dst_mac, encap)


class AtpControl:
    """``sync_jobs`` of both pipelines, which keep ``atp_pool`` and ``atp_jobs`` (what the
    engine was last given) and give ``_replace_jobs`` (their engine's jobs from the tables) and
    ``_engine_atp_pool`` (their engine's pool)."""

    tables: TableStore
    atp_pool: AtpPool | None
    atp_jobs: dict[int, AtpAdmit]
    _replace_jobs: Callable[[], None]
    _engine_atp_pool: Callable[[AtpPool | None], None]

    def sync_jobs(self) -> None:
        """Configure the engine from the tables: the ATP pool (atp_table) and ATP jobs
        (job_table's admit_atp), the window jobs (admit), worker_table and uplink_table; a pool
        before its jobs, the jobs gone before the pool. StatusError when the entries describe
        what the engine cannot hold (the caller undoes the write and calls again). A changed
        pool frees all its aggregators: a partial's contributors resend, so nothing is lost."""
        pool, jobs = atp_state(self.tables)
        changed = pool != self.atp_pool
        self.atp_pool, self.atp_jobs = pool, jobs
        with engine_refusal():
            if changed and pool is not None:
                self._engine_atp_pool(pool)
            self._replace_jobs()
            if changed and pool is None:
                self._engine_atp_pool(None)


class SoftPipeline(AtpControl):
    """Tables, multicast groups, counters and the slot engine of one software switch."""

    def __init__(self, p4info: P4Info) -> None:
        self.p4info = p4info
        self.tables = TableStore(p4info)
        self.tables.set_default(L2_TABLE, Action("InaggIngress.forwarding.drop"))
        self.pre = MulticastGroups()
        self.counters = Counters(p4info)
        self.engine = AggregationEngine(p4info.slot_pool, p4info.values_per_packet,
                                        host_mode=False)
        self.drop_row = p4info.drop_row_length
        self.atp_pool: AtpPool | None = None
        self.atp_jobs: dict[int, AtpAdmit] = {}

    # -- control plane -----------------------------------------------------------------------

    def _replace_jobs(self) -> None:
        """The engine's jobs from job_table + worker_table (+ uplink_table) and the ATP jobs;
        ValueError when the slot pool cannot hold them."""
        # a rank's member is its rank: admission compares worker_table's binding with the
        # frame (``sender``); an unbound rank matches no sender, as a worker_table miss in P4
        wanted = job_configs(self.tables, lambda rank: ("rank", rank), lambda rank: ("unbound", rank),
                             PARENT) + atp_job_configs(self.tables, self.atp_jobs, lambda rank: ("rank", rank),
                                                       lambda rank: ("unbound", rank), ATP_PEER)
        self.engine.replace_jobs({job.job_id: job for job in wanted})

    def job_ids(self) -> list[int]:
        """The jobs the slot engine serves."""
        return sorted(self.engine.jobs)

    def _engine_atp_pool(self, pool: AtpPool | None) -> None:
        self.engine.set_atp_pool(*((pool.base, pool.count) if pool else (0, 0)))

    def writing(self) -> contextlib.AbstractContextManager:
        """Held around one P4Runtime Write; the caller's state lock already keeps this
        pipeline's packets out."""
        return contextlib.nullcontext()

    # -- data plane --------------------------------------------------------------------------

    def process(self, port: int, data: bytes) -> list[tuple[int, bytes]]:
        frame = parse(data, self.atp_pool.host_port if self.atp_pool else 0)
        if self.source_guard(port, frame):    # SourceGuard first, as p4/inagg.p4 applies it
            return []
        if not frame.encap:
            return self.forwarding(port, frame)
        if frame.atp:
            return self.atp_admission(port, frame)
        return self.admission(port, frame)

    def source_guard(self, port: int, frame: Frame) -> bool:
        """SourceGuard: True when ``frame`` claims an aggregator's place on a host port
        (dropped, counted in guard_drops)."""
        return self.guard_drop(guard_reason(self.tables, port, frame))

    def guard_drop(self, reason: str | None) -> bool:
        """SourceGuard's verdict: a reason is a drop, counted in guard_drops under it."""
        if reason is not None:
            self.counters.count(GUARD_DROPS, _GUARD_CODE[reason])
        return reason is not None

    def admission(self, port: int, frame: Frame) -> list[tuple[int, bytes]]:
        """JobAdmission, then SlotState/ValueAggregation (the engine), JobCounters and
        ResultReplication."""
        data, at = frame.data, frame.inagg_at
        if len(data) < at + HEADER_BYTES:
            self.counters.count(GLOBAL_DROPS, _GLOBAL_CODE["truncated"])
            return []
        if data[at] >> 4 != VERSION:
            self.counters.count(GLOBAL_DROPS, _GLOBAL_CODE["bad_version"])
            return []
        job_id = struct.unpack_from("!H", data, at + 2)[0]
        admit = admission(self.tables, job_id)
        if admit is None:                      # not admitted to the switch: forward untouched
            return self.forwarding(port, frame)
        if frame.encap != admit.param("encap"):
            self.job_counters(admit.param("job_index"), Outcome.BAD_ENCAP, False)
            return []
        inagg_end = ETH + IP + struct.unpack_from("!H", data, ETH + IP + 4)[0]
        framing_ok = True
        if frame.encap == ENCAP_ROCE:          # the ICRC ends the UDP payload; RETH has the length
            framing_ok = len(data) >= inagg_end and struct.unpack_from(
                "!I", data, INAGG_AT + _ROCE_DMA_LEN)[0] == inagg_end - ROCE_ICRC_BYTES - at
            inagg_end -= ROCE_ICRC_BYTES
        if inagg_end < at + HEADER_BYTES:      # a UDP length too short for the header the P4
            framing_ok, inagg_end = False, at + HEADER_BYTES   # parser extracts: bad_length
        emits = self.slot_logic(data[at:inagg_end], self.sender(port, frame, job_id, data[at:at + 5]),
                                framing_ok)
        self.job_counters(admit.param("job_index"), self.engine.last_outcome, bool(emits))
        return [out for emit in emits for out in self.result_replication(port, frame, admit, emit)]

    def atp_admission(self, port: int, frame: Frame) -> list[tuple[int, bytes]]:
        """A frame to or from the host aggregator's port: an ATP job's contribution, or the host
        aggregator's RESULT, goes through the engine's ATP table (atp_reference.py); anything
        else (another job's, too short, another version) goes to ``admission`` when it is to the
        inagg port (a tree's parent's result from a host aggregator), else is forwarded untouched. What the engine
        sends up is the contribution itself (forwarded on to the host aggregator) or a complete
        sum (``atp_sum``); a RESULT frees its aggregator and goes on, unless it is addressed to
        this switch (the host aggregator's release of a late copy's claim)."""
        d, at = frame.data, INAGG_AT
        job_id = struct.unpack_from("!H", d, at + 2)[0] if len(d) >= at + HEADER_BYTES else 0
        atp = self.atp_jobs.get(job_id)
        if atp is None or d[at] >> 4 != VERSION:   # to the inagg port: the switch's own job's
            to_switch = struct.unpack_from("!H", d, ETH + IP + 2)[0] == UDP_PORT
            return self.admission(port, frame) if to_switch else self.forwarding(port, frame)
        inagg_end = ETH + IP + struct.unpack_from("!H", d, ETH + IP + 4)[0]
        framing_ok = inagg_end >= at + HEADER_BYTES   # else bad_length, as in admission()
        inagg_end = max(inagg_end, at + HEADER_BYTES)
        emits = self.engine.process(d[at:inagg_end], self.sender(port, frame, job_id, d[at:at + 5]), framing_ok)
        outcome = self.engine.last_outcome
        sums = bool(emits) and (outcome in (Outcome.ADD, Outcome.DUP_UPSTREAM)
                                or (outcome == Outcome.FIRST and atp.n_workers == 1))
        self.job_counters(atp.job_index, outcome, sums)
        if d[at] & 0xF == MSG_RESULT:
            to_switch = struct.unpack_from("!I", d, ETH + 16)[0] == self.atp_pool.switch_addr
            return [] if to_switch else self.forwarding(port, frame)
        if sums:
            return self.atp_sum(port, frame, emits[0])
        return self.forwarding(port, frame) if emits else []

    def atp_sum(self, port: int, frame: Frame, emit: Emit) -> list[tuple[int, bytes]]:
        """A complete sum up to the host aggregator: the completing contribution's frame with
        the switch's aggregator address as its source (MAC, IPv4, UDP port), the sum as its
        inagg payload, forwarded as the contribution would be; lengths and trailer as for a
        result."""
        pool, d = self.atp_pool, frame.data
        eth = d[0:6] + pool.switch_mac.to_bytes(6, "big") + d[12:14]
        ip = bytearray(d[ETH: ETH + IP])
        ip[12:16] = pool.switch_addr.to_bytes(4, "big")
        udp_ports = pool.switch_udp_port.to_bytes(2, "big") + pool.host_port.to_bytes(2, "big")
        udp_end = ETH + IP + struct.unpack_from("!H", d, ETH + IP + 4)[0]
        out = build_frame(eth, ip, udp_ports, emit.data, trailer=d[udp_end:], keep_ip_length=True)
        return self.forwarding(port, Frame(out, frame.dst_mac, ENCAP_UDP, atp=True))

    def slot_logic(self, payload: bytes, sender: Hashable, framing_ok: bool) -> list:
        """SlotState and the value lanes (the engine) on the inagg header and values: what
        result_replication sends on (a pipeline whose result leaves in several passes, the TNA
        model's, hands on its first pass's packet instead)."""
        return self.engine.process(payload, sender, framing_ok)

    def sender(self, port: int, frame: Frame, job_id: int, head: bytes) -> Hashable:
        """The engine's id of ``frame``'s sender (``head``: the inagg header's first 5 bytes).
        A contribution's, for the rank it claims: the rank when worker_table's bind_worker
        matches the frame (ingress port, IPv4 source, Ethernet source, and UDP source port
        unless the binding leaves it open: 0, RoCEv2). A RESULT's: PARENT when the job's
        uplink_table entry names this sender as the parent (port, IPv4, MAC, UDP source port).
        Else an id no member has (bad_worker, in the engine's check order)."""
        d = frame.data
        src = (port, struct.unpack_from("!I", d, ETH + 12)[0], int.from_bytes(d[6:12], "big"),
               struct.unpack_from("!H", d, ETH + IP)[0])
        if head[0] & 0xF == MSG_RESULT and frame.atp:
            pool = self.atp_pool
            return ATP_PEER if (src[1], src[3]) == (pool.host_addr, pool.host_port) else ("forged",)
        if head[0] & 0xF == MSG_RESULT:
            up = self.uplink(job_id)
            if up is not None and (up.param("port"), up.param("addr"), up.param("mac"),
                                   up.param("udp_port")) == src:
                return PARENT
            return ("forged",)
        rank = head[4]
        bind = self.tables[WORKER_TABLE].lookup((job_id, rank))
        if bind is not None and (bind.param("port"), bind.param("addr"), bind.param("mac")) == src[:3] \
                and bind.param("udp_port") in (0, src[3]):
            return ("rank", rank)
        return ("forged",)

    def uplink(self, job_id: int) -> Action | None:
        """The job's uplink_table entry (TreeUplink), None on a root or a TNA P4Info."""
        table = self.tables.tables.get(UPLINK_TABLE)
        return None if table is None else table.lookup((job_id,))

    def job_counters(self, job_index: int, outcome: Outcome, result: bool) -> None:
        c = self.counters
        c.count(JOB_PACKETS, job_index)
        if outcome in (Outcome.FIRST, Outcome.ADD):
            c.count(JOB_AGGREGATED, job_index)
            if result:
                c.count(JOB_RESULTS, job_index)
        elif outcome in DUPLICATE_OUTCOMES:
            c.count(JOB_DUPLICATES, job_index)
        elif outcome.is_drop:        # a parent's result (PARENT_RESULT) counts as a packet only
            c.count(JOB_DROPS, job_index * self.drop_row + _DROP_CODE[outcome.label])
        elif outcome == Outcome.COLLISION:
            c.count(JOB_COLLISIONS, job_index)

    def result_replication(self, port: int, frame: Frame, admit: Action, emit: Emit):
        """ResultReplication + ReplicaRewrite: swap addresses, then unicast (DUP_DONE) or one
        replica per multicast group member, each addressed by replica_table; a reduce-scatter's
        round carries its values to its owner (replica = rank + 1) alone (``Emit.data_for``).

        As BMv2 does, a result reuses the trigger: its IPv4 total length stays as sent, and the
        bytes after the UDP payload (Ethernet padding, any trailer: what the P4 parser did not
        extract) follow the deparsed headers (tests/test_dataplane_conformance.py checks it)."""
        if emit.upstream:
            return [self.upstream_send(frame, emit)]
        d = frame.data
        udp_end = ETH + IP + struct.unpack_from("!H", d, ETH + IP + 4)[0]
        eth = d[6:12] + d[0:6] + d[12:14]
        ip = bytearray(d[ETH: ETH + IP])
        ip[12:20] = d[ETH + 16: ETH + 20] + d[ETH + 12: ETH + 16]
        udp_ports = d[ETH + IP + 2: ETH + IP + 4] + d[ETH + IP: ETH + IP + 2]
        roce = d[INAGG_AT:ROCE_INAGG_AT] if frame.encap == ENCAP_ROCE else b""
        if self.engine.last_outcome == Outcome.DUP_DONE:
            targets = [(port, d[frame.inagg_at + 4] + 1)]   # replica = the sender's rank + 1
        else:
            targets = [(r.port, r.instance) for r in self.pre.groups.get(admit.param("mcast_grp"), ())]
        out = []
        for out_port, replica in targets:
            e, i, u, r = eth, bytearray(ip), udp_ports, bytearray(roce)
            if replica:
                rewrite = self.tables[REPLICA_TABLE].lookup((emit.job.job_id, replica))
                if rewrite is None:
                    continue
                e = rewrite.param("mac").to_bytes(6, "big") + eth[6:]
                i[16:20] = rewrite.param("addr").to_bytes(4, "big")
                if rewrite.name.endswith(".set_roce_worker_address"):
                    u = udp_ports[:2] + ROCE_UDP_PORT.to_bytes(2, "big")
                    if r:  # BTH and RETH exist: on a UDP frame these writes do nothing, as in P4
                        r[_ROCE_QP:_ROCE_QP + 3] = rewrite.param("qp").to_bytes(3, "big")
                        r[_ROCE_RKEY:_ROCE_RKEY + 4] = rewrite.param("rkey").to_bytes(4, "big")
                else:
                    u = udp_ports[:2] + rewrite.param("udp_port").to_bytes(2, "big")
            data = emit.data_for(replica - 1)
            elide(i, r, len(emit.data) - len(data))
            out.append((out_port, build_frame(e, i, u, data, r, trailer=d[udp_end:], keep_ip_length=True)))
        return out

    def upstream_send(self, frame: Frame, emit: Emit) -> tuple[int, bytes]:
        """UpstreamSend: the partial sum as a contribution to the parent, from this switch's
        aggregator address to the parent's, out of the uplink port (docs/trees.md); lengths and
        trailer as for a result."""
        up, d = self.uplink(emit.job.job_id), frame.data
        eth = up.param("mac").to_bytes(6, "big") + up.param("src_mac").to_bytes(6, "big") + d[12:14]
        ip = bytearray(d[ETH: ETH + IP])
        ip[12:20] = up.param("src_addr").to_bytes(4, "big") + up.param("addr").to_bytes(4, "big")
        udp_ports = up.param("src_udp_port").to_bytes(2, "big") + up.param("udp_port").to_bytes(2, "big")
        roce = d[INAGG_AT:ROCE_INAGG_AT] if frame.encap == ENCAP_ROCE else b""
        udp_end = ETH + IP + struct.unpack_from("!H", d, ETH + IP + 4)[0]
        return up.param("port"), build_frame(eth, ip, udp_ports, emit.data, roce, trailer=d[udp_end:],
                                             keep_ip_length=True)

    def forwarding(self, port: int, frame: Frame) -> list[tuple[int, bytes]]:
        """Forwarding (l2_table) + the flood pruning of ReplicaRewrite."""
        if frame.dst_mac < 0:
            return []
        table = self.tables[L2_TABLE]
        action = table.lookup((frame.dst_mac,)) or table.default
        data = deparsed(frame.data)
        if action.name.endswith(".forward"):
            return [] if action.param("port") == DROP_PORT else [(action.param("port"), data)]
        if action.name.endswith(".flood"):
            return [(r.port, data) for r in self.pre.groups.get(action.param("group"), ())
                    if r.port != port]
        return []


def deparsed(data: bytes) -> bytes:
    """A forwarded frame as the deparser emits it: one the parser took as IPv4 (EtherType
    0x0800, the 20-byte header there) with its header checksum recomputed, as the compute
    checksum control (BMv2) and the egress deparser (Tofino) do; any other as it came."""
    if len(data) < ETH + IP or data[12:14] != b"\x08\x00":
        return data
    ip = bytearray(data[ETH:ETH + IP])
    ip[10:12] = b"\0\0"
    return data[:ETH + 10] + ipv4_checksum(ip).to_bytes(2, "big") + data[ETH + 12:]


def guard_reason(tables: TableStore, port: int, frame: Frame) -> str | None:
    """SourceGuard (p4/include/source_guard.p4): the GUARD_DROP reason of a frame that claims an
    aggregator's place on host port ``port`` (host_port_table's guard_host_port), else None:
    its IPv4 source is the switch's aggregator address, or the host aggregator's off the host
    aggregator's port ("aggregator_addr"); it is an inagg RESULT off that port, or carries
    FLAG_FROM_SWITCH ("result"). No entry (a port to another switch, a program without the
    table): None."""
    table = tables.tables.get(GUARD_TABLE)
    if table is not None and table.ternary:
        return guard_row_reason(table, port, frame, frame.data[12:14] == b"\x08\x00", frame.encap == ENCAP_UDP)
    entry = None if table is None else table.lookup((port,))
    if entry is None or not entry.name.endswith(".guard_host_port"):
        return None
    d, at = frame.data, frame.inagg_at
    own_port = entry.param("is_aggregator") == 1
    if len(d) >= ETH + IP and d[12:14] == b"\x08\x00":      # the parser's ipv4 is valid
        src = struct.unpack_from("!I", d, ETH + 12)[0]
        if src == entry.param("aggregator_addr") or (not own_port and src == entry.param("host_aggregator")):
            return "aggregator_addr"
    if not frame.encap or len(d) < at + HEADER_BYTES:       # no inagg header
        return None
    if ((d[at] & 0xF) == MSG_RESULT and not own_port) or d[at + 1] & FLAG_FROM_SWITCH:
        return "result"
    return None


def guard_row_reason(table: Table, port: int, frame: Frame, ipv4_valid: bool, inagg_valid: bool) -> str | None:
    """SourceGuard as the TNA program has it (p4/tofino/source_guard.p4): the GUARD_DROP reason
    of the highest-priority host_port_table row ``frame`` on ``port`` matches (``refuse``), else
    None. The rows match IPv4's validity and source and inagg's validity, type and flags; which
    headers are valid is the caller's parser's to say (the soft pipeline's, or the TNA model's
    walk of the compiled parser; a header the frame is too short for is not valid)."""
    d = frame.data
    ipv4_valid, inagg_valid = ipv4_valid and len(d) >= ETH + IP, inagg_valid and len(d) >= INAGG_AT + HEADER_BYTES
    fields = {"port": port, "ipv4_valid": int(ipv4_valid),
              "src_addr": struct.unpack_from("!I", d, ETH + 12)[0] if ipv4_valid else 0,
              "inagg_valid": int(inagg_valid), "msg_type": d[INAGG_AT] & 0xF if inagg_valid else 0,
              "flags": d[INAGG_AT + 1] if inagg_valid else 0}
    row = table.match(tuple(fields[mf.name] for mf in table.info.match_fields))
    if row is None or not row.name.endswith(".refuse"):
        return None
    return GUARD_DROP_REASONS[row.param("reason")]


def admission(tables: TableStore, job_id: int) -> Action | None:
    """Job ``job_id``'s grant (its job_table ``admit``), None when it has none: no entry, or one
    of NoAction, which the native core also takes for not admitted."""
    admit = tables[JOB_TABLE].lookup((job_id,))
    return admit if admit is not None and admit.name.endswith(".admit") else None


def job_configs(tables: TableStore, member: Callable[[int], Hashable],
                unbound: Callable[[int], Hashable], parent: Hashable) -> list[JobConfig]:
    """The engine's job configurations that job_table + worker_table (+ uplink_table, in a
    tree) describe; rank r's member is ``member(r)`` when worker_table binds it, ``unbound(r)``
    without a binding; a job's parent is ``parent``, the id admission gives its results.
    n_workers contributions complete a round; the ranks are those below n_workers and any
    other one bound below MAX_WORKERS (a tree switch's sparse child ids, docs/trees.md)."""
    workers = tables[WORKER_TABLE].entries
    uplinks = tables.tables[UPLINK_TABLE].entries if UPLINK_TABLE in tables.tables else {}
    bound_ids: dict[int, int] = {}
    for job_id, rank in workers:
        if rank < MAX_WORKERS:
            bound_ids[job_id] = max(bound_ids.get(job_id, 0), rank + 1)
    jobs = []
    for job_id, in tables[JOB_TABLE].entries:
        admit = admission(tables, job_id)
        if admit is None:
            continue
        members = []
        for rank in range(max(admit.param("n_workers"), bound_ids.get(job_id, 0))):
            bind = workers.get((job_id, rank))
            members.append(member(rank) if bind else unbound(rank))
        up = uplinks.get((job_id,))
        uplink = None if up is None or not up.name.endswith(".set_uplink") else \
            Uplink(parent, up.param("rank"), up.param("slot_base"))
        jobs.append(JobConfig(job_id, admit.param("epoch"), admit.param("slot_base"),
                              admit.param("slot_count"), tuple(members), uplink,
                              admit.param("n_workers")))
    return jobs


def atp_job_configs(tables: TableStore, atp_jobs: dict[int, AtpAdmit], member: Callable[[int], Hashable],
                    unbound: Callable[[int], Hashable], atp_peer: Hashable) -> list[JobConfig]:
    """The engine's configurations of the switch's ATP jobs: ranks below n_workers, each
    ``member(r)`` when worker_table binds it, else ``unbound(r)``; the host aggregator is
    ``atp_peer``, the id admission gives its results."""
    workers = tables[WORKER_TABLE].entries
    return [JobConfig(job_id, a.epoch, a.slot_base, a.slot_count,
                      tuple(member(r) if (job_id, r) in workers else unbound(r) for r in range(a.n_workers)),
                      atp_peer=atp_peer)
            for job_id, a in sorted(atp_jobs.items())]


def atp_state(tables: TableStore) -> tuple[AtpPool | None, dict[int, AtpAdmit]]:
    """The ATP pool atp_table's row gives (None: no row, or one of pool_count 0) and the ATP
    jobs of job_table's admit_atp rows; StatusError when the pool's host port cannot tell ATP
    frames apart (0, the inagg port or RoCEv2's)."""
    table = tables.tables.get(ATP_TABLE)
    rows = [] if table is None else [(key, a) for key, a in table.entries.items()
                                      if a.name.endswith(".set_atp_pool") and a.param("pool_count")]
    pool = None
    for (host_addr,), a in rows:       # size 1: at most one
        pool = AtpPool(a.param("pool_base"), a.param("pool_count"), host_addr, a.param("host_port"),
                       a.param("switch_mac"), a.param("switch_addr"), a.param("switch_udp_port"))
    if pool is not None and pool.host_port in (0, UDP_PORT, ROCE_UDP_PORT):
        raise StatusError(grpc.StatusCode.INVALID_ARGUMENT,
                          f"atp_table: host_port {pool.host_port} cannot tell ATP frames apart: give "
                          f"the port the host aggregator listens on (not 0, {UDP_PORT} or {ROCE_UDP_PORT})")
    jobs = {job_id: AtpAdmit(*(a.param(n) for n in ("job_index", "slot_base", "slot_count", "n_workers", "epoch")))
            for (job_id,), a in tables[JOB_TABLE].entries.items() if a.name.endswith(".admit_atp")}
    return pool, jobs


@contextlib.contextmanager
def engine_refusal():
    """An engine's ValueError (jobs the slot pool cannot hold) as the P4Runtime error."""
    try:
        yield
    except ValueError as e:
        raise StatusError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None


def elide(ip: bytearray, roce: bytearray, cut: int) -> None:
    """A result whose ``cut`` bytes of values are elided for its replica (a reduce-scatter's
    round another rank owns): the IPv4 total length kept from the trigger, and RoCE's RETH DMA
    length, are that much shorter (floored at 0, as the C++ twin)."""
    if not cut:
        return
    ip[2:4] = max(0, int.from_bytes(ip[2:4], "big") - cut).to_bytes(2, "big")
    if roce:
        dma = int.from_bytes(roce[_ROCE_DMA_LEN:_ROCE_DMA_LEN + 4], "big")
        roce[_ROCE_DMA_LEN:_ROCE_DMA_LEN + 4] = max(0, dma - cut).to_bytes(4, "big")


def build_frame(eth: bytes, ip: bytearray, udp_ports: bytes, payload: bytes,
                roce: bytes | bytearray = b"", *, trailer: bytes = b"",
                keep_ip_length: bool = False) -> bytes:
    """Ethernet + IPv4 (checksum and, unless ``keep_ip_length``, length recomputed) + UDP
    (checksum 0) + payload; with ``roce`` (BTH|RETH|ImmDt) between UDP and payload and the ICRC
    computed after it (RoceIcrc); then ``trailer`` (bytes after the UDP payload)."""
    icrc_len = ROCE_ICRC_BYTES if roce else 0
    udp_len = UDP + len(roce) + len(payload) + icrc_len
    if not keep_ip_length:
        ip[2:4] = (IP + udp_len).to_bytes(2, "big")
    ip[10:12] = b"\0\0"
    ip[10:12] = ipv4_checksum(ip).to_bytes(2, "big")
    pkt = bytearray(ip + udp_ports + udp_len.to_bytes(2, "big") + b"\0\0" + roce + payload
                    + bytes(icrc_len))
    if roce:
        pkt[-icrc_len:] = icrc(pkt)
    return eth + bytes(pkt) + trailer
