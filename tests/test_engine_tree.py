"""The slot engine in an aggregation tree (docs/trees.md): two ToR engines with an uplink each and
a root engine, wired packet by packet, on the Python reference and its C++ twin.

A lossy, duplicating, reordering network between workers, ToRs and the root, with workers that
resend what is unanswered, must give every worker the exact sums of every round; each decision
on a parent's result is checked on its own; and the C++ engine must match the reference packet
for packet on random traffic of a tree job."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inagg.hostlib.aggregator.engine import NativeEngine
from inagg.hostlib.aggregator.engine_reference import AggregationEngine, JobConfig, Uplink
from inagg.hostlib.wire.protocol import (
    EXP_NONE, FLAG_FROM_SWITCH, FLAG_OVERFLOW, FLAG_RETRANSMIT, MSG_CONTRIBUTION, MSG_RESULT, Outcome,
    build_contribution, pack_header, round_fields, unpack_header,
)

K = 4
W = 2                                  # slots per job on every engine
ROOT = ("root",)
TOR_BASES = (0, 4)                     # each engine numbers its own slots
ROOT_BASE = 2
WORKERS = ((("10.0.0.1", 1), ("10.0.0.2", 1)), (("10.0.1.1", 1), ("10.0.1.2", 1), ("10.0.1.3", 1)))
ENGINES = (AggregationEngine, NativeEngine)


def first_rank(tor: int) -> int:
    """The job rank of ToR ``tor``'s first worker (ranks are numbered across the ToRs)."""
    return sum(len(w) for w in WORKERS[:tor])


def tree(make):
    """{node: engine}: "tor0", "tor1" (uplinks to the root) and "root" (the ToRs its members).
    A ToR knows its workers by their job ranks: ToR 1's are 2..4, members 0 and 1 placeholders."""
    nodes = {}
    for i, workers in enumerate(WORKERS):
        eng = make(8, K, host_mode=False)
        members = tuple(("elsewhere", r) for r in range(first_rank(i))) + workers
        eng.set_job(JobConfig(1, 1, TOR_BASES[i], W, members, Uplink(ROOT, i, ROOT_BASE), len(workers)))
        nodes[f"tor{i}"] = eng
    root = make(8, K, host_mode=False)
    root.set_job(JobConfig(1, 1, ROOT_BASE, W, (("tor", 0), ("tor", 1))))
    nodes["root"] = root
    return nodes


class Worker:
    """A rank under ToR ``tor``: sends block c on its ToR's slot base + c mod W once block
    c - W's result is in, and resends every unanswered block when told to."""

    def __init__(self, tor: int, rank: int, values: np.ndarray) -> None:
        self.tor, self.rank, self.values = tor, rank, values     # values[c]: block c's K values
        self.results: dict[int, list[int]] = {}
        self.sent: set[int] = set()

    def packet(self, c: int, flags: int = 0) -> bytes:
        slot = TOR_BASES[self.tor] + c % W
        slot_set, tag_flags = round_fields(c // W)       # block c is its slot's round c // W
        return build_contribution(1, self.rank, 1, slot, slot_set, c * K, self.values[c], K,
                                  exp=c % 5, flags=flags | tag_flags)

    def ready(self) -> list[bytes]:
        """Blocks it may send now and has not sent yet."""
        out = []
        for c in range(len(self.values)):
            if c not in self.sent and (c < W or c - W in self.results):
                self.sent.add(c)
                out.append(self.packet(c))
        return out

    def unanswered(self) -> list[bytes]:
        return [self.packet(c, FLAG_RETRANSMIT) for c in sorted(self.sent - set(self.results))]

    def receive(self, data: bytes) -> None:
        h = unpack_header(data)
        assert h.msg_type == MSG_RESULT and not h.flags & FLAG_FROM_SWITCH
        c = h.offset // K
        got = np.frombuffer(data, ">i4", K, 16).tolist()
        if c in self.sent and c not in self.results:
            assert h.slot == TOR_BASES[self.tor] + c % W and h.slot_set == (c // W) % 2
            self.results[c] = got
        elif c in self.results:
            assert self.results[c] == got, f"block {c}: a second result differs"


def run_network(nodes, workers, rng, loss, dup, max_batches=4000):
    """Deliver in batches (each batch shuffled, lossy, duplicating; what a batch causes goes in
    the next one, so no packet outlives its round); when nothing is in flight, every worker
    resends its unanswered blocks."""
    flight: list[tuple[str, object, bytes]] = []
    for _ in range(max_batches):
        for w in workers:
            flight += [(f"tor{w.tor}", w, p) for p in w.ready()]
        if not flight:
            if all(len(w.results) == len(w.values) for w in workers):
                return
            flight = [(f"tor{w.tor}", w, p) for w in workers for p in w.unanswered()]
        batch, flight = flight, []
        batch += [m for m in batch if rng.random() < dup]
        rng.shuffle(batch)
        for dst, src, data in batch:
            if rng.random() >= loss:
                flight += deliver(nodes, workers, dst, src, data)
    raise AssertionError("the tree did not finish")


def deliver(nodes, workers, dst, src, data):
    """One packet into a worker or an engine; the packets it causes, addressed."""
    if isinstance(dst, Worker):
        dst.receive(data)
        return []
    sender = src.address if isinstance(src, Worker) else src
    out = []
    for emit in nodes[dst].process(data, sender):
        if dst == "root":
            out += [(f"tor{r}", ROOT, emit.data) for r in emit.ranks]
        elif emit.upstream:
            out.append(("root", ("tor", int(dst[3])), emit.data))
        else:
            out += [(w, dst, emit.data) for w in workers if f"tor{w.tor}" == dst and w.rank in emit.ranks]
    return out


def make_workers(rng, blocks):
    workers = []
    for tor, addrs in enumerate(WORKERS):
        for i, addr in enumerate(addrs):
            w = Worker(tor, first_rank(tor) + i, np.array([[rng.randrange(-2**20, 2**20) for _ in range(K)]
                                            for _ in range(blocks)], np.int32))
            w.address = addr
            workers.append(w)
    return workers


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
@pytest.mark.parametrize("loss, dup", [(0.0, 0.0), (0.2, 0.0), (0.1, 0.2), (0.3, 0.3)])
def test_every_worker_gets_the_exact_sums_under_loss_duplication_and_reordering(make, loss, dup):
    rng = random.Random(f"{make.__name__}{loss}{dup}")
    nodes = tree(make)
    workers = make_workers(rng, blocks=12)
    run_network(nodes, workers, rng, loss, dup)
    want = sum(w.values.astype(np.int64) for w in workers)
    for w in workers:
        assert [w.results[c] for c in range(12)] == want.tolist()
    ctr = nodes["tor0"].counters[1]
    if not loss and not dup:       # one partial sum up per block and ToR, one result down
        assert ctr.results == 12 and nodes["root"].counters[1].results == 12
        assert ctr.duplicates == 0 and not ctr.drops
    else:                          # the resends were answered at both levels
        assert ctr.duplicates > 0 and nodes["root"].counters[1].duplicates > 0


def single(make, eng_name="tor0"):
    """ToR 0's engine alone, and a helper that sends a packet from one of its workers."""
    nodes = tree(make)
    eng = nodes[eng_name]
    return eng, lambda rank, **kw: eng.process(contribution(rank, **kw), WORKERS[0][rank])


def contribution(rank, *, offset=0, count=K, flags=0, slot=0, exp=EXP_NONE):
    values = np.full(count, rank + 1, np.int32) if count else None
    return build_contribution(1, rank, 1, slot, 0, offset, values, K, exp=exp, flags=flags)


def parent_result(values, *, offset=0, count=K, flags=0, slot=ROOT_BASE, epoch=1, exp=3):
    payload = np.full(K, values, ">i4").tobytes() if count else b""
    return pack_header(1, MSG_RESULT, flags, 1, 1, exp, epoch, 0, slot, count, offset) + payload


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
def test_the_last_child_sends_the_partial_sum_up(make):
    eng, send = single(make)
    assert send(0, flags=FLAG_OVERFLOW, exp=2) == []
    (up,) = send(1, exp=5)
    assert up.upstream and up.ranks == () and eng.last_outcome == Outcome.ADD
    h = unpack_header(up.data)
    assert (h.msg_type, h.worker_id, h.slot, h.slot_set, h.exp, h.count) == (MSG_CONTRIBUTION, 0, ROOT_BASE, 0, 5, K)
    assert h.flags == FLAG_FROM_SWITCH | FLAG_OVERFLOW
    assert np.frombuffer(up.data, ">i4", K, 16).tolist() == [3] * K


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
def test_parent_result_decisions(make):
    """BAD_ROUND, STALE_ROUND (nothing sent up), PARENT_RESULT (stored and multicast, flags
    cleaned), DUP_RESULT; then a worker's resend is answered from the stored result."""
    eng, send = single(make)
    # a fresh slot's stored round is (offset 0, count 0): a header-only result is its round
    assert eng.process(parent_result(9, count=0), ROOT) == [] and eng.last_outcome == Outcome.STALE_ROUND
    send(0)
    send(1)
    assert eng.process(parent_result(9, offset=K), ROOT) == [] and eng.last_outcome == Outcome.BAD_ROUND
    (down,) = eng.process(parent_result(9, flags=FLAG_RETRANSMIT | FLAG_FROM_SWITCH | FLAG_OVERFLOW), ROOT)
    assert eng.last_outcome == Outcome.PARENT_RESULT and down.ranks == (0, 1) and not down.upstream
    h = unpack_header(down.data)
    assert (h.msg_type, h.slot, h.flags, h.exp) == (MSG_RESULT, 0, FLAG_OVERFLOW, 3)
    assert np.frombuffer(down.data, ">i4", K, 16).tolist() == [9] * K
    assert eng.process(parent_result(9), ROOT) == [] and eng.last_outcome == Outcome.DUP_RESULT
    (again,) = send(1, flags=FLAG_RETRANSMIT)
    assert eng.last_outcome == Outcome.DUP_DONE and again.ranks == (1,)
    assert np.frombuffer(again.data, ">i4", K, 16).tolist() == [9] * K
    c = eng.counters[1]
    assert (c.duplicates, c.drops) == (2, {"stale_round": 1, "bad_round": 1})


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
def test_a_resend_before_the_result_goes_up_again(make):
    eng, send = single(make)
    send(0)
    send(1)
    (up,) = send(0, flags=FLAG_RETRANSMIT)
    assert eng.last_outcome == Outcome.DUP_UPSTREAM and up.upstream
    assert unpack_header(up.data).flags == FLAG_FROM_SWITCH | FLAG_RETRANSMIT
    assert np.frombuffer(up.data, ">i4", K, 16).tolist() == [3] * K


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
def test_results_only_from_the_parent_in_its_slots(make):
    eng, send = single(make)
    send(0)
    send(1)
    assert eng.process(parent_result(9), ("10.0.0.1", 1)) == []
    assert eng.last_outcome == Outcome.BAD_WORKER
    assert eng.process(parent_result(9, slot=0), ROOT) == []           # ours, not the parent's
    assert eng.last_outcome == Outcome.BAD_SLOT
    assert eng.process(parent_result(9, epoch=2), ROOT) == []
    assert eng.last_outcome == Outcome.STALE_EPOCH
    root = tree(make)["root"]                                            # no uplink: no results in
    assert root.process(parent_result(9), ("tor", 0)) == [] and root.last_outcome == Outcome.BAD_TYPE


@pytest.mark.parametrize("up, error", [
    (Uplink(ROOT, 32, 0), "uplink rank must be in 0..31"),
    (Uplink(ROOT, 0, 0), "n_children must be in 0..2"),
    (Uplink(ROOT, 0, 32767), r"the parent's slots \[32767, 32769\) are outside 0..32767"),
])
def test_a_bad_uplink_is_named(up, error):
    n_children = 3 if "n_children" in error else 0
    for make in ENGINES:
        with pytest.raises(ValueError, match=error):
            make(8, K).set_job(JobConfig(1, 1, 0, W, WORKERS[0], up, n_children))


# -- the C++ engine against the reference, on a tree job --------------------------------------

@st.composite
def tree_packets(draw):
    """A contribution of a ToR 0 worker or a parent's result, mostly plausible."""
    slot = draw(st.sampled_from([0, 0, 1]))
    offset = draw(st.sampled_from([0, 0, K]))
    count = draw(st.sampled_from([K, K, 0]))
    flags = draw(st.sampled_from([0, FLAG_RETRANSMIT, FLAG_OVERFLOW, FLAG_FROM_SWITCH]))
    s = draw(st.integers(0, 1))
    if draw(st.integers(0, 3)) == 0:
        sender = draw(st.sampled_from([ROOT, ROOT, ROOT, WORKERS[0][0]]))
        base = draw(st.sampled_from([ROOT_BASE, ROOT_BASE, 0]))
        payload = np.full(K, draw(st.integers(-5, 5)), ">i4").tobytes() if count else b""
        return pack_header(1, MSG_RESULT, flags, 1, 1, draw(st.integers(-3, 3)), 1, s, base + slot,
                           count, offset) + payload, sender
    rank = draw(st.integers(0, 1))
    values = np.full(count, draw(st.integers(-5, 5)), np.int32) if count else None
    return build_contribution(1, rank, 1, slot, s, offset, values, K, flags=flags,
                              exp=draw(st.integers(-3, 3))), WORKERS[0][rank]


@settings(max_examples=100, deadline=None)
@given(st.lists(tree_packets(), min_size=5, max_size=120))
def test_native_matches_the_reference_on_a_tree_job(sequence):
    py, nat = (tree(make)["tor0"] for make in ENGINES)
    for data, sender in sequence:
        got = [(e.ranks, e.upstream, e.data) for e in nat.process(data, sender)]
        assert got == [(e.ranks, e.upstream, e.data) for e in py.process(data, sender)]
        assert nat.last_outcome == py.last_outcome
    assert nat.snapshot_counters() == py.snapshot_counters()
