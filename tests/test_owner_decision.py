"""RoundOwner's decision: the const entries of the P4 table owner_decision
(p4/include/round_owner.p4), their Python twin inagg.hostlib.wire.protocol.OWNER_DECISION, and the
reference engine (hostlib/aggregator/engine_reference.py, and its C++ twin native/engine.cpp)
deciding each row the same: who gets a reduce-scatter round's values (docs/protocol.md). The
Tofino 2 program encodes the same rows in owner_input and round_owner's register actions
(p4/tofino/slot_inputs.p4, slot_state.p4): the model of those (tna_slot_model) decides each row
too."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pytest

from inagg.hostlib.aggregator.engine import NativeEngine
from inagg.hostlib.aggregator.engine_reference import AggregationEngine, JobConfig
from inagg.bmv2_env.softswitch.tna_compiled import p4_constants as tofino_constants
from inagg.bmv2_env.softswitch.tna_slot_model import TofinoSlotModel, owner_input
from inagg.hostlib.wire.protocol import (
    FLAG_FROM_SWITCH, FLAG_MINE, HEADER_BYTES, OWNER_DECISION, OWNER_DECISION_KEYS, OwnerUpdate, build_contribution,
    round_fields,
)

from test_slot_decision import const_table, covers   # the const-table reading both twins use

ROUND_OWNER = Path(__file__).resolve().parents[1] / "p4" / "include" / "round_owner.p4"
SLOT_INPUTS = ROUND_OWNER.parents[1] / "tofino" / "slot_inputs.p4"
K = 4
MEMBERS = tuple((f"10.0.0.{w + 1}", 5) for w in range(4))   # N = 4 workers
FULL, HEADER = HEADER_BYTES + 4 * K, HEADER_BYTES
SHARED = "shared"


def p4_table() -> tuple[tuple[str, ...], tuple]:
    """owner_decision's const entries: (key names, [(key, update)])."""
    return const_table(ROUND_OWNER, "owner_decision", "set_owner_update", "OWNER_", OwnerUpdate)


def p4_constants() -> dict[str, int]:
    text = ROUND_OWNER.read_text()
    return {m[1]: int(m[2], 0) for m in re.finditer(r"const bit<\d+>\s+(\w+)\s*=\s*(\w+);", text)}


def test_the_twin_is_the_p4_table():
    keys, rows = p4_table()
    assert keys == OWNER_DECISION_KEYS
    assert rows == OWNER_DECISION


def test_the_p4_constants_are_the_wires():
    consts = p4_constants()
    assert consts["FLAG_MINE"] == FLAG_MINE
    assert {u: consts[f"OWNER_{u.name}"] for u in OwnerUpdate} == {u: int(u) for u in OwnerUpdate}


def test_tofino_2_keeps_the_owner_in_round_owner_p4s_values():
    """p4/tofino/types.p4's owner values are round_owner.p4's; the bridged header's 7-bit
    shared is OWNER_SHARED's low bits."""
    consts, tofino = p4_constants(), tofino_constants("tofino2")
    assert {n: tofino[n] for n in ("FLAG_MINE", "OWNER_NONE", "OWNER_SHARED")} == \
        {n: consts[n] for n in ("FLAG_MINE", "OWNER_NONE", "OWNER_SHARED")}
    assert tofino["BRIDGED_OWNER_SHARED"] == consts["OWNER_SHARED"] & 0x7F


def test_every_key_takes_exactly_one_row():
    """The entries cover every key once: their order (ternary priority) and the default action
    never matter."""
    for values in itertools.product((0, 1), repeat=len(OWNER_DECISION_KEYS)):
        assert sum(covers(key, values) for key, _ in OWNER_DECISION) == 1, values


def test_tofino_2s_owner_input_rows_are_the_models():
    """owner_input's const rows (p4/tofino/slot_inputs.p4), in their priority order, then its
    default: for every combination of the two flags, the owner the first matching row brings is
    the model's (worker 5: replica 6)."""
    tofino = tofino_constants("tofino2")
    body = re.search(r"table owner_input \{(.*?)\n    \}", SLOT_INPUTS.read_text(), re.S).group(1)
    rows = re.findall(r"(\w+) &&& (\w+): (\w+)\((\w*)\);", body)
    default = tofino[re.search(r"const default_action = bring_owner\((\w+)\);", body).group(1)]
    assert len(rows) == 2
    for flags in (0, FLAG_MINE, FLAG_FROM_SWITCH, FLAG_MINE | FLAG_FROM_SWITCH):
        brings = next((6 if action == "bring_sender" else tofino[arg] for value, mask, action, arg in rows
                       if flags & tofino[mask] == tofino[value]), default)
        assert owner_input(flags, 5) == brings, hex(flags)


def packet(worker: int, flags: int = 0, round_no: int = 0) -> bytes:
    """Worker ``worker``'s contribution of K values to round ``round_no`` of slot 1."""
    s, tag = round_fields(round_no)
    return build_contribution(1, worker, 1, 1, s, 0, np.full(K, worker + 1, np.int32), K, flags=flags | tag)


def history(first: int, from_switch: int, marked: int, owned: int) -> tuple[list[bytes], int]:
    """The packets before worker 1's packet of the row, which they leave in the state (first,
    owned), and that packet's round (its flags: from_switch, marked). Owned: worker 0 marked
    the round (ADD), or the set's previous round (FIRST: rounds 0 and 1 before it, round 2 on
    set 0 again)."""
    mine = FLAG_MINE if owned else 0
    if first:
        before = [packet(w, mine if w == 0 else 0) for w in range(4)] + [packet(w, 0, 1) for w in range(4)]
        return before, 2
    return [packet(0, mine)], 0


def sizes_after(owner, marks_after: bool) -> list[int]:
    """The bytes each rank gets of the round's result when the round held ``owner`` (a rank,
    None or SHARED) after the row's packet, and the rest came unmarked, or (``marks_after``)
    with worker 2's marked."""
    if marks_after:
        owner = 2 if owner is None else SHARED
    if owner in (None, SHARED):
        return [FULL] * 4
    return [FULL if r == owner else HEADER for r in range(4)]


def owner_after(update: OwnerUpdate, first: int, owned: int):
    """The round's owner after worker 1's packet made ``update``; KEEP keeps worker 0's mark."""
    if update == OwnerUpdate.KEEP:
        return 0 if owned and not first else None
    return {OwnerUpdate.SET_NONE: None, OwnerUpdate.SET_SENDER: 1, OwnerUpdate.SET_SHARED: SHARED}[update]


@pytest.mark.parametrize("key, update", OWNER_DECISION,
                         ids=["-".join("x" if v is None else str(v) for v in key) + f":{u.name.lower()}"
                              for key, u in OWNER_DECISION])
def test_the_reference_decides_the_row(key, update):
    """Every state the row covers, on the Python reference engine, its C++ twin and the model of
    Tofino 2's register actions: the round completed without further marks, and with worker 2's
    mark after the row's packet, gives each rank the bytes the updated owner implies."""
    for values in (v for v in itertools.product((0, 1), repeat=4) if covers(key, v)):
        first, from_switch, marked, owned = values
        before, round_no = history(*values)
        row = packet(1, (FLAG_FROM_SWITCH if from_switch else 0) | (FLAG_MINE if marked else 0), round_no)
        owner = owner_after(update, first, owned)
        for marks_after in (False, True):
            rest = [packet(w, FLAG_MINE if marks_after and w == 2 else 0, round_no) for w in (2, 3)]
            if first:
                rest.insert(0, packet(0, 0, round_no))
            for eng in (AggregationEngine(4, K), NativeEngine(4, K), TofinoSlotModel(4, K, "tofino2")):
                eng.replace_jobs({1: JobConfig(1, 1, 0, 4, MEMBERS)})
                for data in before + [row] + rest[:-1]:
                    eng.process(data, MEMBERS[data[4]])
                (emit,) = eng.process(rest[-1], MEMBERS[rest[-1][4]])
                got = [len(emit.data_for(r)) for r in emit.ranks]
                assert got == sizes_after(owner, marks_after), (type(eng).__name__, values, marks_after)
