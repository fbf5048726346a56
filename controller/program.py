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
    tofino  | P4Info, tofino.bin, context.json,      | the program packed for the switch's P4Runtime
            | bfrt.json                              | server: bf_switchd (PI) or Stratum
            |                                        | (controller/tofino/config.py)
    tofino2 | the same, built for t2na (tofino2.bin) | the same packing (PI and Stratum read it
            |                                        | alike for either chip)
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from inagg.controller.p4info import P4Info
from inagg.controller.tofino.config import SERVERS, TofinoDeviceConfig

# The Tofino chips: one TNA program (p4/tofino/), compiled per chip into p4/out/<target>/.
TOFINO_CHIPS: tuple[str, ...] = ("tofino", "tofino2")
TARGETS: tuple[str, ...] = ("bmv2", "soft", *TOFINO_CHIPS)
# The files each target's program consists of (config keys), besides the P4Info.
DEVICE_FILES: dict[str, tuple[str, ...]] = {
    "bmv2": ("bmv2_json",),
    "soft": ("bmv2_json",),
    **{chip: ("binary", "context", "bfrt") for chip in TOFINO_CHIPS},
}
# The pipeline name bf-p4c gives inagg's TNA program: `Switch(pipe) main` in p4/tofino/inagg.p4.
TOFINO_PIPELINE = "pipe"


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
    server: str = "bf_switchd"   # a Tofino chip: the P4Runtime server whose packing it is pushed in

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"unknown target {self.target!r}: one of {', '.join(TARGETS)}")
        if self.server not in SERVERS:
            raise ValueError(f"unknown P4Runtime server {self.server!r}: one of {', '.join(SERVERS)}")
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
        if self.target not in TOFINO_CHIPS:
            return read_artifact(self.files["bmv2_json"])
        binary, context, bfrt = (read_artifact(self.files[k]) for k in DEVICE_FILES[self.target])
        # a broken artifact is refused here (TofinoDeviceConfig checks), not by the switch
        return TofinoDeviceConfig(self.p4info.program_name, binary, context, TOFINO_PIPELINE,
                                  bfrt).pack(self.server)
