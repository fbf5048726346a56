"""Round identity on the wire (issue 38, items 2 and 3): every contribution carries its slot's
round tag beyond the set (``protocol.round_fields``) and every slot keeps each set's tag, so a
late copy of an older round is stale on arrival: it never opens a set, never changes a sum and
never turns the current round's packets bad.

On the reference engine and its C++ twin (the host aggregator's and the software switch's slot
logic): the issue's two scenarios, then a hypothesis fuzz of whole jobs (several calls whose
blocks reuse the same slots, offsets and counts, as the control round on slot 0 does every call)
through a network that loses, duplicates and reorders packets and delivers copies of
contributions and results delayed by up to ``MAX_DELAY`` rounds of their slot. No worker may
accept a wrong sum, and every job must finish. BMv2 and the Tofino models run the scenarios in
tests/test_dataplane_conformance.py."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inagg.hostlib.aggregator.engine import NativeEngine
from inagg.hostlib.aggregator.engine_reference import AggregationEngine, JobConfig
from inagg.hostlib.wire.protocol import (
    FLAG_RETRANSMIT, MSG_RESULT, ROUND_TAGS, build_contribution, round_fields, round_tag, unpack_header,
)

K = 4
ENGINES = (AggregationEngine, NativeEngine)
MEMBERS = tuple(("10.0.0.%d" % (r + 1), 5) for r in range(4))
# The oldest copy the fuzz delivers: a copy of round k arrives while the slot's newest round is at
# most k + MAX_DELAY. From 2 * ROUND_TAGS - 2 rounds on a copy's (set, tag) can alias a round of
# its set (the documented limit, docs/protocol.md).
MAX_DELAY = 2 * ROUND_TAGS - 3


def engine(make, n: int, slots: int = 4):
    eng = make(8, K)
    eng.set_job(JobConfig(1, 1, 0, slots, MEMBERS[:n]))
    return eng


def packet(rank: int, round_no: int, values, *, slot: int = 0, offset: int = 0) -> bytes:
    slot_set, tag_flags = round_fields(round_no)
    return build_contribution(1, rank, 1, slot, slot_set, offset, np.asarray(values, np.int32), K,
                              flags=tag_flags)


def sums(emits) -> list[list[int]]:
    return [np.frombuffer(e.data, ">i4", K, 16).tolist() for e in emits]


@pytest.mark.parametrize("make", ENGINES)
def test_a_copy_late_past_the_next_round_cannot_change_the_round_after(make):
    """Issue 38, S1: worker 2's copy of round 0 arrives after round 1 completed; round 2 comes
    with round 0's offset and count. Without the round tag the copy opened set 0 and round 2
    summed to 331 (the copy's 1 for worker 2's 3): it is stale, round 2 sums to 333."""
    eng = engine(make, 3)
    copy = packet(2, 0, [1] * K)
    for rank in range(3):
        eng.process(packet(rank, 0, [10 ** (2 - rank)] * K), MEMBERS[rank])       # 100, 10, 1
    for rank in range(3):
        eng.process(packet(rank, 1, [7] * K), MEMBERS[rank])
    assert eng.process(copy, MEMBERS[2]) == [] and eng.last_outcome.label == "stale_round"
    out = [eng.process(packet(rank, 2, [3 * 10 ** (2 - rank)] * K), MEMBERS[rank]) for rank in range(3)]
    assert out[:2] == [[], []] and sums(out[2]) == [[333] * K]
    assert round_tag(unpack_header(out[2][0].data).flags) == 1          # round 2's tag
    assert eng.snapshot_counters()["jobs"][1]["drops"]["stale_round"] == 1


@pytest.mark.parametrize("make", ENGINES)
def test_a_copy_late_past_the_next_round_cannot_stall_the_round_after(make):
    """Issue 38, S4 (item 3): the same late copy with round 2 at another offset made every round-2
    packet BAD_ROUND and stalled the job; it is stale, and round 2 completes."""
    eng = engine(make, 3)
    for round_no in (0, 1):
        for rank in range(3):
            eng.process(packet(rank, round_no, [1] * K), MEMBERS[rank])
    assert eng.process(packet(0, 0, [1] * K), MEMBERS[0]) == []
    out = [eng.process(packet(rank, 2, [2] * K, offset=K), MEMBERS[rank]) for rank in range(3)]
    assert sums(out[2]) == [[6] * K]
    assert "bad_round" not in eng.snapshot_counters()["jobs"][1]["drops"]


@pytest.mark.parametrize("make", ENGINES)
def test_an_older_rounds_result_is_not_the_outstanding_rounds(make):
    """A duplicate of round 0 while round 2 is open on set 0 is stale (not DUP_DONE, not ADD):
    its stored result is gone, and a round-2 duplicate answers with round 2's tag only."""
    eng = engine(make, 2)
    for round_no in (0, 1):
        for rank in range(2):
            eng.process(packet(rank, round_no, [1] * K), MEMBERS[rank])
    eng.process(packet(0, 2, [5] * K), MEMBERS[0])
    assert eng.process(packet(1, 0, [1] * K), MEMBERS[1]) == []
    assert eng.last_outcome.label == "stale_round"
    (done,) = eng.process(packet(1, 2, [5] * K), MEMBERS[1])
    assert sums([done]) == [[10] * K] and round_tag(unpack_header(done.data).flags) == 1


@dataclass
class Worker:
    """A rank of the fuzzed job: calls one after another; block b of a call on slot b % W at
    offset b * K (every call reuses the slots, offsets and counts); a slot's next round goes
    once the slot's last round is answered. Accepts a result only as the stream does (set, tag,
    offset, count of the outstanding round) and checks it is the true sum."""

    rank: int
    slots: int
    truth: list                                      # truth[c][b]: the true sum of block b of call c
    call: int = 0
    next_round: list = field(default_factory=list)   # per slot
    waiting: dict = field(default_factory=dict)      # slot -> (round_no, block, packet)
    answered: set = field(default_factory=set)       # blocks of the current call

    def done(self) -> bool:
        return self.call == len(self.truth)

    def ready(self, values) -> list[tuple[int, int, bytes]]:
        """(slot, round_no, packet) of every block that may go now."""
        out = []
        while not self.done():
            blocks = len(self.truth[self.call])
            for b in range(blocks):
                slot = b % self.slots
                if (slot in self.waiting or b in self.answered
                        or (b >= self.slots and b - self.slots not in self.answered)):
                    continue
                round_no = self.next_round[slot]
                self.next_round[slot] += 1
                data = packet(self.rank, round_no, values[self.rank][self.call][b], slot=slot, offset=b * K)
                self.waiting[slot] = (round_no, b, data)
                out.append((slot, round_no, data))
            if len(self.answered) < blocks:
                return out
            self.call, self.answered = self.call + 1, set()
        return out

    def receive(self, data: bytes) -> None:
        h = unpack_header(data)
        assert h.msg_type == MSG_RESULT
        got = self.waiting.get(h.slot)
        if got is None:
            return
        round_no, b, _ = got
        slot_set, tag_flags = round_fields(round_no)
        if (h.slot_set, round_tag(h.flags), h.offset, h.count) != (slot_set, round_tag(tag_flags), b * K, K):
            return
        values = np.frombuffer(data, ">i4", K, 16).tolist()
        assert values == self.truth[self.call][b], (self.rank, self.call, b, round_no, values)
        del self.waiting[h.slot]
        self.answered.add(b)


def run_job(make, n: int, slots: int, blocks: list[int], rng: random.Random, loss: float, dup: float,
            late: float) -> None:
    """One job through a hostile network; raises when a worker accepts a wrong sum or stalls."""
    values = [[[rng.sample(range(-50, 50), K) for _ in range(b)] for b in blocks] for _ in range(n)]
    truth = [[np.sum([values[r][c][b] for r in range(n)], axis=0).tolist() for b in range(nb)]
             for c, nb in enumerate(blocks)]
    eng = engine(make, n, slots)
    workers = [Worker(r, slots, truth, next_round=[0] * slots) for r in range(n)]
    flight: list[tuple[int, bytes]] = []                  # (-1: the aggregator, else a rank, data)
    history: list[tuple[int, int, int, bytes]] = []       # (slot, round_no, destination, data)
    newest = [0] * slots                                  # per slot: the newest round sent
    for _ in range(20000):
        for w in workers:
            for slot, round_no, data in w.ready(values):
                newest[slot] = max(newest[slot], round_no)
                flight.append((-1, data))
                history.append((slot, round_no, -1, data))
        if all(w.done() for w in workers):
            return
        if not flight:                                    # silence: every rank resends
            flight = [(-1, bytes([d[0], d[1] | FLAG_RETRANSMIT]) + d[2:]) for w in workers
                      for _, _, d in w.waiting.values()]
        if rng.random() < late and history:               # a late copy, up to MAX_DELAY rounds old
            slot, round_no, dst, data = history[rng.randrange(len(history))]
            if newest[slot] - round_no <= MAX_DELAY:
                flight.append((dst, data))
        dst, data = flight.pop(rng.randrange(len(flight)))
        if rng.random() < dup:
            flight.append((dst, data))
        if rng.random() < loss:
            continue
        if dst >= 0:
            workers[dst].receive(data)
            continue
        rank = data[4]
        for emit in eng.process(data, MEMBERS[rank]):
            h = unpack_header(emit.data)
            round_no = max(r for r in range(newest[h.slot] + 1)
                           if round_fields(r) == (h.slot_set, round_tag(h.flags) << 4))
            for r in emit.ranks:
                flight.append((r, emit.data))
                history.append((h.slot, round_no, r, emit.data))
    raise AssertionError(f"the job stalled: {[w.call for w in workers]} of {len(blocks)} calls")


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 4), slots=st.integers(1, 3), blocks=st.lists(st.integers(1, 6), min_size=2, max_size=6),
       seed=st.integers(0, 2 ** 32 - 1), loss=st.sampled_from([0.0, 0.1, 0.3]),
       dup=st.sampled_from([0.0, 0.2]), late=st.sampled_from([0.1, 0.4]))
def test_no_late_copy_changes_a_sum_or_stalls_a_job(n, slots, blocks, seed, loss, dup, late):
    """Copies of contributions and results delayed by up to MAX_DELAY rounds of their slot,
    duplicates, loss and reordering across calls: every result a worker accepts is the exact
    sum, and every call of the job completes, on both engines."""
    for make in ENGINES:
        run_job(make, n, slots, blocks, random.Random(seed), loss, dup, late)
