"""P4Testgen's STF tests (p4/testgen/<target>/<run>_NNN.stf, tools/testgen.py) read into what a
replay needs, for any program and any target: the table entries a test installs, the frames it
sends and the frames it expects (nibble masks), nothing else. Nothing here knows inagg's
headers, so a change of the wire format needs only a regeneration.

The two dialects p4testgen writes are both read: BMv2's (``add "table" "key":0x1
"action"("param":0x2)``) and Tofino's (``add table key:0x1 action(param:0x2,...)``, and for a
table with ternary fields ``add table <priority> key:0b1*0 ...``, ``*`` a bit that matches
anything). A command the replay does not know (a register write, a default action, a ``&&&``
or prefix key) is an error, never skipped: a new kind of test must be taught to the replay
before it can pass."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2

from inagg.controller.p4info import P4Info, P4Type, encode

_ADD = re.compile(r'^add\s+"?([\w.]+)"?\s+(.*?)\s*"?([\w.]+)"?\((.*)\)\s*$')
_PAIR = re.compile(r'"?([\w.$\[\]]+)"?\s*:\s*(0x[0-9A-Fa-f]+|0b[01*]+|\d+)')
_PRIORITY = re.compile(r"^(\d+)\s")


@dataclass(frozen=True)
class Entry:
    """One table entry: the names are the P4Info's (fully qualified); a key field's value, or
    (value, mask) where the test leaves bits to match anything; the priority of a table with
    ternary fields (0 for an exact-match table)."""

    table: str
    key: dict[str, int | tuple[int, int]]
    action: str
    params: dict[str, int]
    priority: int = 0


@dataclass(frozen=True)
class Expected:
    """An expected frame: hex nibbles, ``*`` where any nibble is right."""

    port: int
    nibbles: str

    def matches(self, frame: bytes) -> bool:
        got = frame.hex().upper()
        return len(got) == len(self.nibbles) and all(
            want in ("*", have) for want, have in zip(self.nibbles, got))


@dataclass
class StfTest:
    """What one generated test installs, sends and expects (no expect line: nothing leaves)."""

    name: str
    entries: list[Entry] = field(default_factory=list)
    packets: list[tuple[int, bytes]] = field(default_factory=list)
    expects: list[Expected] = field(default_factory=list)


def _number(text: str) -> int:
    return int(text, 0)


def _key_value(text: str) -> int | tuple[int, int]:
    """A key's value; ``0b`` bits with ``*`` (any) as (value, mask)."""
    if not text.startswith("0b") or "*" not in text:
        return _number(text)
    bits = text[2:]
    return int(bits.replace("*", "0"), 2), int("".join("0" if b == "*" else "1" for b in bits), 2)


def parse_add(line: str) -> Entry:
    """An ``add`` line of either dialect; ValueError for ``&&&`` and prefix keys."""
    m = _ADD.match(line)
    if m is None or "&&&" in line or "/" in m.group(2):
        raise ValueError(f"unsupported table entry: {line}")
    table, keys, action, params = m.groups()
    priority = _PRIORITY.match(keys)
    return Entry(table, {k: _key_value(v) for k, v in _PAIR.findall(keys)}, action,
                 {k: _number(v) for k, v in _PAIR.findall(params)}, int(priority[1]) if priority else 0)


def parse(path: Path) -> StfTest:
    """One STF file; ValueError naming the line for any command the replay does not know."""
    test = StfTest(f"{path.parent.name}/{path.stem}")
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word == "add":
            test.entries.append(parse_add(line))
        elif word == "packet":
            port, data = rest.split(None, 1)
            test.packets.append((int(port), bytes.fromhex("".join(data.split()))))
        elif word == "expect":
            port, data = rest.split(None, 1)
            test.expects.append(Expected(int(port), "".join(data.split()).rstrip("$").upper()))
        else:
            raise ValueError(f"{path}: the replay does not know STF command {word!r}: {line}")
    return test


def load(folder: Path) -> list[StfTest]:
    """Every test of one generated target (<run>_NNN.stf), in name order."""
    return [parse(p) for p in sorted(folder.glob("*.stf"))]


def table_update(p4info: P4Info, entry: Entry) -> p4runtime_pb2.Update:
    """The P4Runtime INSERT of ``entry`` (names and widths from the P4Info)."""
    table = p4info.obj(P4Type.table, entry.table)
    fields = {mf.name: mf for mf in table.match_fields}
    message = p4runtime_pb2.TableEntry(table_id=table.preamble.id, priority=entry.priority)
    for name, value in entry.key.items():
        mf = fields[name]
        if mf.match_type != p4info_pb2.MatchField.TERNARY:
            message.match.add(field_id=mf.id).exact.value = encode(value, mf.bitwidth)
            continue
        value, mask = value if isinstance(value, tuple) else (value, (1 << mf.bitwidth) - 1)
        if mask:                          # a field that matches anything is left out
            message.match.add(field_id=mf.id).ternary.CopyFrom(p4runtime_pb2.FieldMatch.Ternary(
                value=encode(value, mf.bitwidth), mask=encode(mask, mf.bitwidth)))
    action = p4info.obj(P4Type.action, entry.action)
    message.action.action.action_id = action.preamble.id
    params = {p.name: p for p in action.params}
    for name, value in entry.params.items():
        p = params[name]
        message.action.action.params.add(param_id=p.id, value=encode(value, p.bitwidth))
    update = p4runtime_pb2.Update(type=p4runtime_pb2.Update.INSERT)
    update.entity.table_entry.CopyFrom(message)
    return update


def verdict(test: StfTest, out: list[tuple[int, bytes]]) -> str | None:
    """None when ``out`` (port, frame) is exactly what ``test`` expects, in any order across
    ports and in order per port; else what differs."""
    want = sorted((e.port for e in test.expects))
    got = sorted(p for p, _ in out)
    if want != got:
        return f"out on ports {got or 'none'}, expected {want or 'none (drop)'}"
    for port in set(want):
        for exp, frame in zip([e for e in test.expects if e.port == port],
                              [f for p, f in out if p == port]):
            if not exp.matches(frame):
                return f"port {port}: got {frame.hex().upper()[:160]}..., expected {exp.nibbles[:160]}..."
    return None
