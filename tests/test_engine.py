"""Aggregation engine cases: the switch's slot logic, admission and counters."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inagg.hostlib.aggregator.engine_reference import AggregationEngine, JobConfig
from inagg.hostlib.wire.protocol import (
    EXP_NONE, FLAG_FROM_HOST, FLAG_OVERFLOW, FLAG_RETRANSMIT, MSG_RESULT, build_contribution,
    round_fields, unpack_header,
)

K = 4
A = ("10.0.0.1", 1), ("10.0.0.2", 1), ("10.0.0.3", 1)


def make_engine(**job):
    eng = AggregationEngine(16, K)
    eng.set_job(JobConfig(**{"job_id": 1, "epoch": 1, "slot_base": 0, "slot_count": 8,
                             "members": A, **job}))
    return eng


def contrib(worker, values, *, job=1, epoch=1, slot=3, slot_set=0, round_no=None, offset=0,
            exp=EXP_NONE, flags=0):
    """Worker ``worker``'s packet: round ``round_no`` of its slot (its set and round tag), or
    the first round of set ``slot_set``."""
    slot_set, tag_flags = round_fields(slot_set if round_no is None else round_no)
    return build_contribution(job, worker, epoch, slot, slot_set, offset,
                              np.array(values, np.int32), K, exp=exp, flags=flags | tag_flags)


def send(eng, worker, values, sender=None, **kw):
    return eng.process(contrib(worker, values, **kw), A[worker] if sender is None else sender)


def result_values(emit):
    h = unpack_header(emit.data)
    assert h.msg_type == MSG_RESULT
    return h, np.frombuffer(emit.data, ">i4", K, 16).tolist()


def test_first_and_last_contribution_complete_with_multicast():
    eng = make_engine()
    assert send(eng, 0, [1, 2, 3, 4], exp=-3) == []
    assert send(eng, 2, [10, 20, 30, 40], exp=5) == []
    (emit,) = send(eng, 1, [100, 200, 300, 400], exp=1, flags=FLAG_OVERFLOW)
    assert emit.ranks == (0, 1, 2)
    h, vals = result_values(emit)
    assert vals == [111, 222, 333, 444]
    assert h.exp == 5 and h.slot == 3 and h.slot_set == 0 and h.worker_id == 1
    assert h.flags == FLAG_OVERFLOW | FLAG_FROM_HOST
    c = eng.counters[1]
    assert (c.packets, c.aggregated, c.results, c.duplicates) == (3, 3, 1, 0)


def test_duplicate_before_completion_is_not_added():
    eng = make_engine()
    send(eng, 0, [1, 1, 1, 1])
    assert send(eng, 0, [1, 1, 1, 1], flags=FLAG_RETRANSMIT) == []
    send(eng, 1, [1, 1, 1, 1])
    (emit,) = send(eng, 2, [1, 1, 1, 1])
    assert result_values(emit)[1] == [3, 3, 3, 3]
    assert eng.counters[1].duplicates == 1


def test_duplicate_after_completion_gets_stored_result_unicast():
    eng = make_engine()
    for w in range(3):
        out = send(eng, w, [w + 1] * 4, offset=128)
    (emit,) = send(eng, 1, [2] * 4, offset=128, flags=FLAG_RETRANSMIT)
    assert emit.ranks == (1,)
    h, vals = result_values(emit)
    assert vals == [6] * 4 and h.offset == 128 and h.flags & FLAG_RETRANSMIT
    assert result_values(out[0])[1] == vals
    assert eng.counters[1].resent_results == 1


def test_set_flip_keeps_previous_result_readable():
    eng = make_engine()
    for w in range(3):
        send(eng, w, [1] * 4, slot_set=0)
    # worker 0 moves on to the next round (set 1); worker 2 still asks for round 0's result
    send(eng, 0, [5] * 4, slot_set=1)
    (emit,) = send(eng, 2, [1] * 4, slot_set=0)
    assert emit.ranks == (2,) and result_values(emit)[1] == [3] * 4
    send(eng, 1, [5] * 4, slot_set=1)
    (emit,) = send(eng, 2, [5] * 4, slot_set=1)
    assert result_values(emit)[1] == [15] * 4
    # third round on set 0 (its next round tag) starts fresh (FIRST overwrites the old sum)
    send(eng, 0, [7] * 4, round_no=2)
    send(eng, 1, [7] * 4, round_no=2)
    (emit,) = send(eng, 2, [7] * 4, round_no=2)
    assert result_values(emit)[1] == [21] * 4


def test_stale_packet_of_finished_round_is_dropped():
    eng = make_engine()
    for w in range(3):
        send(eng, w, [1] * 4, slot_set=0)
    send(eng, 0, [5] * 4, slot_set=1)          # worker 0 cleared its set-0 bit
    assert send(eng, 0, [1] * 4, slot_set=0) == []  # reordered copy of round 0
    assert eng.counters[1].drops["stale_round"] == 1


def test_epoch_change_resets_slot():
    eng = make_engine()
    send(eng, 0, [1] * 4)
    send(eng, 1, [1] * 4)                       # round half done under epoch 1
    eng.set_job(JobConfig(1, 2, 0, 8, A))        # new grant: epoch 2
    assert send(eng, 2, [1] * 4) == []          # old epoch is refused
    assert eng.counters[1].drops["stale_epoch"] == 1
    for w in range(2):
        assert send(eng, w, [9] * 4, epoch=2) == []
    (emit,) = send(eng, 2, [9] * 4, epoch=2)
    assert result_values(emit)[1] == [27] * 4 and unpack_header(emit.data).epoch == 2


def test_priming_round_returns_max_exponent_without_payload():
    eng = make_engine()
    pk = [build_contribution(1, w, 1, 2, 1, 0, None, K, exp=e) for w, e in enumerate([-4, 9, 2])]
    assert eng.process(pk[0], A[0]) == [] and eng.process(pk[1], A[1]) == []
    (emit,) = eng.process(pk[2], A[2])
    assert len(emit.data) == 16 and unpack_header(emit.data).exp == 9


def test_single_worker_job_completes_at_once():
    eng = AggregationEngine(4, K)
    eng.set_job(JobConfig(5, 1, 0, 4, (A[0],)))
    (emit,) = eng.process(contrib(0, [4, 3, 2, 1], job=5, slot=1), A[0])
    assert result_values(emit)[1] == [4, 3, 2, 1]


@pytest.mark.parametrize("packet_kw, sender, reason", [
    (dict(job=9), None, None),                 # unknown job: global counter
    (dict(slot=8), None, "bad_slot"),          # outside the job's range
    (dict(), ("10.9.9.9", 1), "bad_worker"),   # rank 0 claimed by a stranger
    (dict(epoch=4), None, "stale_epoch"),
])
def test_forged_packets_are_dropped_and_counted(packet_kw, sender, reason):
    eng = make_engine()
    eng.set_job(JobConfig(2, 1, 8, 8, A))
    assert send(eng, 0, [99] * 4, sender=sender, **packet_kw) == []
    if reason is None:
        assert eng.drops["unknown_job"] == 1
    else:
        assert eng.counters[1].drops[reason] == 1
    # job 2 (and job 1) still aggregate exactly
    for w in range(2):
        send(eng, w, [1] * 4, job=2, slot=9)
    (emit,) = send(eng, 2, [1] * 4, job=2, slot=9)
    assert result_values(emit)[1] == [3] * 4


def test_malformed_packets_are_dropped_and_counted():
    eng = make_engine()
    good = contrib(0, [1] * 4)
    assert eng.process(good[:10], A[0]) == []
    assert eng.process(good[:-1], A[0]) == []
    assert eng.process(bytes([0x21]) + good[1:], A[0]) == []        # version 2
    assert eng.process(good[:1] + bytes([0]) + good[2:4] + bytes([7]) + good[5:], A[0]) == []
    result = bytes([0x12]) + good[1:]                                  # a RESULT sent to us
    assert eng.process(result, A[0]) == []
    assert eng.drops == {"truncated": 1, "bad_version": 1}
    assert eng.counters[1].drops == {"bad_length": 1, "bad_worker": 1, "bad_type": 1}


def test_job_configuration_errors_name_the_problem():
    eng = make_engine()
    with pytest.raises(ValueError, match="overlap job 1"):
        eng.set_job(JobConfig(2, 1, 4, 8, A))
    with pytest.raises(ValueError, match="outside the pool"):
        eng.set_job(JobConfig(3, 1, 10, 8, A))
    with pytest.raises(ValueError, match="duplicate worker"):
        eng.set_job(JobConfig(4, 1, 8, 2, (A[0], A[0])))
    with pytest.raises(ValueError, match="1..32 workers"):
        eng.set_job(JobConfig(4, 1, 8, 2, tuple(("h", i) for i in range(33))))
    assert list(eng.jobs) == [1]


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64), worker=st.integers(0, 3))
def test_random_bytes_never_crash_the_engine(data, worker):
    eng = make_engine()
    eng.process(data, A[worker % 3])
    # the job still works afterwards
    for w in range(2):
        send(eng, w, [2] * 4, slot=5)
    (emit,) = send(eng, 2, [2] * 4, slot=5)
    assert result_values(emit)[1] == [6] * 4
