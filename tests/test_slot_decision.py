"""SlotState's decision: the const entries of the P4 table slot_decision
(p4/include/slot_state.p4), their Python twin inagg.hostlib.wire.protocol.SLOT_DECISION, and the reference
engine (hostlib/aggregator/engine_reference.py, and its C++ twin native/engine.cpp) deciding each row the same."""

import itertools
import re
from pathlib import Path

import numpy as np
import pytest

from inagg.hostlib.aggregator.engine_reference import AggregationEngine, JobConfig, Uplink
from inagg.hostlib.aggregator.engine import NativeEngine
from inagg.hostlib.wire.protocol import (
    ROUND_TAGS, SLOT_DECISION, SLOT_DECISION_KEYS, Outcome, build_contribution, round_fields,
)

SLOT_STATE = Path(__file__).resolve().parents[1] / "p4" / "include" / "slot_state.p4"
K = 4
MEMBERS = (("10.0.0.1", 5), ("10.0.0.2", 5), ("10.0.0.3", 5))   # N = 3 workers
PARENT = ("10.0.1.1", 5)


def const_table(path: Path, table: str, action: str, prefix: str, names) -> tuple[tuple[str, ...], tuple]:
    """(key names, [(key, names[X])]) of ``table``'s const entries in ``path``, in P4 order: each
    row's ternary key (``_`` as None) and its ``action(<prefix>X)``."""
    body = re.search(rf"table {table} \{{(.*?)\n    \}}", path.read_text(), re.S).group(1)
    keys = re.findall(r"(\w+): ternary", re.search(r"key = \{(.*?)\}", body, re.S).group(1))
    entries = re.search(r"const entries = \{(.*?)\n        \}", body, re.S).group(1)
    rows = [(tuple(None if v.strip() == "_" else int(v) for v in key.split(",")), names[value])
            for key, value in re.findall(rf"\(([^)]*)\): {action}\({prefix}(\w+)\);", entries)]
    return tuple(keys), tuple(rows)


def p4_table():
    """slot_decision's const entries: (key names, [(key, outcome)])."""
    return const_table(SLOT_STATE, "slot_decision", "set_outcome", "SLOT_", Outcome)


def covers(key, values):
    return all(k is None or k == v for k, v in zip(key, values))


def test_the_twin_is_the_p4_table():
    keys, rows = p4_table()
    assert keys == SLOT_DECISION_KEYS
    assert rows == SLOT_DECISION


def test_every_key_takes_exactly_one_row():
    """The entries cover every key once: their order (ternary priority) and the default action
    never matter."""
    for values in itertools.product((0, 1), repeat=len(SLOT_DECISION_KEYS)):
        assert sum(covers(key, values) for key, _ in SLOT_DECISION) == 1, values


def contribution(worker, *, slot_set=0, offset=0, count=K, round_no=None):
    """Worker ``worker``'s packet to slot 1: round ``round_no`` (default: round 0 or 1, the
    set's first)."""
    values = np.arange(1, count + 1, dtype=np.int32) if count else None
    s, tag_flags = round_fields(slot_set if round_no is None else round_no)
    return build_contribution(1, worker, 1, 1, s, offset, values, K, flags=tag_flags)


def history(mine, empty, complete, same_round, sent_up, this_round, next_round):
    """The packets that bring slot 1's set 0 into the state (mine, empty, complete, same_round,
    sent_up) for worker 0, then worker 0's packet with the round tag the last two keys name:
    the set's stored tag (this round), the one after it (next round), or the one after that
    (an older round's copy). A round in set 0 is round 0 (tag 0) at offset 0 with K values; a
    fresh slot's set holds no tag (any is its next: tag 0 here), offset 0, count 0. sent_up: a job with an
    uplink, every worker in (docs/trees.md)."""
    before, packet = _state(mine, empty, complete, same_round, sent_up)
    stored = 0 if any(p[8] >> 7 == 0 for p in before) else ROUND_TAGS - 1   # set 0 opened?
    tag = (stored + (0 if this_round else 1 if next_round else 2)) % ROUND_TAGS
    packet = bytearray(packet)
    packet[1] |= round_fields(2 * tag)[1]
    return before, bytes(packet)


def _state(mine, empty, complete, same_round, sent_up):
    """``history``'s packets before the round tag: tag 0 on the last one."""
    full = [contribution(w) for w in range(3)]
    if sent_up:                   # not mine: worker 0 moved on (a reordered packet follows)
        before = full if mine else full + [contribution(0, slot_set=1)]
        return before, contribution(0, offset=0 if same_round else K)
    if empty:                     # mine is 0: nothing, or a round whose workers all moved on
        before = full + [contribution(w, slot_set=1) for w in range(3)] if complete else []
        if not complete:          # the fresh slot's (0, 0): a header-only packet is its round
            return before, contribution(0, count=0 if same_round else K)
    elif mine:
        before = full if complete else [contribution(0)]
    else:                         # others' bits: worker 0 moved on from a complete round
        before = full + [contribution(0, slot_set=1)] if complete else [contribution(1)]
    return before, contribution(0, offset=0 if same_round else K)


@pytest.mark.parametrize("key, outcome", SLOT_DECISION,
                         ids=[f"{'-'.join('x' if v is None else str(v) for v in key)}:{o.label}"
                              for key, o in SLOT_DECISION])
def test_the_reference_decides_the_row(key, outcome):
    """Every state the row covers (a set bit of mine means the bitmap is not empty; sent up:
    every worker in, so not empty, and no result; a tag is not both the set's and the next),
    on the Python reference engine and its C++ twin."""
    states = [v for v in itertools.product((0, 1), repeat=7) if covers(key, v) and not (v[0] and v[1])
              and not (v[4] and (v[1] or v[2])) and not (v[5] and v[6])
              and not (v[1] and not v[2] and not v[6])]   # a fresh set has no tag: every tag is its next
    assert states
    for values in states:
        before, packet = history(*values)
        uplink = Uplink(PARENT, 0, 0) if values[4] else None
        for eng in (AggregationEngine(4, K), NativeEngine(4, K)):
            eng.replace_jobs({1: JobConfig(1, 1, 0, 4, MEMBERS, uplink)})
            for data in before:
                eng.process(data, MEMBERS[data[4]])
            eng.process(packet, MEMBERS[0])
            assert eng.last_outcome == outcome, (type(eng).__name__, dict(zip(SLOT_DECISION_KEYS, values)))
