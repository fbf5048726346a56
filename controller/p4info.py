"""P4Info lookups and P4Runtime value encoding, shared by the controller and the software data
plane (which validates what it is sent against the same P4Info).

Built on p4runtime-shell's ``Context`` (names, short names, ids) so both sides resolve names
exactly as the p4runtime-shell tooling does."""

from __future__ import annotations

from pathlib import Path

from google.protobuf import text_format
from p4.config.v1 import p4info_pb2
from p4runtime_sh.context import Context, P4Type

P4_DIR = Path(__file__).resolve().parents[1] / "p4"
P4INFO_PATH = P4_DIR / "inagg.p4info.txtpb"
BMV2_JSON_PATH = P4_DIR / "inagg.json"

__all__ = ["P4Info", "P4Type", "P4INFO_PATH", "BMV2_JSON_PATH", "encode", "decode"]


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
    def load(cls, path: Path | str = P4INFO_PATH) -> "P4Info":
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

    def id(self, kind: P4Type, name: str) -> int:
        return self.obj(kind, name).preamble.id

    def by_id(self, obj_id: int):
        return self.context.get_obj_by_id(obj_id)

    def table_size(self, name: str) -> int:
        """Entries a table holds (its P4 ``size``)."""
        return self.obj(P4Type.table, name).size

    def counter_size(self, name: str) -> int:
        return self.obj(P4Type.counter, name).size

    def register_size(self, name: str) -> int:
        """Entries of a register (p4runtime-shell indexes no registers: searched here)."""
        for r in self.message.registers:
            if r.preamble.name == name or r.preamble.name.endswith("." + name):
                return r.size
        raise KeyError(f"P4Info has no register named {name!r}")
