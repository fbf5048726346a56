"""A switch's P4 program: its target, its compiled artifacts, and the device config pushed to it.

The controller never assumes a target: the config names each switch's ``target`` and the files
its program was compiled to, and everything the controller needs to know about the program
(slot pool, values per packet, encapsulations, counter layout) comes from that P4Info.

Targets and what SetForwardingPipelineConfig carries as ``p4_device_config``:

    target  | artifacts                              | p4_device_config
    --------+----------------------------------------+-------------------------------------------
    bmv2    | P4Info, BMv2 JSON                      | the JSON
    soft    | P4Info, BMv2 JSON                      | the JSON (the software data plane checks
            |                                        | the P4Info only)
    tofino  | P4Info, tofino.bin, context.json       | PI's Tofino packing (pack_tofino_config)
"""

from __future__ import annotations

import gzip
import json
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from inagg.control.p4info import P4Info

TARGETS: tuple[str, ...] = ("bmv2", "soft", "tofino")
# The files each target's program consists of (config keys), besides the P4Info.
DEVICE_FILES: dict[str, tuple[str, ...]] = {
    "bmv2": ("bmv2_json",),
    "soft": ("bmv2_json",),
    "tofino": ("binary", "context"),
}

_LENGTH = struct.Struct("<I")


def pack_tofino_config(program_name: str, binary: bytes, context: bytes) -> bytes:
    """The p4_device_config bf_switchd's P4Runtime server (PI's Tofino backend) unpacks: the
    program name, the compiled binary (tofino.bin) and context.json, each preceded by its
    length as a little-endian uint32.

    The layout is PI's legacy Tofino packing, as written by Stratum's
    BfPipelineConfigToPiConfig (stratum/hal/lib/tdi/tdi_pipeline_utils.cc: Uint32ToLeByteStream
    of the name size, the name, the binary size, the binary, the context size, the context) and
    by p4runtime test tools for bf_switchd (Yi-Tseng/P4-runtime-test-tool,
    p4runtime_lib/tofino.py: struct.pack("<i", len(...)) before each part)."""
    name = program_name.encode()
    if not name:
        raise ValueError("tofino device config: empty program name")
    return b"".join(_LENGTH.pack(len(part)) + part for part in (name, binary, context))


def unpack_tofino_config(data: bytes) -> tuple[str, bytes, bytes]:
    """(program name, binary, context) of a packed Tofino device config; ValueError naming the
    part that does not fit, or trailing bytes."""
    parts, at = [], 0
    for what in ("program name", "binary", "context"):
        if at + _LENGTH.size > len(data):
            raise ValueError(f"tofino device config: truncated before the {what} length")
        (n,) = _LENGTH.unpack_from(data, at)
        at += _LENGTH.size
        if at + n > len(data):
            raise ValueError(f"tofino device config: {what} length {n} runs past the end "
                             f"({len(data) - at} bytes left)")
        parts.append(data[at:at + n])
        at += n
    if at != len(data):
        raise ValueError(f"tofino device config: {len(data) - at} trailing bytes")
    name, binary, context = parts
    return name.decode(), binary, context


def read_artifact(path: Path) -> bytes:
    """A compiled artifact's bytes; ``.gz`` files (how the large Tofino outputs are committed)
    are decompressed."""
    data = Path(path).read_bytes()
    return gzip.decompress(data) if str(path).endswith(".gz") else data


@dataclass(frozen=True)
class Program:
    """One switch's program: where its artifacts are and how to push them."""

    target: str
    p4info_path: Path
    files: dict[str, Path]   # DEVICE_FILES[target] -> path

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"unknown target {self.target!r}: one of {', '.join(TARGETS)}")
        missing = [k for k in DEVICE_FILES[self.target] if k not in self.files]
        if missing:
            raise ValueError(f"{self.target} program: missing artifact(s) {', '.join(missing)}")
        for path in (self.p4info_path, *self.files.values()):
            if not Path(path).is_file():
                raise ValueError(f"{self.target} program: no file {path}")

    @cached_property
    def p4info(self) -> P4Info:
        return P4Info.load(self.p4info_path)

    def device_config(self) -> bytes:
        """The p4_device_config of this program for its target."""
        if self.target != "tofino":
            return read_artifact(self.files["bmv2_json"])
        context = read_artifact(self.files["context"])
        json.loads(context)   # a broken context.json is refused here, not by the switch
        return pack_tofino_config(self.p4info.program_name, read_artifact(self.files["binary"]),
                                  context)
