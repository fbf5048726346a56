"""ATP's aggregator sharing (hostlib/aggregator/atp_reference.py): a switch engine with a shared
pool too small for its jobs and the host aggregator's engine behind it, wired packet by packet,
on the Python reference and its C++ twin.

Workers address the host aggregator; the switch claims a pool aggregator per round, forwards a
collided round's packets, sends complete sums up, and frees an aggregator when the host's
result passes back. Over a lossy, duplicating, reordering network every worker of every job
must get the exact sums of every round (a tenant whose neighbour floods the pool too); each row
of the switch's table and of the host's rule for a switch's sum is checked on its own; and the
C++ engine must match the reference packet for packet on random ATP traffic. The wiring (the
workers, the network) is benchmarks/atp_pool.py's, whose study counts on it."""

from __future__ import annotations

import random
from dataclasses import replace
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inagg.hostlib.aggregator.engine import NativeEngine
from inagg.hostlib.aggregator.engine_reference import AggregationEngine, JobConfig
from inagg.hostlib.wire.protocol import (
    FLAG_FROM_HOST, FLAG_FROM_SWITCH, FLAG_RETRANSMIT, MSG_RESULT, build_contribution,
    Outcome, round_fields, unpack_header,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from atp_pool import (  # noqa: E402  the wiring of a switch and a host aggregator, with workers
    HOST, K, SWITCH, W, check_exact, deployment, job, make_workers, run_network,
)

ENGINES = (AggregationEngine, NativeEngine)


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
@pytest.mark.parametrize("loss, dup", [(0.0, 0.0), (0.0, 0.3), (0.2, 0.0), (0.1, 0.2), (0.3, 0.3)])
def test_three_jobs_on_a_pool_too_small_get_exact_sums(make, loss, dup):
    """Three jobs (2, 3 and 4 workers), 3 * W rounds in flight at once on a pool of 5, a quarter
    of the packets held back a batch (late copies): rounds collide, complete at the host or on
    the switch, every sum is exact, and without loss the drained pool is free again."""
    rng = random.Random(f"{make.__name__}{loss}{dup}")
    nodes = deployment(make, (2, 3, 4), pool=5)
    workers = make_workers(nodes, rng, {1: 16, 2: 16, 3: 16})
    run_network(nodes, workers, rng, loss, dup, hold=0.25)
    check_exact(workers)
    if not loss:                        # every claim was answered: the drained pool is free
        assert nodes["switch"].atp_held == 0
    ctrs = nodes["switch"].counters
    assert sum(c.collisions for c in ctrs.values()) > 0
    assert sum(c.results for c in ctrs.values()) > 0            # ...and the switch summed some
    assert all(n == 0 for c in ctrs.values() for n in c.drops.values()) or loss or dup


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
def test_a_tenant_whose_neighbour_floods_the_pool_completes_exactly(make):
    """Job 1 (2 workers, 8 blocks) beside job 2, whose 8 workers send 200 blocks each through a
    pool of 3, a quarter of the packets held back a batch (so rounds stay open long)."""
    rng = random.Random(f"flood{make.__name__}")
    nodes = deployment(make, (2, 8), pool=3)
    workers = make_workers(nodes, rng, {1: 8, 2: 200})
    run_network(nodes, workers, rng, loss=0.05, dup=0.05, max_batches=20000, hold=0.25)
    check_exact(workers)
    assert nodes["switch"].counters[1].collisions > 0


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
def test_a_tenant_beside_a_neighbour_that_never_completes_a_round(make):
    """Job 2's rank 7 is gone: its 7 others claim the whole pool with partials no one completes
    (and resend them forever); job 1 still gets every sum, exact, from the host aggregator."""
    rng = random.Random(f"stuck{make.__name__}")
    nodes = deployment(make, (2, 8), pool=3)
    workers = [w for w in make_workers(nodes, rng, {1: 12, 2: 40}) if (w.cfg.job_id, w.rank) != (2, 7)]
    mine = [w for w in workers if w.cfg.job_id == 1]
    run_network(nodes, workers, rng, loss=0.05, dup=0.05, max_batches=5000,
                finished=lambda: all(len(w.results) == len(w.values) for w in mine))
    check_exact(mine)
    switch = nodes["switch"]
    assert switch.counters[1].collisions > 0 and switch.counters[2].results == 0


# -- each row on its own -----------------------------------------------------------------------

def one_aggregator(make, n=2):
    """A switch whose ATP pool is one aggregator (every round hashes to it), jobs 1 and 2 of
    ``n`` workers each."""
    return deployment(make, (n, n), pool=1)["switch"]


def contribution(job_id, rank, *, block=0, flags=0, value=None, offset=None):
    cfg = job(job_id, 2, peer=HOST)
    slot_set, tag_flags = round_fields(block // W)
    values = np.full(K, rank + 1 if value is None else value, np.int32)
    return build_contribution(job_id, rank, 1, cfg.slot_base + block % W, slot_set,
                              block * K if offset is None else offset, values, K, exp=rank,
                              flags=flags | tag_flags)


def send(eng, job_id, rank, **kw):
    return eng.process(contribution(job_id, rank, **kw), (f"10.0.{job_id}.{rank}", 1))


def host_result(job_id, block=0):
    """The host aggregator's result of ``block`` (what passes the switch as the ACK)."""
    host = deployment(AggregationEngine, (2, 2), pool=1)["host"]
    for r in range(2):
        host.process(contribution(job_id, r, block=block), (f"10.0.{job_id}.{r}", 1))
    (res,) = host.process(contribution(job_id, 0, block=block), (f"10.0.{job_id}.0", 1))
    return res.data


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
def test_switch_claims_adds_and_sends_the_complete_sum_up(make):
    eng = one_aggregator(make)
    first = contribution(1, 0)
    (mirror,) = eng.process(first, ("10.0.1.0", 1))
    assert eng.last_outcome == Outcome.FIRST and mirror.upstream and mirror.data == first
    (up,) = send(eng, 1, 1)
    assert eng.last_outcome == Outcome.ADD and up.upstream
    h = unpack_header(up.data)
    assert (h.msg_type, h.flags & FLAG_FROM_SWITCH, h.worker_id, h.exp, h.slot, h.offset) == (1, FLAG_FROM_SWITCH, 1, 1, 0, 0)
    assert np.frombuffer(up.data, ">i4", K, 16).tolist() == [3] * K
    assert eng.counters[1].results == 1 and eng.counters[1].aggregated == 2


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
def test_a_lone_worker_sends_its_sum_at_once(make):
    eng = one_aggregator(make, n=1)
    (up,) = send(eng, 1, 0)
    assert eng.last_outcome == Outcome.FIRST and up.data[1] & FLAG_FROM_SWITCH


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
def test_duplicates_go_up_pending_or_as_the_sum_again(make):
    eng = one_aggregator(make)
    send(eng, 1, 0)
    (again,) = send(eng, 1, 0, flags=FLAG_RETRANSMIT)
    assert eng.last_outcome == Outcome.DUP_PENDING and again.data == contribution(1, 0, flags=FLAG_RETRANSMIT)
    send(eng, 1, 1)
    (sum_again,) = send(eng, 1, 0, flags=FLAG_RETRANSMIT)
    h = unpack_header(sum_again.data)
    assert eng.last_outcome == Outcome.DUP_UPSTREAM and h.worker_id == 0
    assert h.flags & (FLAG_FROM_SWITCH | FLAG_RETRANSMIT) == FLAG_FROM_SWITCH | FLAG_RETRANSMIT
    assert send(eng, 1, 1, offset=K) == [] and eng.last_outcome == Outcome.BAD_ROUND


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
def test_a_held_aggregator_collides_until_the_host_result_frees_it(make):
    eng = one_aggregator(make)
    send(eng, 1, 0)
    other = contribution(2, 0)
    (fwd,) = eng.process(other, ("10.0.2.0", 1))
    assert eng.last_outcome == Outcome.COLLISION and fwd.upstream and fwd.data == other
    assert eng.counters[2].collisions == 1 and eng.counters[1].collisions == 0
    assert eng.process(host_result(2), HOST) == [] and eng.last_outcome == Outcome.ACK
    send(eng, 2, 1)                                      # not job 2's aggregator: still held
    assert eng.last_outcome == Outcome.COLLISION
    assert eng.process(host_result(1), ("10.0.1.0", 1)) == [] and eng.last_outcome == Outcome.BAD_WORKER
    eng.process(host_result(1), HOST)                    # job 1's result passes: freed
    send(eng, 2, 1)
    assert eng.last_outcome == Outcome.FIRST


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
def test_an_owner_of_an_old_epoch_holds_nothing(make):
    eng = one_aggregator(make)
    send(eng, 1, 0)
    eng.set_job(JobConfig(1, 2, 0, W, job(1, 2, peer=HOST).members, atp_peer=HOST))
    send(eng, 2, 0)
    assert eng.last_outcome == Outcome.FIRST


def host_engine(make):
    return deployment(make, (2, 2), pool=1)["host"]


def switch_sum(value, *, block=0, flags=0, rank=1):
    data = bytearray(contribution(1, rank, block=block, value=value, flags=flags | FLAG_FROM_SWITCH))
    return bytes(data)


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
def test_host_takes_a_switch_sum_over_its_partial_and_answers_later_copies(make):
    host = host_engine(make)
    assert host.process(contribution(1, 0), ("10.0.1.0", 1)) == []      # a collided packet
    (res,) = host.process(switch_sum(5), SWITCH)
    assert host.last_outcome == Outcome.SWITCH_SUM and res.ranks == (0, 1)
    assert np.frombuffer(res.data, ">i4", K, 16).tolist() == [5] * K     # not 5 + the partial
    assert unpack_header(res.data).flags & FLAG_FROM_HOST
    (again,) = host.process(switch_sum(5, flags=FLAG_RETRANSMIT, rank=0), SWITCH)
    assert host.last_outcome == Outcome.DUP_DONE and again.ranks == (0,)
    (late,) = host.process(contribution(1, 1), ("10.0.1.1", 1))
    assert host.last_outcome == Outcome.DUP_DONE and late.ranks == (1,)
    assert host.process(switch_sum(5), ("10.0.1.1", 1)) == [] and host.last_outcome == Outcome.BAD_WORKER


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
def test_host_refuses_a_switch_sum_of_another_round(make):
    host = host_engine(make)
    host.process(switch_sum(5), SWITCH)
    host.process(contribution(1, 0, block=W), ("10.0.1.0", 1))         # round 1 on the other set
    assert host.process(switch_sum(5, block=2 * W), SWITCH) == []       # next on a busy set
    assert host.last_outcome == Outcome.BAD_ROUND
    (release,) = host.process(switch_sum(5, block=6 * W), SWITCH)       # neither this nor next
    assert host.last_outcome == Outcome.STALE_ROUND and release.upstream
    h = unpack_header(release.data)                                     # to the switch alone
    assert (h.msg_type, h.flags, h.count, h.slot, h.offset) == (MSG_RESULT, FLAG_FROM_HOST | 0x30, 0, 0, 6 * W * K)
    assert len(release.data) == 16


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
def test_a_late_copy_claims_an_aggregator_the_host_releases(make):
    """Job 1's round 0 ends, and so does the slot's next round (its set is now empty at the
    host); a copy of round 0 arrives late and claims the free aggregator: the host answers its
    mirror with a release to the switch alone, which frees it for job 2."""
    switch, host = wired(make)
    for block in (0, W):
        for r in (0, 1):
            to_host(host, send(switch, 1, r, block=block), (f"10.0.1.{r}", 1))
        switch.process(host_result(1, block=block), HOST)
    (mirror,) = send(switch, 1, 0)                                      # the late copy claims
    assert switch.last_outcome == Outcome.FIRST
    (release,) = host.process(mirror.data, ("10.0.1.0", 1))
    assert host.last_outcome == Outcome.STALE_ROUND and release.upstream and release.ranks == ()
    assert switch.process(release.data, HOST) == [] and switch.last_outcome == Outcome.ACK
    send(switch, 2, 0)
    assert switch.last_outcome == Outcome.FIRST                         # freed, not a collision


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
@pytest.mark.parametrize("setup, error", [
    (lambda e, m: m(8, K, host_mode=True).set_atp_pool(0, 2), "the ATP pool is a switch's"),
    (lambda e, m: e.set_atp_pool(6, 4), "outside the 8 slots"),
    (lambda e, m: e.set_atp_pool(2, 2), "overlaps job 9's window"),
    (lambda e, m: e.set_job(JobConfig(1, 1, 0, W, (("a", 1),), atp_peer=HOST)), "set_atp_pool first"),
])
def test_pool_configuration_errors_name_the_problem(make, setup, error):
    eng = make(8, K, host_mode=False)
    eng.set_job(JobConfig(9, 1, 0, 4, (("b", 1),)))
    with pytest.raises(ValueError, match=error):
        setup(eng, make)


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
def test_a_window_job_stays_out_of_the_pool(make):
    eng = make(8, K, host_mode=False)
    eng.set_atp_pool(4, 4)
    with pytest.raises(ValueError, match="overlap the ATP pool"):
        eng.set_job(JobConfig(9, 1, 2, 4, (("b", 1),)))
    eng.set_job(JobConfig(1, 1, 0, 4, (("a", 1),), atp_peer=HOST))       # the host's slots 0..3
    eng.set_job(JobConfig(9, 1, 0, 4, (("b", 1),)))                     # beside it on the switch
    with pytest.raises(ValueError, match="do not mix"):
        eng.set_job(JobConfig(2, 1, 0, 4, (("a", 1), ("c", 1)), atp_peer=HOST, n_children=1))


# -- the C++ engine against the reference --------------------------------------------------------

@st.composite
def atp_packets(draw):
    """A packet for an ATP switch or host aggregator: mostly workers' contributions of a few
    rounds, with the host's results (ACKs), switch sums, strangers, resends and packets of
    another epoch among them."""
    job_id = draw(st.sampled_from([1, 1, 2]))
    rank = draw(st.integers(0, 2 if job_id == 1 else 1))
    block = draw(st.sampled_from([0, 0, 0, 1, 1, W, W + 1, 2 * W]))
    kind = draw(st.sampled_from(["worker"] * 6 + ["ack", "sum", "stranger"]))
    flags = draw(st.sampled_from([0, 0, FLAG_RETRANSMIT]))
    value = draw(st.sampled_from([0, 1, -1, 2**31 - 1, -2**31]))
    cfg = job(job_id, 3 if job_id == 1 else 2, peer=HOST)
    slot_set, tag = round_fields(block // W)
    offset = draw(st.sampled_from([block * K] * 12 + [7 * K]))    # now and then a bad round
    epoch = draw(st.sampled_from([1, 1, 1, 2]))
    head = (job_id, rank, epoch, cfg.slot_base + block % W, slot_set, offset)
    if kind == "ack":
        data = bytearray(build_contribution(*head, np.full(K, value, np.int32), K, flags=tag | FLAG_FROM_HOST))
        data[0] = (data[0] & 0xF0) | MSG_RESULT
        return bytes(data), HOST
    extra = FLAG_FROM_SWITCH if kind == "sum" else 0
    data = build_contribution(*head, np.full(K, value, np.int32), K, exp=rank, flags=flags | tag | extra)
    sender = {"sum": SWITCH, "stranger": ("10.9.9.9", 1)}.get(kind, cfg.members[rank])
    return data, sender


SIZES = {1: 3, 2: 2}
# Now and then the jobs change: job 1 to epoch 2 (what its old rounds hold is free), job 2
# gone, both back as they were.
GRANTS = st.sampled_from([{1: 2, 2: 1}, {1: 1}, {1: 1, 2: 1}, {1: 2}])


def apply_grant(switch, host, epochs: dict[int, int]) -> None:
    """Serve jobs ``epochs`` (job -> epoch) on both, each with its peer."""
    for eng, peer in ((switch, HOST), (host, SWITCH)):
        eng.replace_jobs({j: replace(job(j, SIZES[j], peer=peer), epoch=e) for j, e in epochs.items()})


def twin_deployments(pool):
    out = []
    for make in ENGINES:
        switch = make(16, K, host_mode=False)
        switch.set_atp_pool(8, pool)
        host = make(16, K, host_mode=True)
        apply_grant(switch, host, {1: 1, 2: 1})
        out.append((switch, host))
    return out


def emitted(emits):
    return [(e.job.job_id, e.ranks, e.upstream, e.data) for e in emits]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 29), atp_packets(), GRANTS).map(   # 1 in 30: a grant
    lambda t: t[2] if t[0] == 0 else t[1]), min_size=5, max_size=150), st.integers(1, 3))
def test_native_atp_matches_the_reference(sequence, pool):
    (py_sw, py_host), (nat_sw, nat_host) = twin_deployments(pool)
    for step in sequence:
        if isinstance(step, dict):
            apply_grant(py_sw, py_host, step)
            apply_grant(nat_sw, nat_host, step)
            continue
        data, sender = step
        for py, nat in ((py_sw, nat_sw), (py_host, nat_host)):
            assert emitted(nat.process(data, sender)) == emitted(py.process(data, sender))
            assert nat.last_outcome == py.last_outcome
    assert nat_sw.snapshot_counters() == py_sw.snapshot_counters()
    assert nat_sw.atp_held == py_sw.atp_held
    assert nat_host.snapshot_counters() == py_host.snapshot_counters()


# -- a round split between the switch and the host aggregator -----------------------------------

def wired(make, n1=2):
    """A switch with one ATP aggregator and the host aggregator; job 1 of ``n1`` workers, job 2
    of 2."""
    nodes = deployment(make, (n1, 2), pool=1)
    return nodes["switch"], nodes["host"]


def to_host(host, emits, sender):
    """The switch's emits into the host: its sums from SWITCH, forwarded packets from ``sender``."""
    out = []
    for e in emits:
        out += host.process(e.data, SWITCH if e.data[1] & FLAG_FROM_SWITCH else sender)
    return out


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
def test_a_round_split_by_a_collision_completes_once_with_the_switch_sum(make):
    """Job 1's rank 0 collides (job 2 holds the aggregator) and reaches the host alone; job 2's
    round ends and frees it; rank 1 claims it (its packet mirrored: the host holds 0 and 1),
    rank 2 joins; rank 0's resend completes the switch's round, whose sum replaces the host's
    partial: the result is 1 + 2 + 3, made once, nothing counted twice."""
    switch, host = wired(make, n1=3)
    send(switch, 2, 0)
    assert to_host(host, send(switch, 1, 0), ("10.0.1.0", 1)) == []     # collided, partial at host
    assert switch.last_outcome == Outcome.COLLISION
    send(switch, 2, 1)
    switch.process(host_result(2), HOST)                                # job 2's result frees it
    assert to_host(host, send(switch, 1, 1), ("10.0.1.1", 1)) == []     # claims, mirrored
    assert (switch.last_outcome, host.last_outcome) == (Outcome.FIRST, Outcome.ADD)
    assert send(switch, 1, 2) == [] and switch.last_outcome == Outcome.ADD
    (res,) = to_host(host, send(switch, 1, 0, flags=FLAG_RETRANSMIT), ("10.0.1.0", 1))
    assert (switch.last_outcome, host.last_outcome) == (Outcome.ADD, Outcome.SWITCH_SUM)
    assert res.ranks == (0, 1, 2) and np.frombuffer(res.data, ">i4", K, 16).tolist() == [6] * K
    assert host.counters[1].results == 1 and switch.counters[1].results == 1


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
def test_a_partial_the_host_completed_is_freed_never_sent(make):
    """Both ranks' packets of job 1 collide and complete at the host; a late resend had claimed
    the aggregator meanwhile: the host's result passing frees it, and the partial it held is
    never sent up (nor its values counted anywhere)."""
    switch, host = wired(make)
    send(switch, 2, 0)
    for r in (0, 1):
        out = to_host(host, send(switch, 1, r), (f"10.0.1.{r}", 1))
    (res,) = out
    assert host.last_outcome == Outcome.ADD and res.ranks == (0, 1)
    send(switch, 2, 1)
    switch.process(host_result(2), HOST)                                # free again
    (mirror,) = send(switch, 1, 0, flags=FLAG_RETRANSMIT)               # rank 0 lost its result
    assert switch.last_outcome == Outcome.FIRST
    (answer,) = host.process(mirror.data, ("10.0.1.0", 1))
    assert host.last_outcome == Outcome.DUP_DONE and answer.ranks == (0,)
    assert switch.process(answer.data, HOST) == [] and switch.last_outcome == Outcome.ACK
    send(switch, 2, 0, block=1)                                         # job 2's next round claims
    assert switch.last_outcome == Outcome.FIRST
    assert switch.counters[1].results == 0                              # job 1: no sum ever sent
