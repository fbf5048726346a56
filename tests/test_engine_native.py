"""The native engine (native/engine.cpp) against its specification, the Python engine.

Random packet sequences (valid, duplicated, reordered, forged, wrong job/epoch/slot, truncated,
padded, wrong version/type) and configuration changes go to both; every step must give the same
packets (bytes and ranks), the same outcome, and in the end the same counters. The batch API
must agree with packet-by-packet processing.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inagg.hostlib.native_build import _native
from inagg.hostlib.aggregator.engine_reference import AggregationEngine, JobConfig
from inagg.hostlib.aggregator.engine import NativeEngine, udp_sender_id
from inagg.hostlib.wire.protocol import EXP_NONE, Outcome, build_contribution, pack_header

K = 4
N_SLOTS = 8
MEMBERS = {1: (("10.0.0.1", 5), ("10.0.0.2", 5), ("10.0.0.3", 5)), 2: (("10.0.0.1", 6), ("10.0.0.4", 6))}
STRANGER = ("10.9.9.9", 5)
SLOTS = {1: [0, 0, 1], 2: [4, 5], 3: [0, 5]}  # slots each job mostly uses
JOBS = {1: JobConfig(1, 1, 0, 4, MEMBERS[1]), 2: JobConfig(2, 1, 4, 2, MEMBERS[2])}


def engines():
    py, nat = AggregationEngine(N_SLOTS, K), NativeEngine(N_SLOTS, K)
    for eng in (py, nat):
        eng.replace_jobs(JOBS)
    return py, nat


def rarely(draw, usual, *odd):
    """``usual`` most of the time, else one of ``odd``: a stream of plausible packets with a
    few forged or malformed ones, so rounds really complete between the odd ones."""
    return draw(st.sampled_from(odd)) if odd and draw(st.integers(0, 24)) == 0 else usual


@st.composite
def packets(draw):
    """One packet and its sender: mostly plausible contributions, some forged or malformed."""
    job = rarely(draw, draw(st.sampled_from([1, 1, 1, 2])), 3)
    members = MEMBERS.get(job, MEMBERS[1])
    worker = rarely(draw, draw(st.integers(0, len(members) - 1)), 3)
    sender = members[worker] if worker < len(members) else STRANGER
    sender = rarely(draw, sender, STRANGER, *MEMBERS[1], *MEMBERS[2])
    count = rarely(draw, K, 0, 2, K + 1)
    values = draw(st.lists(st.sampled_from([0, 1, -1, 7, 2**31 - 1, -2**31]), min_size=count,
                           max_size=count))
    header = pack_header(
        rarely(draw, 1, 2, 0), rarely(draw, 1, 2, 0), draw(st.integers(0, 255)), job, worker,
        draw(st.sampled_from([EXP_NONE, -3, 0, 5])), draw(st.sampled_from([1, 1, 1, 2])),
        draw(st.integers(0, 1)), rarely(draw, draw(st.sampled_from(SLOTS[job])), 7), count,
        rarely(draw, 0, K, 2**32 - 1))
    payload = np.array(values, ">i4").tobytes() + bytes(4 * max(0, K - count)) if count else b""
    data = header + payload
    data = data[:rarely(draw, len(data), 0, 7, 15, 16, 20)]
    data += rarely(draw, b"", b"\0" * 4)                     # trailing bytes: bad length
    return data, sender, rarely(draw, True, False)


grants = st.sampled_from([
    JOBS,
    {1: JobConfig(1, 2, 0, 4, MEMBERS[1])},                  # a new epoch for job 1, job 2 gone
    {**JOBS, 2: JobConfig(2, 1, 4, 2, MEMBERS[2][::-1])},     # job 2's ranks swapped
    {3: JobConfig(3, 1, 0, 8, MEMBERS[2])},                   # another job on every slot
    {**JOBS, 3: JobConfig(3, 1, 3, 2, MEMBERS[2])},           # refused: overlaps both
])

# Mostly packets, now and then a new grant.
steps = st.lists(st.tuples(st.integers(0, 19), packets(), grants).map(
    lambda t: t[2] if t[0] == 0 else t[1]), min_size=10, max_size=150)


def apply_grant(eng, wanted):
    try:
        eng.replace_jobs(wanted)
    except ValueError as e:
        return str(e)
    return None


def emitted(emits):
    """What each packet sends: the job, the ranks, the bytes each rank gets and the round's
    owner (FLAG_MINE's rank, whose values no other rank gets)."""
    return [(e.job.job_id, e.ranks, e.data, e.owner, [e.data_for(r) for r in e.ranks]) for e in emits]


@settings(max_examples=150, deadline=None)
@given(steps)
def test_same_packets_outcomes_and_counters(sequence):
    py, nat = engines()
    for step in sequence:
        if isinstance(step, dict):
            assert apply_grant(py, step) == apply_grant(nat, step)
            assert nat.jobs == py.jobs
            continue
        data, sender, framing_ok = step
        assert emitted(nat.process(data, sender, framing_ok)) == emitted(
            py.process(data, sender, framing_ok))
        assert nat.last_outcome == py.last_outcome
    assert nat.snapshot_counters() == py.snapshot_counters()


@settings(max_examples=50, deadline=None)
@given(st.lists(packets(), min_size=1, max_size=100))
def test_batch_is_packet_by_packet(sequence):
    one, batch = engines()[1], engines()[1]
    expected_outcomes, expected_emits = [], []
    for i, (data, sender, ok) in enumerate(sequence):
        expected_emits += [(i, e) for e in one.process(data, sender, ok)]
        expected_outcomes.append(one.last_outcome)
    outcomes, emits = batch.process_batch(sequence)
    assert outcomes == expected_outcomes
    assert emits == expected_emits
    assert batch.snapshot_counters() == one.snapshot_counters()


def contribution(worker, *, slot=1, slot_set=0, offset=0, count=K):
    values = np.arange(1, count + 1, dtype=np.int32) if count else None
    return build_contribution(1, worker, 1, slot, slot_set, offset, values, K)


# One case per row of the decision table: the packets before, the packet, its outcome.
ROWS = {
    Outcome.FIRST: ([], contribution(0)),
    Outcome.ADD: ([contribution(0)], contribution(1)),
    Outcome.BAD_ROUND: ([contribution(0)], contribution(1, offset=K)),
    Outcome.STALE_ROUND: ([contribution(w) for w in range(3)] + [contribution(0, slot_set=1)],
                          contribution(0)),
    Outcome.DUP_PENDING: ([contribution(0)], contribution(0)),
    Outcome.DUP_DONE: ([contribution(w) for w in range(3)], contribution(2)),
}


@pytest.mark.parametrize("row", list(ROWS), ids=lambda o: o.label)
def test_decision_table_row(row):
    before, packet = ROWS[row]
    for eng in engines():
        for data in before:
            eng.process(data, MEMBERS[1][data[4]])
        eng.process(packet, MEMBERS[1][packet[4]])
        assert eng.last_outcome == row


def test_duplicate_of_another_round_is_bad_round_on_both():
    """Worker 0's bit is set in set 0; a copy claiming a different count is not its round."""
    for eng in engines():
        eng.process(contribution(0), MEMBERS[1][0])
        assert eng.process(contribution(0, count=0), MEMBERS[1][0]) == []
        assert eng.last_outcome == Outcome.BAD_ROUND
        assert eng.counters[1].drops == {"bad_round": 1} and eng.counters[1].duplicates == 0


@pytest.mark.parametrize("job, error", [
    (JobConfig(0, 1, 0, 1, MEMBERS[1]), "job_id must be in 1..65535"),
    (JobConfig(70000, 1, 0, 1, MEMBERS[1]), "job_id must be in 1..65535"),
    (JobConfig(1, -1, 0, 1, MEMBERS[1]), "epoch must be in 0..65535"),
    (JobConfig(1, 1, 0, 1, ()), "needs 1..32 workers, got 0"),
    (JobConfig(1, 1, 7, 2, MEMBERS[1]), r"slots \[7, 9\) outside the pool of 8"),
])
def test_native_validation_names_the_field(job, error):
    """The C++ engine's own checks (used by native loops without Python) match the spec's."""
    eng = _native.Engine(N_SLOTS, K, True)
    with pytest.raises(ValueError, match=error):
        eng.set_job(job.job_id, job.epoch, job.slot_base, job.slot_count,
                    list(range(1, job.n_workers + 1)))
    with pytest.raises(ValueError, match=error):
        AggregationEngine(N_SLOTS, K).set_job(job)


def test_native_refuses_duplicate_members_and_overlaps():
    eng = _native.Engine(N_SLOTS, K, True)
    with pytest.raises(ValueError, match=r"duplicate worker addresses \(5, 5\)"):
        eng.set_job(1, 1, 0, 2, [5, 5])
    eng.set_job(1, 1, 0, 4, [5, 6])
    with pytest.raises(ValueError, match=r"job 2: slots \[3, 5\) overlap job 1"):
        eng.set_job(2, 1, 3, 2, [7])


def test_udp_sender_id_packs_address_and_port():
    assert udp_sender_id(("10.0.0.1", 0xA66A)) == (0x0A000001 << 16) | 0xA66A


def test_udp_sender_id_names_an_unresolvable_host():
    with pytest.raises(ValueError, match="cannot resolve 'no-such-host.invalid'"):
        udp_sender_id(("no-such-host.invalid", 1))
