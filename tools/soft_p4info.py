"""The software target's P4Info: the BMv2 program's P4Info with the software target's own K.

K, the int32 values per packet, is a property of the target (job_table's
``@inagg_values_per_packet`` annotation, read by the controller and granted to workers). BMv2 and
the conformance suite keep the program's 64; the software data plane runs the same program (the
same BMv2 JSON) at a K of its own, limited only by the datagram its ports carry, because its cost
is per packet. This writes that P4Info, identical to the source but for the annotation; ``make
build`` runs it after p4c, and tests/test_soft_p4info.py fails when the committed one is stale::

    python -m tools.soft_p4info --source p4/out/bmv2/inagg.p4info.txtpb --values-per-packet K --out PATH
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ANNOTATION = re.compile(r'annotations: "@inagg_values_per_packet\(\d+\)"')


def soft_p4info_text(source: str, values_per_packet: int) -> str:
    """``source`` (a P4Info in text format) with its one K annotation set to ``values_per_packet``."""
    if values_per_packet < 1:
        raise ValueError(f"values per packet must be >= 1, got {values_per_packet}")
    found = len(ANNOTATION.findall(source))
    if found != 1:
        raise ValueError(f"the source P4Info has {found} @inagg_values_per_packet annotations, not one")
    return ANNOTATION.sub(f'annotations: "@inagg_values_per_packet({values_per_packet})"', source)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.soft_p4info", description=__doc__.split("\n")[0])
    p.add_argument("--source", type=Path, required=True, help="the BMv2 program's P4Info (text format)")
    p.add_argument("--values-per-packet", type=int, required=True, metavar="K",
                   help="the software target's values per packet")
    p.add_argument("--out", type=Path, required=True, help="where to write the software target's P4Info")
    args = p.parse_args(argv)
    try:
        text = soft_p4info_text(args.source.read_text(), args.values_per_packet)
    except (OSError, ValueError) as e:
        print(f"soft_p4info: {e}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
