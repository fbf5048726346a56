"""P4Info lookups and P4Runtime value encoding, shared by the controller and the software data
plane (which validates what it is sent against the same P4Info).

Built on p4runtime-shell's ``Context`` (names, short names, ids) so both sides resolve names
exactly as the p4runtime-shell tooling does.

Every control-plane command (``inagg-controller``, ``inagg-soft-switch``, ``inagg``, ``inagg-demo``)
imports this module before any other P4Runtime one, so a worker's install without the control
plane (``pip install inagg[torch]``) is told here which extra to install."""

from __future__ import annotations

import re
from pathlib import Path

from google.protobuf import text_format

try:
    from p4.config.v1 import p4info_pb2
    from p4runtime_sh.context import Context, P4Type
except ModuleNotFoundError as e:
    raise ModuleNotFoundError(f"{e}: inagg's control plane (P4Runtime) is not installed here; "
                              f"pip install 'inagg[control]'", name=e.name) from e

__all__ = ["P4Info", "P4Type", "encode", "decode", "same_p4info", "same_program"]

# The register that holds each slot's owner tag, by target: its size is the slot pool.
SLOT_POOL_REGISTERS = ("slot_tag", "map0")
# K, the values per packet of a target, as job_table carries it (p4/include/job_admission.p4).
VALUES_PER_PACKET_ANNOTATION = re.compile(r"@inagg_values_per_packet\((\d+)\)")
# The TNA program's recirculation ports (p4/tofino/recirc_spread.p4): the pipe-local
# recirculation port, and the pipe-local loopback ports the parser takes second passes on
# (base, mask).
RECIRCULATION_ANNOTATION = re.compile(r"@inagg_recirculation_ports\((\w+) *, *(\w+) *, *(\w+)\)")


def same_p4info(a: p4info_pb2.P4Info, b: p4info_pb2.P4Info) -> bool:
    """Whether two P4Infos are the same program. Compared serialized: a TNA P4Info carries
    Tofino extern descriptions (barefoot.PortMetadata) as Any messages whose types this process
    does not know, which protobuf's == cannot compare."""
    return a.SerializeToString(deterministic=True) == b.SerializeToString(deterministic=True)


def without_values_per_packet(message: p4info_pb2.P4Info) -> p4info_pb2.P4Info:
    """A copy of a P4Info without its K annotation: what is left is the program itself."""
    copy = p4info_pb2.P4Info()
    copy.CopyFrom(message)
    for table in copy.tables:
        kept = [a for a in table.preamble.annotations if not VALUES_PER_PACKET_ANNOTATION.fullmatch(a)]
        del table.preamble.annotations[:]
        table.preamble.annotations.extend(kept)
    return copy


def same_program(a: p4info_pb2.P4Info, b: p4info_pb2.P4Info) -> bool:
    """Whether two P4Infos are one program built for targets of different K (the BMv2 program
    and the software target's, tools/soft_p4info.py): the same but for the K annotation."""
    return same_p4info(without_values_per_packet(a), without_values_per_packet(b))


def encode(value: int, bitwidth: int) -> bytes:
    """An unsigned value as a P4Runtime bytestring (padded to the field's width)."""
    if not 0 <= value < (1 << bitwidth):
        raise ValueError(f"value {value} does not fit in {bitwidth} bits")
    return value.to_bytes((bitwidth + 7) // 8, "big")


def decode(data: bytes, bitwidth: int) -> int:
    """A P4Runtime bytestring (canonical or padded) as an int; ValueError if too wide."""
    value = int.from_bytes(data, "big")
    if not data or value >= (1 << bitwidth) or len(data) > (bitwidth + 7) // 8:
        raise ValueError(f"bytestring {data.hex() or '(empty)'} is not a {bitwidth}-bit value")
    return value


class P4Info:
    """A loaded P4Info with name/id lookups."""

    def __init__(self, message: p4info_pb2.P4Info) -> None:
        self.message = message
        self.context = Context()
        self.context.set_p4info(message)

    @classmethod
    def load(cls, path: Path | str) -> "P4Info":
        message = p4info_pb2.P4Info()
        text_format.Merge(Path(path).read_text(), message)
        return cls(message)

    @property
    def program_name(self) -> str:
        return self.message.pkg_info.name

    def obj(self, kind: P4Type, name: str):
        found = self.context.get_obj(kind, name)
        if found is None:
            raise KeyError(f"P4Info has no {kind.name} named {name!r}")
        return found

    def has(self, kind: P4Type, name: str) -> bool:
        return self.context.get_obj(kind, name) is not None

    def id(self, kind: P4Type, name: str) -> int:
        return self.obj(kind, name).preamble.id

    def by_id(self, obj_id: int):
        return self.context.get_obj_by_id(obj_id)

    def local_name(self, name: str) -> str:
        """A fully qualified name without the pipeline prefix bf-p4c may add for TNA externs
        ("pipe."), so both targets' objects have the names of the P4 controls (InaggIngress....)."""
        if self.message.pkg_info.arch in ("tna", "t2na"):
            return name.removeprefix("pipe.")
        return name

    @property
    def values_per_packet(self) -> int:
        """K, the int32 values per packet of this program: a property of the target, carried
        by job_table's @inagg_values_per_packet annotation and handed to workers in grants."""
        table = self.obj(P4Type.table, "job_table")
        for note in table.preamble.annotations:
            m = VALUES_PER_PACKET_ANNOTATION.fullmatch(note)
            if m:
                return int(m.group(1))
        raise KeyError(f"{self.program_name}: job_table has no @inagg_values_per_packet annotation")

    @property
    def recirculation_ports(self) -> tuple[int, int, int] | None:
        """The TNA program's pipe-local recirculation port and the (base, mask) of the
        pipe-local ports it reserves for loopback, from recirc_spread's
        @inagg_recirculation_ports; None for a program without recirc_spread (BMv2's)."""
        if not self.has(P4Type.table, "recirc_spread"):
            return None
        for note in self.obj(P4Type.table, "recirc_spread").preamble.annotations:
            m = RECIRCULATION_ANNOTATION.fullmatch(note)
            if m:
                local, base, mask = (int(g, 0) for g in m.groups())
                return local, base, mask
        raise KeyError(f"{self.program_name}: recirc_spread has no @inagg_recirculation_ports annotation")

    @property
    def drop_row_length(self) -> int:
        """Counters per job in job_drops (BMv2: DROP_REASONS; Tofino rounds up to a power of
        two, as it cannot multiply): the job_drops / job_packets size ratio."""
        return self.obj(P4Type.counter, "job_drops").size // self.obj(P4Type.counter, "job_packets").size

    @property
    def encapsulations(self) -> tuple[str, ...]:
        """The encapsulations the program aggregates: RoCEv2 only where it can address (and
        re-checksum) RoCE results, i.e. has set_roce_worker_address."""
        try:
            self.obj(P4Type.action, "set_roce_worker_address")
        except KeyError:
            return ("udp",)
        return ("udp", "roce")

    def table_size(self, name: str) -> int:
        """Entries a table holds (its P4 ``size``)."""
        return self.obj(P4Type.table, name).size

    def counter_size(self, name: str) -> int:
        return self.obj(P4Type.counter, name).size

    @property
    def slot_pool(self) -> int:
        """Aggregator slots per shadow set: the entries of the register holding each slot's
        owner tag (SLOT_POOL_REGISTERS: BMv2's slot_tag; Tofino's map0, where the tag sits
        beside set 0's contributor map, p4/tofino/slot_claim.p4)."""
        for name in SLOT_POOL_REGISTERS:
            try:
                return self.register_size(name)
            except KeyError:
                continue
        raise KeyError(f"{self.program_name}: no slot owner register (one of {SLOT_POOL_REGISTERS})")

    def register_size(self, name: str) -> int:
        """Entries of a register (p4runtime-shell indexes no registers: searched here)."""
        for r in self.message.registers:
            if r.preamble.name == name or r.preamble.name.endswith("." + name):
                return r.size
        raise KeyError(f"P4Info has no register named {name!r}")
