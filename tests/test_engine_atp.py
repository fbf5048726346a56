"""ATP's aggregator sharing (hostlib/aggregator/atp_reference.py): a switch engine with a shared
pool too small for its jobs and the host aggregator's engine behind it, wired packet by packet,
on the Python reference and its C++ twin.

Workers address the host aggregator; the switch claims a pool aggregator per round, forwards a
collided round's packets, sends complete sums up, and frees an aggregator when the host's
result passes back. Over a lossy, duplicating, reordering network every worker of every job
must get the exact sums of every round (a tenant whose neighbour floods the pool too); each row
of the switch's table and of the host's rule for a switch's sum is checked on its own; and the
C++ engine must match the reference packet for packet on random ATP traffic."""

from __future__ import annotations

import random

import numpy as np
import pytest

from inagg.hostlib.aggregator.engine import NativeEngine
from inagg.hostlib.aggregator.engine_reference import AggregationEngine, JobConfig
from inagg.hostlib.wire.protocol import (
    FLAG_FROM_HOST, FLAG_FROM_SWITCH, FLAG_RETRANSMIT, MSG_RESULT, build_contribution,
    round_fields, unpack_header,
)

K = 4
W = 4                                   # each job's window of host slots
SWITCH, HOST = ("switch", 0), ("host", 0)
ENGINES = (AggregationEngine, NativeEngine)


def job(job_id: int, n: int, *, peer) -> JobConfig:
    """Job ``job_id`` with ``n`` workers and host slots [W * (job_id - 1), + W)."""
    members = tuple((f"10.0.{job_id}.{r}", 1) for r in range(n))
    return JobConfig(job_id, 1, W * (job_id - 1), W, members, atp_peer=peer)


def deployment(make, sizes, pool):
    """{"switch": engine with an ATP pool of ``pool`` slots, "host": the host aggregator}."""
    switch = make(16, K, host_mode=False)
    switch.set_atp_pool(8, pool)
    host = make(64, K, host_mode=True)
    for j, n in enumerate(sizes, 1):
        switch.set_job(job(j, n, peer=HOST))
        host.set_job(job(j, n, peer=SWITCH))
    return {"switch": switch, "host": host}


class Worker:
    """A rank: sends block c on host slot base + c mod W once block c - W's result is in, and
    resends every unanswered block when told to; results only from the host aggregator."""

    def __init__(self, cfg: JobConfig, rank: int, values: np.ndarray) -> None:
        self.cfg, self.rank, self.values = cfg, rank, values
        self.address = cfg.members[rank]
        self.results: dict[int, list[int]] = {}
        self.sent: set[int] = set()

    def packet(self, c: int, flags: int = 0) -> bytes:
        slot_set, tag_flags = round_fields(c // W)
        return build_contribution(self.cfg.job_id, self.rank, 1, self.cfg.slot_base + c % W, slot_set,
                                  c * K, self.values[c], K, exp=c % 5, flags=flags | tag_flags)

    def ready(self) -> list[bytes]:
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
        assert h.msg_type == MSG_RESULT and h.flags & FLAG_FROM_HOST and h.job_id == self.cfg.job_id
        c = h.offset // K
        got = np.frombuffer(data, ">i4", K, 16).tolist()
        if c in self.sent and c not in self.results:
            assert h.slot == self.cfg.slot_base + c % W and h.slot_set == (c // W) % 2
            self.results[c] = got
        elif c in self.results:
            assert self.results[c] == got, f"job {self.cfg.job_id} block {c}: a second result differs"


def deliver(nodes, workers, dst, src, data):
    """One packet into a worker, the switch (``src``: its sender), the host, or "ack": a host
    result passing the switch (an ACK there) on its way to worker ``src``; the packets it
    causes, addressed. What the switch sends up is the worker's own packet (its sender kept) or
    the switch's sum (FLAG_FROM_SWITCH, from SWITCH)."""
    if isinstance(dst, Worker):
        dst.receive(data)
        return []
    if dst == "ack":
        assert nodes["switch"].process(data, HOST) == []
        return [(src, HOST, data)]
    out = []
    for emit in nodes[dst].process(data, src):
        if dst == "switch":
            assert emit.upstream
            out.append(("host", SWITCH if emit.data[1] & FLAG_FROM_SWITCH else src, emit.data))
        else:
            out += [("ack", w, emit.data) for w in workers
                    if w.cfg.job_id == emit.job.job_id and w.rank in emit.ranks]
    return out


def run_network(nodes, workers, rng, loss, dup, max_batches=6000):
    """Batches as tests/test_engine_tree.py's: shuffled, lossy, duplicating; a batch's packets
    cause the next one's; when nothing is in flight every worker resends what is unanswered."""
    flight: list = []
    for _ in range(max_batches):
        for w in workers:
            flight += [("switch", w.address, p) for p in w.ready()]
        if not flight:
            if all(len(w.results) == len(w.values) for w in workers):
                return
            flight = [("switch", w.address, p) for w in workers for p in w.unanswered()]
        batch, flight = flight, []
        batch += [m for m in batch if rng.random() < dup]
        rng.shuffle(batch)
        for dst, src, data in batch:
            if rng.random() >= loss:
                flight += deliver(nodes, workers, dst, src, data)
    raise AssertionError("the jobs did not finish")


def make_workers(nodes, rng, blocks):
    workers = []
    for cfg in nodes["host"].jobs.values():
        for r in range(cfg.n_workers):
            values = np.array([[rng.randrange(-2**20, 2**20) for _ in range(K)] for _ in range(blocks[cfg.job_id])],
                              np.int32)
            workers.append(Worker(cfg, r, values))
    return workers


def check_exact(workers):
    """Every worker of every job holds, for every block, the sum of its job's workers' values."""
    for job_id in {w.cfg.job_id for w in workers}:
        mine = [w for w in workers if w.cfg.job_id == job_id]
        want = sum(w.values.astype(np.int64) for w in mine).tolist()
        for w in mine:
            assert [w.results[c] for c in range(len(w.values))] == want, f"job {job_id} rank {w.rank}"


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
@pytest.mark.parametrize("loss, dup", [(0.0, 0.0), (0.2, 0.0), (0.1, 0.2), (0.3, 0.3)])
def test_three_jobs_on_a_pool_too_small_get_exact_sums(make, loss, dup):
    """Three jobs (2, 3 and 4 workers), 3 * W rounds in flight at once on a pool of 5: rounds
    collide, complete at the host or on the switch, and every sum is exact."""
    rng = random.Random(f"{make.__name__}{loss}{dup}")
    nodes = deployment(make, (2, 3, 4), pool=5)
    workers = make_workers(nodes, rng, {1: 16, 2: 16, 3: 16})
    run_network(nodes, workers, rng, loss, dup)
    check_exact(workers)
    ctrs = nodes["switch"].counters
    assert sum(c.collisions for c in ctrs.values()) > 0
    assert sum(c.results for c in ctrs.values()) > 0            # ...and the switch summed some
    assert all(n == 0 for c in ctrs.values() for n in c.drops.values()) or loss or dup


@pytest.mark.parametrize("make", ENGINES, ids=lambda m: m.__name__)
def test_a_tenant_whose_neighbour_floods_the_pool_completes_exactly(make):
    """Job 1 (2 workers, 8 blocks) beside job 2, whose 8 workers send 200 blocks each, never
    all in together (one worker's packets lag), so its rounds hold aggregators long."""
    rng = random.Random(f"flood{make.__name__}")
    nodes = deployment(make, (2, 8), pool=3)
    workers = make_workers(nodes, rng, {1: 8, 2: 200})
    run_network(nodes, workers, rng, loss=0.05, dup=0.05, max_batches=20000)
    check_exact(workers)
    assert nodes["switch"].counters[1].collisions > 0
