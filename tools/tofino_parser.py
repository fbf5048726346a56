"""The parsers of a bf-p4c build, as the TNA model runs them (inagg.bmv2_env.softswitch.tna_compiled).

Input: a bf-p4c output directory (``pipe/inagg.bfa``, the compiler's assembly). Output (stdout):
JSON, per gress (``ingress``, ``egress``): the start state, the bytes of intrinsic metadata in
front of the packet (``hdr_len_adj``) and each state's rows in TCAM order, a row being what it
extracts (``fields``: each header field -> its first bit in the parser's window), the headers
it makes valid (``valid``) and invalid again (``invalid``: Tofino 2's start reads a bridged
header that a first pass's row drops), ``shift`` (bytes consumed) and ``next`` (a state, or
``end``). This bf-p4c writes no match values into the assembly (every row reads ``*``), so which row a packet
takes is left to the model (tna_compiled.CompiledParser).

A field bf-p4c places in several containers is extracted in slices (``hdr.inagg.epoch[15:8]``
into one byte, ``[7:0]`` into another). Its slices are the ones the gress's ``phv`` section
allocates (``hdr.inagg.epoch.8-15``, ``.0-7``: the field's width is one more than their highest
bit). A row that extracts slices covering every bit of the field records it as a whole field,
at the bit where its most significant slice puts the field's first bit, once every slice puts
it at the same bit (a row that does not is an error, never a guess); a row extracting only some
slices records nothing of the field.

    python -m tools.tofino_parser build/tofino > p4/out/tofino/parser.json
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

_FIELD = re.compile(r"(?:bit\[(\d+)(?:\.\.\d+)?\] -> \S+(?: bit\[[\d.]+\])?: )?(?:ingress|egress)::(hdr\.[\w.$]+)(?:\[(\d+):(\d+)\])?")
_RANGE = re.compile(r"^(\d+)(?:\.\.(\d+))?: \S+")
_PHV_SLICE = re.compile(r"^  (hdr\.[\w.$\[\]]+)\.(\d+)-(\d+): ")


def field_widths(phv_lines: list[str]) -> dict[str, int]:
    """A gress's ``phv`` section -> each field it allocates in slices (``hdr.x.f.lo-hi``) and
    the field's width (its highest allocated bit + 1)."""
    widths: dict[str, int] = {}
    for line in phv_lines:
        m = _PHV_SLICE.match(line)
        if m:
            widths[m.group(1)] = max(widths.get(m.group(1), 0), int(m.group(3)) + 1)
    return widths


def whole_field(name: str, slices: list[tuple[int, int, int]], width: int | None) -> int | None:
    """The first bit of field ``name`` in the window, from the slices a row extracts
    (``(hi, lo, bit)``: the field's bits hi..lo, the first of them at window bit ``bit``); None
    when they do not cover the field's ``width`` bits (or its width is unknown)."""
    covered = sorted((lo, hi) for hi, lo, _ in slices)
    if width is None or [lo for lo, _ in covered] != [0] + [hi + 1 for _, hi in covered[:-1]] \
            or covered[-1][1] != width - 1:
        return None
    starts = {bit - (width - 1 - hi) for hi, _, bit in slices}
    if len(starts) != 1:
        raise ValueError(f"the slices of {name} disagree on where it starts: {sorted(slices)}")
    return starts.pop()


def _join_slices(row: dict, widths: dict[str, int]) -> None:
    """A row's sliced fields, each covered by its slices, among its whole ``fields``."""
    for name, slices in row.pop("slices").items():
        bit = whole_field(name, slices, widths.get(name))
        if bit is not None:
            row["fields"].setdefault(name, bit)


def _row_line(row: dict, line: str, last_byte: list) -> None:
    """One line of a row: an extraction (a byte range and its field or field slices, maybe on
    the comment lines after it; ``last_byte``: the range's first and last byte, None after a
    constant, and the shift of its comments' bits), a constant set (``$valid``), shift or next.

    A comment's ``bit[n]`` counts from the start of the state bf-p4c extracted the header in,
    which is the window's where that state is this one; where bf-p4c merged it into an earlier
    state (parse_udp into parse_ipv4's split, Tofino 1's parse_harvest into start: the bridged
    header at window byte 16, its bits commented from 0), the range's bytes say where the
    window has them: its first comment bit is in its first byte."""
    body, _, comment = line.strip().partition("#")
    body = body.strip()
    key, _, value = body.partition(":")
    if key in ("shift", "next"):
        row[key] = int(value) if key == "shift" else value.strip()
        return
    m = _RANGE.match(body)
    if body:                       # a new line of the row; comment lines continue the last one
        last_byte[:] = [int(m.group(1)), int(m.group(2) or m.group(1)), None] if m else [None, None, None]
    f = _FIELD.search(comment)
    if not f:
        return
    name = f.group(2)
    if name.endswith(".$valid"):                       # "value 1 -> ..." sets it, "value 0" clears it
        cleared = re.search(r"\bvalue 0 ->", comment) is not None
        row["invalid" if cleared else "valid"].append(name[len("hdr."):-len(".$valid")])
    elif last_byte[0] is not None:                     # a field or a slice from the packet
        bit = 8 * last_byte[0]
        if f.group(1) is not None:
            commented = int(f.group(1))
            if last_byte[2] is None:     # the range's first comment: in the window, or shifted
                in_window = bit <= commented < 8 * (last_byte[1] + 1)
                last_byte[2] = 0 if in_window else bit - 8 * (commented // 8)
            bit = commented + last_byte[2]
        if f.group(3) is None:
            row["fields"].setdefault(name, bit)
        else:
            row["slices"].setdefault(name, []).append((int(f.group(3)), int(f.group(4)), bit))


def parse_gress(lines: list[str], widths: dict[str, int]) -> dict:
    """The lines of one ``parser <gress>:`` section -> start, hdr_len_adj, states (``widths``:
    the gress's sliced fields, ``field_widths``)."""
    out = {"start": "", "hdr_len_adj": 0, "states": {}}
    state, row, last_byte = None, None, [0, 0, None]
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
            row = {"fields": {}, "slices": {}, "valid": [], "invalid": [], "shift": 0, "next": "end"}
            state.append(row)
        elif indent >= 8 and row is not None:
            _row_line(row, line, last_byte)
    for rows in out["states"].values():
        for r in rows:
            _join_slices(r, widths)
    return out


def parsers(bfa: str) -> dict:
    """The assembly -> each gress's parser (its ``parser`` section, read with its ``phv``
    section's sliced fields)."""
    sections, current = {}, None
    for line in bfa.splitlines():
        m = re.match(r"^(parser|deparser|stage|phv) (\w+)", line)
        if m or (line and not line.startswith(" ")):
            keep = m and m.group(1) in ("parser", "phv")
            current = sections.setdefault((m.group(1), m.group(2)), []) if keep else None
            continue
        if current is not None:
            current.append(line)
    return {gress: parse_gress(lines, field_widths(sections.get(("phv", gress), [])))
            for (kind, gress), lines in sections.items() if kind == "parser"}


def main(argv: list[str]) -> int:
    build = Path(argv[1])
    print(json.dumps(parsers((build / "pipe" / "inagg.bfa").read_text()), indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
