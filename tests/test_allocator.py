"""Allocation policy: scenarios and property tests (many jobs arriving and leaving)."""

from hypothesis import given, settings
from hypothesis import strategies as st

import pytest

from inagg.controller.allocator import HOST, SHARING, STATIC, SWITCH, Demand, SlotAllocator


def check_invariants(a: SlotAllocator) -> None:
    owner = {}
    for j in a.jobs.values():
        assert j.active.epoch >= 1
        assert 0 <= j.active.slot_base and j.active.slot_count >= 1
        size = a.switch_slots if j.active.mode == SWITCH else a.host_slots
        assert j.active.slot_base + j.active.slot_count <= size
        if j.active.mode == SWITCH:
            assert j.active.slot_count >= a.min_window
            assert j.active.slot_base % a.min_window == 0 and j.active.slot_count % a.min_window == 0
        if j.pending is not None:
            assert j.pending.epoch > j.active.epoch
        for p in {j.active, j.pending} - {None}:
            for s in p.slots():
                other = owner.setdefault((p.mode, s), j.job_id)
                assert other == j.job_id, f"slot {p.mode}:{s} held by {other} and {j.job_id}"


def settle(a: SlotAllocator) -> None:
    """Let every job activate its pending grant, as workers would at their next boundary."""
    for _ in range(4 * len(a.jobs) + 4):
        pending = [(j.job_id, j.pending.epoch) for j in a.jobs.values() if j.pending]
        if not pending:
            return
        for job_id, epoch in pending:
            if job_id in a.jobs:
                a.activate(job_id, epoch)
                check_invariants(a)
    raise AssertionError("grants did not settle")


def test_two_jobs_fit_third_goes_to_host_and_is_upgraded_after_release():
    a = SlotAllocator(switch_slots=32, min_window=16)
    g1 = a.add_job(1, Demand(2, 1 << 20))
    assert g1.mode == SWITCH and g1.epoch == 1
    a.add_job(2, Demand(2, 1 << 20))
    settle(a)
    assert a.jobs[2].active.mode == SWITCH
    assert set(a.jobs[1].active.slots()).isdisjoint(a.jobs[2].active.slots())
    g3 = a.add_job(3, Demand(2, 1 << 20))
    assert g3.mode == HOST
    settle(a)
    assert a.jobs[3].active.mode == HOST
    a.remove_job(1)
    settle(a)
    assert a.jobs[3].active.mode == SWITCH and a.jobs[3].active.epoch > 1
    check_invariants(a)


def test_shares_follow_demand_and_respect_useful_window():
    a = SlotAllocator(switch_slots=100, min_window=10, values_per_packet=64)
    a.add_job(1, Demand(2, 300 * 256, 1.0))    # 300 blocks/iteration, rate 76800
    a.add_job(2, Demand(2, 100 * 256, 1.0))    # 100 blocks, a third of the rate
    settle(a)
    c1, c2 = a.jobs[1].active.slot_count, a.jobs[2].active.slot_count
    assert c1 + c2 == 100 and 70 <= c1 <= 80, (c1, c2)
    small = SlotAllocator(switch_slots=100, min_window=4, values_per_packet=64)
    small.add_job(1, Demand(2, 12 * 256))      # can use only 12 slots
    settle(small)
    assert small.jobs[1].active.slot_count == 12


def test_shrink_keeps_base_and_is_pending_until_activated():
    a = SlotAllocator(switch_slots=64, min_window=8)
    a.add_job(1, Demand(2, 1 << 24))
    settle(a)
    assert a.jobs[1].active.slot_count == 64
    a.add_job(2, Demand(2, 1 << 24))
    job1 = a.jobs[1]
    assert job1.active.slot_count == 64 and job1.pending.slot_base == job1.active.slot_base
    assert a.jobs[2].active.mode == HOST and a.jobs[2].pending is None   # nothing free yet
    assert a.activate(1, job1.pending.epoch)
    assert a.jobs[2].pending.mode == SWITCH                              # upgrade proposed now
    settle(a)
    assert {a.jobs[1].active.slot_count, a.jobs[2].active.slot_count} == {32}


def test_drain_and_superseded_epochs():
    a = SlotAllocator(switch_slots=32, min_window=8)
    a.add_job(1, Demand(1, 1 << 20))
    settle(a)
    p = a.drain(1)
    assert p.mode == HOST
    assert not a.activate(1, p.epoch + 5)         # no such pending grant: refused, nothing changes
    assert a.activate(1, p.epoch) and a.jobs[1].active.mode == HOST


def test_restore_brings_back_the_jobs_and_the_arrival_order():
    a = SlotAllocator(switch_slots=16, min_window=8)
    a.add_job(1, Demand(1, 1 << 20))
    saved = a.snapshot()
    a.add_job(2, Demand(1, 1 << 20))
    a.add_job(3, Demand(1, 1 << 20))
    a.drain(1)
    a.restore(saved)
    assert a.jobs == saved.jobs and not a.jobs[1].drained
    a.add_job(4, Demand(1, 1 << 20))         # arrives second, as if jobs 2 and 3 never came
    assert [j.order for j in a.jobs.values()] == [1, 2]
    a.remove_job(4)
    a.restore(saved)                         # a snapshot can be restored more than once
    assert a.jobs == saved.jobs and a.jobs[1] is not saved.jobs[1]


def test_a_tree_part_holds_its_window_while_the_policy_moves_the_others_around_it():
    a = SlotAllocator(switch_slots=32, min_window=8, max_jobs=3)
    assert a.can_reserve(2)
    part = a.reserve(1, Demand(4, 1 << 24), SWITCH, children=2)       # 4 ranks, 2 children here
    assert (part.slot_count, part.epoch) == (8, 1)
    a.add_job(2, Demand(2, 1 << 24))
    settle(a)
    assert a.jobs[2].active.slot_count == 24                            # grows around it, not over
    a.add_job(3, Demand(2, 1 << 24))
    settle(a)
    assert a.jobs[1].active == part and a.jobs[1].pending is None       # never resized nor evicted
    assert a.jobs[2].active.slot_count + a.jobs[3].active.slot_count == 24
    assert not a.can_reserve(1)                                         # no row, no window left
    check_invariants(a)
    b = SlotAllocator(switch_slots=32, min_window=8, worker_entries=6)
    b.reserve(1, Demand(4), SWITCH, children=2)
    b.add_job(2, Demand(2, 256))                                        # keeps one window
    assert b.can_reserve(2) and not b.can_reserve(3)                    # worker entries: 2 + 2 of 6


def test_static_sharing_holds_one_window_per_job_from_placement_to_end():
    """ATP's static partitioning: a job alone keeps one minimum window (the dynamic policy would
    grow it to the pool), a newcomer takes a free window without shrinking anyone, a third job
    waits on the host aggregator and is upgraded to the window the first one frees."""
    a = SlotAllocator(switch_slots=32, min_window=8, sharing=STATIC)
    a.add_job(1, Demand(2, 1 << 20))
    settle(a)
    assert (a.jobs[1].active.slot_count, a.jobs[1].active.epoch) == (8, 1)
    a.add_job(2, Demand(2, 1 << 22))
    a.add_job(3, Demand(2, 1 << 20))
    a.add_job(4, Demand(2, 1 << 20))
    settle(a)
    assert [a.jobs[j].active.slot_count for j in (1, 2, 3, 4)] == [8, 8, 8, 8]
    assert a.add_job(5, Demand(2, 1 << 20)).mode == HOST
    a.remove_job(2)
    settle(a)
    assert a.jobs[5].active.mode == SWITCH and a.jobs[5].active.slot_count == 8
    assert all(a.jobs[j].active.epoch == 1 for j in (1, 3, 4))      # nobody else moved
    check_invariants(a)


def test_an_unknown_sharing_policy_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="sharing 'fair': write one of dynamic, static"):
        SlotAllocator(switch_slots=32, sharing="fair")


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "remove", "activate", "drain"]),
                          st.integers(1, 12), st.integers(0, 1 << 22)), max_size=60),
       st.sampled_from([16, 64, 100]), st.sampled_from([4, 8]), st.sampled_from(SHARING))
def test_invariants_under_random_arrivals_and_departures(events, pool, min_window, sharing):
    a = SlotAllocator(switch_slots=pool, min_window=min_window, host_slots=12 * 32, sharing=sharing)
    for kind, job_id, size in events:
        if kind == "add" and job_id not in a.jobs:
            a.add_job(job_id, Demand(2, size, 0.5))
        elif kind == "remove":
            a.remove_job(job_id)
        elif kind == "activate" and job_id in a.jobs and a.jobs[job_id].pending:
            a.activate(job_id, a.jobs[job_id].pending.epoch)
        elif kind == "drain" and job_id in a.jobs:
            a.drain(job_id)
        check_invariants(a)
    settle(a)
    switch_jobs = [j for j in a.jobs.values() if j.active.mode == SWITCH]
    undrained = [j for j in a.jobs.values() if not j.drained]
    assert len(switch_jobs) == min(len(undrained), pool // min_window)
    assert sharing != STATIC or all(j.active.slot_count == min_window for j in switch_jobs)
    for job_id in list(a.jobs):
        a.remove_job(job_id)
    assert a.jobs == {} and a._free_run(SWITCH, pool, 0) == 0
