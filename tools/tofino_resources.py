"""The resource summary of a bf-p4c build, as docs/tofino.md and the budget test read it.

Input: a bf-p4c output directory built with ``--verbose 1`` (``pipe/logs/mau.resources.log``,
the compiler's per-stage resource table, and ``pipe/logs/metrics.json``). Output (stdout):
JSON with the stages used, and per resource what the program uses and what the chip has, the
capacity taken from the compiler's own percentage table (value / share), not from a copy here.

    python -m tools.tofino_resources build/tofino > p4/out/tofino/resources.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# mau.resources.log column -> summary key
COLUMNS = {
    "Meter ALU": "stateful_alus",
    "Stats ALU": "stats_alus",
    "SRAM": "sram_blocks",
    "Map RAM": "map_ram_blocks",
    "TCAM": "tcam_blocks",
    "Hash Bit": "hash_bits",
    "Hash Dist Unit": "hash_dist_units",
    "Gateway": "gateways",
    "Logical TableID": "logical_tables",
    "Exact Match Input xbar": "exact_xbar_bytes",
    "Ternary Match Input xbar": "ternary_xbar_bytes",
    "VLIW Instr": "vliw_instructions",
}


def _tables(text: str) -> list[list[list[str]]]:
    """The |-separated tables of a log, each a list of rows of cells."""
    tables, rows = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows and not line.startswith("-"):
            tables.append(rows)
            rows = []
    if rows:
        tables.append(rows)
    return tables


def summarize(build: Path) -> dict:
    logs = Path(build) / "pipe" / "logs"
    counts, shares = [t for t in _tables((logs / "mau.resources.log").read_text())
                      if t[0][0] == "Stage Number"][:2]
    header = counts[0]
    stages = [r for r in counts[1:] if r[0].isdigit()]
    totals = next(r for r in counts if r[0] == "Totals")
    share_rows = {r[0]: r for r in shares[1:] if r[0].isdigit()}
    tables = header.index("Logical TableID")   # the log lists every stage of the chip
    used_stages = [int(r[0]) for r in stages if int(r[tables])]
    summary: dict = {"stages_used": max(used_stages) + 1 if used_stages else 0,
                     "stages_available": len(stages)}
    for column, key in COLUMNS.items():
        i = header.index(column)
        used = int(totals[i])
        per_stage = None
        for r in stages:   # capacity per stage = a stage's count / its share
            pct = float(share_rows[r[0]][i].rstrip("%"))
            if int(r[i]) and pct:
                per_stage = round(int(r[i]) / (pct / 100))
                break
        summary[key] = {"used": used, "per_stage": per_stage}
    metrics = json.loads((logs / "metrics.json").read_text())
    summary["target"] = metrics["target"]
    summary["phv_containers"] = {   # Tofino 2 has no tagalong containers
        kind: sum(c["containers_occupied"] for c in groups) for kind, groups in metrics["phv"].items()}
    return summary


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(summarize(Path(argv[0])), indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
