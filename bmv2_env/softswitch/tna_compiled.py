"""The Tofino program as bf-p4c built it, executable for the headers a result's path rewrites:
each action's primitives from the committed ``context.json`` (``ModifyField``: ``set``,
``DirectAlu``: ``add``, ``sub``, ``and``, ``or``, ``xor``; every other primitive (stateful ALUs,
counters, drops, the bridged header's setValid) belongs to the slot logic that
``tna_slot_model`` runs register by register), and the parsers from the committed
``parser.json`` (the states of bf-p4c's assembly, ``make tofino``: per row the fields it
extracts, the validity bits it sets, its shift and next state). This bf-p4c writes no match
values into the assembly, so where a state has several rows the walk takes the one toward the
P4 parser's next state for the packet (``CompiledParser``): which branches exist, and what each
extracts, are the compiler's; the choice among them is the P4's.

Why: a hand reading of the P4 repeats the P4's mistakes. ``dst = src; src = dst`` in one action
compiles to ``dst <- src`` alone, and a parser that recognises inagg by a UDP port the first pass
rewrote never reaches the inagg header again: this module runs what the chip would run, so the
model's result frames (``TofinoModelPipeline``) come from the compiled rewrites and the
compiled second-pass and egress parsers, and a bug like those fails a test on both chips.

An action runs as a VLIW instruction: every primitive reads the PHV as it was before the
action, then all of them write (``run_action``)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from inagg.controller.artifacts import p4_dir
from inagg.controller.program import read_artifact

_ALU = {"set": lambda a, b: a, "add": lambda a, b: a + b, "sub": lambda a, b: a - b,
        "and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b}
# what the pipeline models itself (registers, counters, drops, headers); CountPrimitive is a
# counter indexed by action data (SourceGuard's guard_drops)
_SLOT_LOGIC = {"ExecuteStatefulAluFromHashPrimitive", "CountFromHashPrimitive", "CountPrimitive",
               "DropPrimitive", "AddHeaderPrimitive"}


def immediate(text: str) -> int:
    """A context.json immediate: ``4w2``, ``16w0`` or a decimal."""
    return int(text.split("w")[-1], 0)


@dataclass(frozen=True)
class Primitive:
    """One ALU operation of an action: ``dst = op(src1, src2) & mask`` (masked into dst)."""

    op: str
    dst: str
    mask: int
    srcs: tuple[tuple[str, str], ...]   # (type: phv | immediate | action_param, name)

    def value(self, phv: dict[str, int], params: dict[str, int]) -> int:
        vals = []
        for kind, name in self.srcs:
            if kind == "phv":
                vals.append(phv.get(name, 0))
            elif kind == "immediate":
                vals.append(immediate(name))
            elif kind == "action_param":
                vals.append(params[name])
            else:
                raise ValueError(f"source of kind {kind} in an action: not modelled")
        return _ALU[self.op](*(vals + [0])[:2])


def _primitive(p: dict) -> Primitive | None:
    if p["name"] in _SLOT_LOGIC:
        return None
    if p["name"] not in ("ModifyFieldPrimitive", "DirectAluPrimitive") or p["operation"] not in _ALU:
        raise ValueError(f"primitive {p['name']} ({p.get('operation')}) not modelled")
    srcs = tuple((p[s]["type"], p[s]["name"]) for s in ("src1", "src2") if s in p)
    return Primitive(p["operation"], p["dst"]["name"], immediate(p["dst_mask"]["name"]), srcs)


def compiled_actions(context: dict) -> dict[str, tuple[Primitive, ...]]:
    """Every action of the program (its fully qualified P4 name) -> its primitives that write
    PHV fields, as bf-p4c compiled them."""
    actions: dict[str, tuple[Primitive, ...]] = {}
    for table in context["tables"]:
        for a in table.get("actions", ()):
            if "primitives" in a:
                prims = (_primitive(p) for p in a["primitives"])
                actions.setdefault(a["name"], tuple(p for p in prims if p is not None))
    return actions


def run_action(prims: tuple[Primitive, ...], phv: dict[str, int],
               params: dict[str, int] | None = None) -> None:
    """One action on ``phv`` (field -> value), as the chip runs it: every source read first."""
    params = params or {}
    writes = [(p, p.value(phv, params)) for p in prims]
    for p, v in writes:
        phv[p.dst] = (phv.get(p.dst, 0) & ~p.mask) | (v & p.mask)


# -- header layouts: the P4's header types, read from the sources both programs compile ---------

_P4 = p4_dir()   # the checkout's p4/ or an installed wheel's copy
_HEADER_FILES = (_P4 / "include" / "headers.p4", _P4 / "tofino" / "types.p4")
_TYPEDEFS = {"PortId_t": 9}   # tna.p4 / t2na.p4


def header_layouts() -> dict[str, tuple[tuple[str, int], ...]]:
    """Header type (``ethernet``, ``bridged``, ...: the name without ``_h``) -> its fields and
    widths, in wire order."""
    layouts = {}
    for path in _HEADER_FILES:
        for name, body in re.findall(r"^header (\w+)_h \{(.*?)^\}", path.read_text(), re.M | re.S):
            fields = []
            for ty, field in re.findall(r"^\s*((?:bit|int)<\d+>|\w+)\s+(\w+);", body, re.M):
                width = _TYPEDEFS[ty] if ty in _TYPEDEFS else int(ty[ty.index("<") + 1:-1])
                fields.append((field, width))
            layouts[name] = tuple(fields)
    return layouts


LAYOUTS = header_layouts()


def header_bytes(header: str) -> int:
    return sum(w for _, w in LAYOUTS[header]) // 8


def unpack(header: str, data: bytes, at: int = 0) -> dict[str, int]:
    """The fields of ``header`` at ``data[at:]`` (``hdr.<header>.<field>`` -> value)."""
    n = header_bytes(header)
    word, shift, out = int.from_bytes(data[at:at + n], "big"), 8 * n, {}
    for field, width in LAYOUTS[header]:
        shift -= width
        out[f"hdr.{header}.{field}"] = (word >> shift) & ((1 << width) - 1)
    return out


def pack(header: str, phv: dict[str, int]) -> bytes:
    """``header``'s bytes from its fields in ``phv`` (a field never written is 0)."""
    word = 0
    for field, width in LAYOUTS[header]:
        word = (word << width) | (phv.get(f"hdr.{header}.{field}", 0) & ((1 << width) - 1))
    return word.to_bytes(header_bytes(header), "big")


# -- the parsers: the compiled states, walked along the P4 parser's choices -----------------------

def p4_source(chip: str, text: str) -> str:
    """``text`` as bf-p4c sees it for ``chip``: the ``#if __TARGET_TOFINO__`` branches that apply
    (every other conditional kept)."""
    number, keep, stack = 2 if chip == "tofino2" else 1, [], []
    for line in text.splitlines():
        target = re.match(r"\s*#if __TARGET_TOFINO__ (==|!=) (\d)", line)
        if target:
            stack.append((target.group(1) == "==") == (int(target.group(2)) == number))
        elif re.match(r"\s*#if", line):
            stack.append(None)
        elif re.match(r"\s*#else", line) and stack[-1] is not None:
            stack[-1] = not stack[-1]
        elif re.match(r"\s*#endif", line):
            stack.pop()
        elif all(s is not False for s in stack):
            keep.append(line)
    return "\n".join(keep)


def p4_constants(chip: str) -> dict[str, int]:
    consts = {}
    for path in (_P4 / "include" / "constants.p4", _P4 / "tofino" / "types.p4"):
        for name, value in re.findall(r"const bit<\d+>\s+(\w+)\s*=\s*(\w+);", p4_source(chip, path.read_text())):
            consts[name] = int(value, 0)
    return consts


Keyset = tuple[tuple[int, int], ...]   # a select case: (value, mask) per key


@dataclass(frozen=True)
class P4State:
    extracts: tuple[str, ...]                 # headers, in order (intrinsic metadata left out)
    keys: tuple[str, ...]                     # the select's expressions; () for a plain transition
    cases: tuple[tuple[Keyset | None, str], ...]   # (keyset or None = default, next)


def _keyset(text: str, consts: dict[str, int]) -> Keyset:
    """A select case's keyset (``(5, 0, 17)``, ``RECIRC_PORT_LOCAL``, ``BASE &&& MASK``): each
    key's value and mask (all ones where the case gives no mask)."""
    def number(v: str) -> int:
        return consts[v] if v in consts else int(v, 0)
    out = []
    for key in text.strip("() ").split(","):
        value, _, mask = key.partition("&&&")
        out.append((number(value.strip()), number(mask.strip()) if mask else -1))
    return tuple(out)


def _matches(keyset: Keyset | None, key: tuple[int, ...]) -> bool:
    return keyset is None or all(k & m == v & m for (v, m), k in zip(keyset, key))


def p4_parser(chip: str, name: str) -> dict[str, P4State]:
    """The states of parser ``name`` in p4/tofino/parser.p4 for ``chip``: what the walk's choice
    at a state with several compiled rows follows (the assembly has no match values)."""
    text = p4_source(chip, (_P4 / "tofino" / "parser.p4").read_text())
    body = re.search(rf"^parser {name}\(.*?^\}}", text, re.M | re.S).group(0)
    consts, states = p4_constants(chip), {}
    for st, sbody in re.findall(r"state (\w+) \{(.*?)\n    \}", body, re.S):
        extracts = tuple(h for h in re.findall(r"pkt\.extract\(hdr\.(\w+)\)", sbody))
        sel = re.search(r"transition select\((.*?)\) \{(.*?)\}", sbody, re.S)
        if not sel:
            states[st] = P4State(extracts, (), ((None, re.search(r"transition (\w+);", sbody).group(1)),))
            continue
        cases = [(None if keyset == "default" else _keyset(keyset, consts), nxt)
                 for keyset, nxt in re.findall(r"^\s*(.+?):\s*(\w+);", sel.group(2), re.M)]
        states[st] = P4State(extracts, tuple(k.strip() for k in sel.group(1).split(",")), tuple(cases))
    return states


def p4_path(states: dict[str, P4State], data: bytes, port_low: int) -> list[str]:
    """The P4 states ``data`` (the packet from the first header after intrinsic metadata) walks
    through; ``port_low``: ig_intr_md.ingress_port[6:0]."""
    path, state, pos, phv = [], "start", 0, {"ig_intr_md.ingress_port[6:0]": port_low}
    while state in states:
        path.append(state)
        s = states[state]
        for h in s.extracts:
            if h not in LAYOUTS or pos + header_bytes(h) > len(data):
                return path
            phv.update(unpack(h, data, pos))
            pos += header_bytes(h)
        key = tuple(phv.get(k, 0) for k in s.keys)
        state = next(nxt for keyset, nxt in s.cases if _matches(keyset, key))
    return path


_PARSERS = {"ingress": "InaggIngressParser", "egress": "InaggEgressParser"}


def _field_layout(field: str) -> tuple[int, int] | None:
    """``hdr.<header>.<field>``'s bit offset in its header and its width (None: not a header of
    LAYOUTS)."""
    parts = field.split(".", 2)
    if len(parts) != 3:            # a header stack's element (the values): not one of LAYOUTS
        return None
    _, header, name = parts
    at = 0
    for f, width in LAYOUTS.get(header, ()):
        if f == name:
            return at, width
        at += width
    return None


def read_bits(data: bytes, at: int, width: int) -> int:
    """The ``width`` bits of ``data`` from bit ``at`` (bits past its end read 0)."""
    first, last = at // 8, (at + width - 1) // 8
    word = int.from_bytes(data[first:last + 1].ljust(last + 1 - first, b"\0"), "big")
    return (word >> (8 * (last + 1) - at - width)) & ((1 << width) - 1)


@dataclass
class Parsed:
    """What a compiled parser extracted: where in the packet (bytes after the parser's intrinsic
    metadata) each valid header starts, and the fields the walk's rows extracted of the valid
    headers, each read where its row took it (a field no row extracted is not there: the
    deparser would emit whatever its container held)."""

    headers: dict[str, int]
    phv: dict[str, int]
    extracted: dict[str, int]   # every field the walk extracted, of a header valid or not (egress
                                # tests no validity of the bridged header: bf-p4c sets no bit)

    def end(self) -> int:
        """The first byte after the last valid header of LAYOUTS (0: none)."""
        return max((at + header_bytes(h) for h, at in self.headers.items() if h in LAYOUTS), default=0)


class CompiledParser:
    """One gress's compiled parser (tools/tofino_parser.py's reading of the assembly). A packet
    walks its states from the start, each row extracting what bf-p4c placed there (a field
    extracted in slices counts once the row takes all of them: the tool records it whole),
    setting the validity bits it sets and clearing those it clears (Tofino 2's first pass: the
    bridged header start read); where a state has several rows, the row whose next state is the
    P4 parser's next choice for this packet (no row for it: the one that ends), as the assembly
    carries no match values."""

    def __init__(self, compiled: dict, p4: dict[str, P4State]) -> None:
        self.start, self.adj, self.states, self.p4 = compiled["start"], compiled["hdr_len_adj"], compiled["states"], p4

    @staticmethod
    def _base(state: str) -> str:
        base = state.split(".$")[0]
        return "start" if base == "$entry_point" else base

    def _row(self, state: str, rows: list[dict], path: list[str]) -> dict:
        if len(rows) == 1:
            return rows[0]
        here = self._base(state)
        later = path[path.index(here) + 1:] if here in path else path
        for target in later:
            for row in rows:
                if self._base(row["next"]) == target:
                    return row
        return next((r for r in rows if r["next"] == "end"), rows[-1])

    def _extracted(self, data: bytes, port_low: int) -> tuple[dict[str, int], set[str]]:
        """The walk: each field of LAYOUTS it extracts -> its first bit in ``data``; the
        headers valid at its end."""
        path = p4_path(self.p4, data, port_low)
        state, pos, valid, taken, seen = self.start, 0, set(), {}, set()
        while state != "end" and state in self.states and state not in seen:
            seen.add(state)
            row = self._row(state, self.states[state], path)
            for field, bit in sorted(row["fields"].items(), key=lambda f: f[1]):
                if _field_layout(field) is not None:
                    taken.setdefault(field, 8 * (pos - self.adj) + bit)
            valid.update(row["valid"])
            valid.difference_update(row["invalid"])
            pos += row["shift"]
            state = row["next"]
        return taken, valid

    def parse(self, data: bytes, port_low: int = 0) -> Parsed:
        taken, valid = self._extracted(data, port_low)
        headers, phv, extracted = {}, {}, {}
        for field, at in taken.items():     # a header starts where its first field taken says
            header = field.split(".")[1]
            off, width = _field_layout(field)
            extracted[field] = read_bits(data, at, width)
            if header in valid:
                headers.setdefault(header, (at - off) // 8)
                phv[field] = extracted[field]
        return Parsed(headers, phv, extracted)


class CompiledProgram:
    """A chip's committed build (p4/out/<chip>/): its actions and its two parsers."""

    def __init__(self, chip: str, context: dict, parsers: dict) -> None:
        self.chip = chip
        self.recirc_port = p4_constants(chip)["RECIRC_PORT_LOCAL"]
        self.actions = compiled_actions(context)
        self.parsers = {g: CompiledParser(parsers[g], p4_parser(chip, name)) for g, name in _PARSERS.items()}

    @classmethod
    def load(cls, chip: str) -> "CompiledProgram":
        from inagg.controller.config import default_program
        files = default_program(chip).files
        parser_file = Path(files["context"]).parent / "parser.json"
        return cls(chip, json.loads(read_artifact(files["context"])), json.loads(parser_file.read_text()))

    def run(self, action: str, phv: dict[str, int], params: dict[str, int] | None = None) -> None:
        run_action(self.actions[action], phv, params)

    def parse(self, gress: str, data: bytes, port_low: int = 0) -> Parsed:
        return self.parsers[gress].parse(data, port_low)
