"""ATP's aggregator sharing on the slot engines (docs/atp.md): how much of each job's traffic the
switch sums as its pool shrinks, against the windows of ``sharing = "static"``.

An engine-level study, not a run of the data plane: a switch engine with an ATP pool and the
host aggregator's engine behind it, wired packet by packet in synchronous batches (every
worker sends what its window allows, a batch's packets cause the next batch's), lossless or
lossy, with a share of each batch held back so the jobs drift out of step (``--hold``); the
same wiring tests/test_engine_atp.py checks every sum with. It counts, it does not
time: per pool size and job, the share of the job's rounds the switch summed, its collisions
per round and the packets the host aggregator received per round. The ``static`` column is
that policy's placement of the same jobs, all arriving at once: a job whose window of
``--window`` slots still fits the pool is summed wholly on the switch, the others wholly on
the host aggregator.

    .venv/bin/python benchmarks/atp_pool.py [--pools 8 16 24 32 48 64 96 192 384] [--sizes 2 4 8]
        [--blocks 256] [--window 16] [--loss 0.0] [--hold 0.25] [--out DIR]
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Hashable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

from emulation_ranks import write_csv  # noqa: E402
from plots import pyplot  # noqa: E402

from inagg.hostlib.aggregator.engine import NativeEngine  # noqa: E402
from inagg.hostlib.aggregator.engine_reference import JobConfig  # noqa: E402
from inagg.hostlib.wire.protocol import (  # noqa: E402
    FLAG_FROM_HOST, FLAG_FROM_SWITCH, FLAG_RETRANSMIT, MSG_RESULT, build_contribution, round_fields,
    unpack_header,
)

K = 4                                   # values per packet: the counts do not depend on it
W = 4                                   # a job's window of host slots (the tests')
SWITCH, HOST = ("switch", 0), ("host", 0)   # the engines' ids of each other
FIELDS = ("pool", "job", "workers", "blocks", "on_switch", "static_on_switch", "collisions_per_round",
          "host_packets_per_round")


def job(job_id: int, n: int, *, peer: Hashable, window: int = W) -> JobConfig:
    """Job ``job_id`` with ``n`` workers and host slots [window * (job_id - 1), + window)."""
    members = tuple((f"10.0.{job_id}.{r}", 1) for r in range(n))
    return JobConfig(job_id, 1, window * (job_id - 1), window, members, atp_peer=peer)


def deployment(make: Callable, sizes: tuple[int, ...], pool: int, window: int = W) -> dict:
    """{"switch": an engine whose ATP pool is ``pool`` slots (from slot 8), "host": the host
    aggregator's}, serving jobs 1, 2, ... of ``sizes`` workers."""
    switch = make(8 + pool, K, host_mode=False)
    switch.set_atp_pool(8, pool)
    host = make(window * len(sizes), K, host_mode=True)
    for j, n in enumerate(sizes, 1):
        switch.set_job(job(j, n, peer=HOST, window=window))
        host.set_job(job(j, n, peer=SWITCH, window=window))
    return {"switch": switch, "host": host}


class Worker:
    """A rank: sends block c on host slot base + c mod W (its window) once block c - W's result
    is in, and resends every unanswered block when told to; results only from the host
    aggregator, each checked against the block it answers. Its values per packet are the
    width of ``values`` (blocks x K)."""

    def __init__(self, cfg: JobConfig, rank: int, values: np.ndarray) -> None:
        self.cfg, self.rank, self.values = cfg, rank, values
        self.k = values.shape[1]
        self.window = cfg.slot_count
        self.address = cfg.members[rank]
        self.results: dict[int, list[int]] = {}
        self.sent: set[int] = set()

    def packet(self, c: int, flags: int = 0) -> bytes:
        slot_set, tag_flags = round_fields(c // self.window)
        return build_contribution(self.cfg.job_id, self.rank, 1, self.cfg.slot_base + c % self.window, slot_set,
                                  c * self.k, self.values[c], self.k, exp=c % 5, flags=flags | tag_flags)

    def ready(self) -> list[bytes]:
        out = []
        for c in range(len(self.values)):
            if c not in self.sent and (c < self.window or c - self.window in self.results):
                self.sent.add(c)
                out.append(self.packet(c))
        return out

    def unanswered(self) -> list[bytes]:
        return [self.packet(c, FLAG_RETRANSMIT) for c in sorted(self.sent - set(self.results))]

    def receive(self, data: bytes) -> None:
        h = unpack_header(data)
        assert h.msg_type == MSG_RESULT and h.flags & FLAG_FROM_HOST and h.job_id == self.cfg.job_id
        c = h.offset // self.k
        got = np.frombuffer(data, ">i4", self.k, 16).tolist()
        if c in self.sent and c not in self.results:
            assert h.slot == self.cfg.slot_base + c % self.window and h.slot_set == (c // self.window) % 2
            self.results[c] = got
        elif c in self.results:
            assert self.results[c] == got, f"job {self.cfg.job_id} block {c}: a second result differs"


def deliver(nodes: dict, workers: list[Worker], dst, src, data: bytes) -> list[tuple]:
    """One packet into a worker, the switch (``src``: its sender), the host, or "ack": a host
    result passing the switch (an ACK there) on its way to worker ``src``; the packets it
    causes, addressed. What the switch sends up is the worker's own packet (its sender kept) or
    the switch's sum (FLAG_FROM_SWITCH, from SWITCH); what the host sends up is a release."""
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
        elif emit.upstream:                               # a release, to the switch alone
            out.append(("switch", HOST, emit.data))
        else:
            out += [("ack", w, emit.data) for w in workers
                    if w.cfg.job_id == emit.job.job_id and w.rank in emit.ranks]
    return out


def run_network(nodes: dict, workers: list[Worker], rng: random.Random, loss: float, dup: float,
                max_batches: int = 6000, hold: float = 0.0,
                finished: Callable[[], bool] | None = None) -> None:
    """Deliver in batches (as tests/test_engine_tree.py's: each shuffled, lossy, duplicating;
    what a batch causes goes in the next; ``hold``: the share of a batch held back to the next,
    so jobs drift out of step); when nothing is in flight every worker resends what is
    unanswered. Ends when ``finished()`` (default: every worker has every result and nothing is
    in flight); raises AssertionError when that takes more than ``max_batches``."""
    flight: list = []
    if finished is None:
        def finished() -> bool:
            return not flight and all(len(w.results) == len(w.values) for w in workers)
    for _ in range(max_batches):
        for w in workers:
            flight += [("switch", w.address, p) for p in w.ready()]
        if finished():
            return
        if not flight:
            flight = [("switch", w.address, p) for w in workers for p in w.unanswered()]
        batch, flight = flight, []
        batch += [m for m in batch if rng.random() < dup]
        rng.shuffle(batch)
        for item in batch:
            if rng.random() < hold:
                flight.append(item)
            elif rng.random() >= loss:
                flight += deliver(nodes, workers, *item)
    raise AssertionError("the jobs did not finish")


def make_workers(nodes: dict, rng: random.Random, blocks: dict[int, int]) -> list[Worker]:
    """Every job's workers, each with ``blocks[job]`` blocks of random values."""
    workers = []
    for cfg in nodes["host"].jobs.values():
        for r in range(cfg.n_workers):
            values = np.array([[rng.randrange(-2**20, 2**20) for _ in range(K)] for _ in range(blocks[cfg.job_id])],
                              np.int32)
            workers.append(Worker(cfg, r, values))
    return workers


def check_exact(workers: list[Worker]) -> None:
    """Every worker of every job holds, for every block, the sum of its job's workers' values."""
    for job_id in {w.cfg.job_id for w in workers}:
        mine = [w for w in workers if w.cfg.job_id == job_id]
        want = sum(w.values.astype(np.int64) for w in mine).tolist()
        for w in mine:
            assert [w.results[c] for c in range(len(w.values))] == want, f"job {job_id} rank {w.rank}"


# -- the study ---------------------------------------------------------------------------------

def pool_rows(pool: int, args: argparse.Namespace) -> list[dict]:
    """One row per job for an ATP pool of ``pool`` slots (every sum checked exact first)."""
    rng = random.Random(f"atp-pool-{pool}-{args.loss}-{args.hold}")
    nodes = deployment(NativeEngine, tuple(args.sizes), pool, args.window)
    workers = make_workers(nodes, rng, {j: args.blocks for j in range(1, len(args.sizes) + 1)})
    run_network(nodes, workers, rng, args.loss, 0.0, max_batches=100 * args.blocks, hold=args.hold)
    check_exact(workers)
    switch, host = nodes["switch"].counters, nodes["host"].counters
    rows = []
    for j, n in enumerate(args.sizes, 1):
        rows.append({
            "pool": pool, "job": j, "workers": n, "blocks": args.blocks,
            "on_switch": round(switch[j].results / args.blocks, 3),
            "static_on_switch": 1.0 if j <= pool // args.window else 0.0,
            "collisions_per_round": round(switch[j].collisions / args.blocks, 3),
            "host_packets_per_round": round(host[j].packets / args.blocks, 3),
        })
    return rows


def plot(rows: list[dict], path: Path, args: argparse.Namespace) -> None:
    """The share of all rounds summed on the switch against the pool, ATP and static."""
    plt = pyplot()
    if plt is None:
        return
    pools = sorted({r["pool"] for r in rows})
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("on_switch", "ATP (per-round hashed pool)"), ("static_on_switch", "static windows")):
        ax.plot(pools, [np.mean([r[key] for r in rows if r["pool"] == p]) for p in pools], marker="o", label=label)
    ax.set_xlabel(f"switch slots for {len(args.sizes)} jobs of {args.sizes} workers, window {args.window}")
    ax.set_ylabel("share of rounds summed on the switch")
    ax.set_title(f"engine-level counts, loss {args.loss}, hold {args.hold}, {args.blocks} blocks per job")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pools", type=int, nargs="+", default=[8, 16, 24, 32, 48, 64, 96, 192, 384])
    p.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8], help="workers of each job")
    p.add_argument("--blocks", type=int, default=256, help="rounds of each job")
    p.add_argument("--window", type=int, default=16, help="each job's window (host slots)")
    p.add_argument("--loss", type=float, default=0.0, help="share of packets lost on every hop")
    p.add_argument("--hold", type=float, default=0.25,
                   help="share of packets held a batch longer (0: every job in lock step)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "results" /
                   f"{datetime.now(timezone.utc):%Y-%m-%d}-atp")
    args = p.parse_args(argv)
    if min(args.pools) < 1 or args.blocks < 1 or args.window < 1 or not 0 <= args.loss < 1 \
            or not 0 <= args.hold < 1:
        p.error("--pools, --blocks and --window must be >= 1, --loss and --hold in [0, 1)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [row for pool in args.pools for row in pool_rows(pool, args)]
    name = f"atp_pool_loss{args.loss}_hold{args.hold}"
    write_csv(args.out / f"{name}.csv", FIELDS, rows)
    plot(rows, args.out / f"{name}.png", args)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    (args.out / f"{name}.txt").write_text(
        f"command: {' '.join(['benchmarks/atp_pool.py', *sys.argv[1:]])}\ncommit: {commit}\n"
        f"at: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC (counts: the machine's load does not change them)\n")
    print(f"wrote {args.out / name}.csv")


if __name__ == "__main__":
    main()
