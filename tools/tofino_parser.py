"""The parsers of a bf-p4c build, as the TNA model runs them (inagg.bmv2_env.softswitch.tna_compiled).

Input: a bf-p4c output directory (``pipe/inagg.bfa``, the compiler's assembly). Output (stdout):
JSON, per gress (``ingress``, ``egress``): the start state, the bytes of intrinsic metadata in
front of the packet (``hdr_len_adj``) and each state's rows in TCAM order, a row being what it
extracts (``fields``: each whole header field -> its first bit in the parser's window; slices
of a field split over containers are left out), the headers it
makes valid (``valid``), ``shift`` (bytes consumed) and ``next`` (a state, or ``end``). This
bf-p4c writes no match values into the assembly (every row reads ``*``), so which row a packet
takes is left to the model (tna_compiled.CompiledParser).

    python -m tools.tofino_parser build/tofino > p4/out/tofino/parser.json
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

_FIELD = re.compile(r"(?:bit\[(\d+)(?:\.\.\d+)?\] -> \S+(?: bit\[[\d.]+\])?: )?(?:ingress|egress)::(hdr\.[\w.$]+)(\[\d+:\d+\])?")
_RANGE = re.compile(r"^(\d+)(?:\.\.\d+)?: \S+")




def _row_line(row: dict, line: str, last_byte: list) -> None:
    """One line of a row: an extraction (a byte range and its fields, the fields maybe on the
    comment lines after it; ``last_byte``: the range's first byte, None after a constant), a
    constant set (``$valid``), shift or next."""
    body, _, comment = line.strip().partition("#")
    body = body.strip()
    key, _, value = body.partition(":")
    if key in ("shift", "next"):
        row[key] = int(value) if key == "shift" else value.strip()
        return
    m = _RANGE.match(body)
    if body:                       # a new line of the row; comment lines continue the last one
        last_byte[0] = int(m.group(1)) if m else None
    f = _FIELD.search(comment)
    if not f:
        return
    name = f.group(2)
    if name.endswith(".$valid"):
        row["valid"].append(name[len("hdr."):-len(".$valid")])
    elif last_byte[0] is not None and f.group(3) is None:   # a whole field from the packet
        bit = int(f.group(1)) if f.group(1) is not None else 8 * last_byte[0]
        row["fields"].setdefault(name, bit)


def parse_gress(lines: list[str]) -> dict:
    """The lines of one ``parser <gress>:`` section -> start, hdr_len_adj, states."""
    out = {"start": "", "hdr_len_adj": 0, "states": {}}
    state, row, last_byte = None, None, [0]
    for line in lines:
        indent = len(line) - len(line.lstrip())
        text = line.strip()
        if indent == 2 and ":" in text:
            key, _, value = text.partition(":")
            if key in ("start", "hdr_len_adj"):
                out[key] = value.strip() if key == "start" else int(value)
        elif indent == 4 and text.endswith(":"):
            state = out["states"].setdefault(text[:-1], [])
        elif indent == 6 and state is not None and re.match(r"^[*0-9]", text) and text.endswith(":"):
            row = {"fields": {}, "valid": [], "shift": 0, "next": "end"}
            state.append(row)
        elif indent >= 8 and row is not None:
            _row_line(row, line, last_byte)
    return out


def parsers(bfa: str) -> dict:
    sections, current = {}, None
    for line in bfa.splitlines():
        m = re.match(r"^(parser|deparser|stage|phv) (\w+)", line)
        if m or (line and not line.startswith(" ")):
            current = sections.setdefault(m.group(2), []) if m and m.group(1) == "parser" else None
            continue
        if current is not None:
            current.append(line)
    return {gress: parse_gress(lines) for gress, lines in sections.items()}


def main(argv: list[str]) -> int:
    build = Path(argv[1])
    print(json.dumps(parsers((build / "pipe" / "inagg.bfa").read_text()), indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
