"""The software data plane's pipeline: ``p4/inagg.p4`` executed in Python.

Each method below mirrors one P4 control and its decision table (see the P4 file for the
table); the slot logic itself is ``hostlib.engine.AggregationEngine``, the same code the host
aggregator runs, configured from the job_table and worker_table entries the controller wrote.
``process()`` takes one frame from an ingress port and returns the frames to send.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import grpc

from controller.p4info import P4Info
from hostlib.engine import AggregationEngine, Emit, JobConfig
from hostlib.protocol import (
    DROP_REASONS,
    GLOBAL_DROP_REASONS,
    HEADER_BYTES,
    SWITCH_VALUES_PER_PACKET,
    UDP_PORT,
    VERSION,
)

from .state import Action, Counters, MulticastGroups, StatusError, TableStore

# Fully qualified P4 names (as in the P4Info).
JOB_TABLE = "InaggIngress.admission.job_table"
WORKER_TABLE = "InaggIngress.admission.worker_table"
L2_TABLE = "InaggIngress.forwarding.l2_table"
REPLICA_TABLE = "InaggEgress.replica_rewrite.replica_table"
SLOT_TAG = "InaggIngress.slot_state.slot_tag"
_CTR = "InaggIngress.job_counters."
JOB_PACKETS, JOB_AGGREGATED, JOB_DUPLICATES, JOB_RESULTS, JOB_DROPS, GLOBAL_DROPS = (
    _CTR + n for n in ("job_packets", "job_aggregated", "job_duplicates", "job_results",
                       "job_drops", "global_drops"))

ETH, IP, UDP = 14, 20, 8
INAGG_AT = ETH + IP + UDP
_DROP_CODE = {name: code for code, name in enumerate(DROP_REASONS)}
_GLOBAL_CODE = {name: code for code, name in enumerate(GLOBAL_DROP_REASONS)}


def ipv4_checksum(header: bytes) -> int:
    total = sum(struct.unpack("!10H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


@dataclass(frozen=True)
class Frame:
    """The parsed outer headers of a frame (only what the pipeline reads)."""

    data: bytes
    dst_mac: int
    is_inagg: bool  # IPv4 (ihl 5, not a fragment) / UDP to the inagg port


def parse(data: bytes) -> Frame:
    """InaggParser: Ethernet / IPv4 / UDP and whether the inagg header follows."""
    if len(data) < ETH:
        return Frame(data, -1, False)
    dst_mac = int.from_bytes(data[:6], "big")
    is_inagg = (
        len(data) >= INAGG_AT
        and data[12:14] == b"\x08\x00"
        and data[ETH] == 0x45
        and (struct.unpack_from("!H", data, ETH + 6)[0] & 0x1FFF) == 0
        and data[ETH + 9] == 17
        and struct.unpack_from("!H", data, ETH + IP + 2)[0] == UDP_PORT
    )
    return Frame(data, dst_mac, is_inagg)


class SoftPipeline:
    """Tables, multicast groups, counters and the slot engine of one software switch."""

    def __init__(self, p4info: P4Info) -> None:
        self.p4info = p4info
        self.tables = TableStore(p4info)
        self.tables.set_default(L2_TABLE, Action("InaggIngress.forwarding.drop"))
        self.pre = MulticastGroups()
        self.counters = Counters(p4info)
        self.engine = AggregationEngine(p4info.register_size(SLOT_TAG), SWITCH_VALUES_PER_PACKET,
                                        host_mode=False)

    # -- control plane -----------------------------------------------------------------------

    def sync_jobs(self) -> None:
        """Configure the engine from job_table + worker_table; StatusError when the entries
        describe jobs the slot pool cannot hold (the caller undoes the write)."""
        workers = self.tables[WORKER_TABLE].entries
        wanted = {}
        for (job_id,), admit in self.tables[JOB_TABLE].entries.items():
            members = []
            for rank in range(admit.param("n_workers")):
                bind = workers.get((job_id, rank))
                # an unbound rank matches no sender, as a worker_table miss in P4
                members.append((bind.param("port"), bind.param("addr")) if bind else ("unbound", rank))
            wanted[job_id] = JobConfig(job_id, admit.param("epoch"), admit.param("slot_base"),
                                       admit.param("slot_count"), tuple(members))
        try:
            self.engine.replace_jobs(wanted)
        except ValueError as e:
            raise StatusError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from None

    # -- data plane --------------------------------------------------------------------------

    def process(self, port: int, data: bytes) -> list[tuple[int, bytes]]:
        frame = parse(data)
        if not frame.is_inagg:
            return self.forwarding(port, frame)
        return self.admission(port, frame)

    def admission(self, port: int, frame: Frame) -> list[tuple[int, bytes]]:
        """JobAdmission, then SlotState/ValueAggregation (the engine), JobCounters and
        ResultReplication."""
        data = frame.data
        if len(data) < INAGG_AT + HEADER_BYTES:
            self.counters.count(GLOBAL_DROPS, _GLOBAL_CODE["truncated"])
            return []
        if data[INAGG_AT] >> 4 != VERSION:
            self.counters.count(GLOBAL_DROPS, _GLOBAL_CODE["bad_version"])
            return []
        job_id = struct.unpack_from("!H", data, INAGG_AT + 2)[0]
        admit = self.tables[JOB_TABLE].lookup((job_id,))
        if admit is None:                      # not admitted to the switch: forward untouched
            return self.forwarding(port, frame)
        udp_len = struct.unpack_from("!H", data, ETH + IP + 4)[0]
        src_addr = struct.unpack_from("!I", data, ETH + 12)[0]
        inagg = data[INAGG_AT: ETH + IP + max(udp_len, UDP)]
        emits = self.engine.process(inagg, (port, src_addr))
        self.job_counters(admit.param("job_index"), self.engine.last_outcome, bool(emits))
        return [out for emit in emits for out in self.result_replication(port, frame, admit, emit)]

    def job_counters(self, job_index: int, outcome: str, result: bool) -> None:
        c = self.counters
        c.count(JOB_PACKETS, job_index)
        if outcome in ("first", "add"):
            c.count(JOB_AGGREGATED, job_index)
            if result:
                c.count(JOB_RESULTS, job_index)
        elif outcome in ("dup_pending", "dup_done"):
            c.count(JOB_DUPLICATES, job_index)
        else:
            c.count(JOB_DROPS, job_index * len(DROP_REASONS) + _DROP_CODE[outcome])

    def result_replication(self, port: int, frame: Frame, admit: Action, emit: Emit):
        """ResultReplication + ReplicaRewrite: swap addresses, then unicast (DUP_DONE) or
        one replica per multicast group member, addressed by replica_table."""
        d = frame.data
        eth = d[6:12] + d[0:6] + d[12:14]
        ip = bytearray(d[ETH: ETH + IP])
        ip[12:20] = d[ETH + 16: ETH + 20] + d[ETH + 12: ETH + 16]
        udp_ports = d[ETH + IP + 2: ETH + IP + 4] + d[ETH + IP: ETH + IP + 2]
        if self.engine.last_outcome == "dup_done":
            return [(port, build_frame(eth, ip, udp_ports, emit.data))]
        out = []
        replicas = self.pre.groups.get(admit.param("mcast_grp"), ())
        for replica in replicas:
            e, i, u = eth, bytearray(ip), udp_ports
            if replica.instance:
                rewrite = self.tables[REPLICA_TABLE].lookup((emit.job.job_id, replica.instance))
                if rewrite is None:
                    continue
                e = rewrite.param("mac").to_bytes(6, "big") + eth[6:]
                i[16:20] = rewrite.param("addr").to_bytes(4, "big")
                u = udp_ports[:2] + rewrite.param("udp_port").to_bytes(2, "big")
            out.append((replica.port, build_frame(e, i, u, emit.data)))
        return out

    def forwarding(self, port: int, frame: Frame) -> list[tuple[int, bytes]]:
        """Forwarding (l2_table) + the flood pruning of ReplicaRewrite."""
        if frame.dst_mac < 0:
            return []
        table = self.tables[L2_TABLE]
        action = table.lookup((frame.dst_mac,)) or table.default
        if action.name.endswith(".forward"):
            return [(action.param("port"), frame.data)]
        if action.name.endswith(".flood"):
            return [(r.port, frame.data) for r in self.pre.groups.get(action.param("group"), ())
                    if r.port != port]
        return []


def build_frame(eth: bytes, ip: bytearray, udp_ports: bytes, payload: bytes) -> bytes:
    """Ethernet + IPv4 (length and checksum recomputed) + UDP (checksum 0) + payload."""
    ip[2:4] = (IP + UDP + len(payload)).to_bytes(2, "big")
    ip[10:12] = b"\0\0"
    ip[10:12] = ipv4_checksum(bytes(ip)).to_bytes(2, "big")
    udp = udp_ports + (UDP + len(payload)).to_bytes(2, "big") + b"\0\0"
    return eth + bytes(ip) + udp + payload
