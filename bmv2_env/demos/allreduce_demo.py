"""``inagg-demo``: N worker processes allreduce tensors through a host aggregator on loopback.

Every worker checks its results against a float64 reference within the codec's error bound and
reports goodput and the bytes it put on the wire. ``run_local_job`` is also the end-to-end
harness of the tests and the benchmark: real processes, real sockets, the real aggregator CLI.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import subprocess
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from inagg.hostlib import add_version_flag
from inagg.hostlib.aggregator import server as aggregator_server
from inagg.hostlib.launch import python_m
from inagg.hostlib.wire import codec
from inagg.hostlib.wire.grant import HOST_VALUES_PER_PACKET, HOST_WINDOW, Grant, parse_address
from inagg.hostlib.worker.stream import NativeSlotStream
from inagg.hostlib.worker.stream_reference import SlotStream
from inagg.hostlib.wire.transport import UdpTransport

JOB_ID = 1
EPOCH = 1


@dataclass(frozen=True)
class TensorSpec:
    """A deterministic test tensor: each rank draws its own from ``seed`` and its rank."""

    numel: int
    dtype: str = "float32"
    dynamic_range: float = 8.0  # float32: values are normal * exp(uniform(-r, r))
    seed: int = 0

    def make(self, rank: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, rank, self.numel])
        if self.dtype == "int32":
            return rng.integers(-(1 << 20), 1 << 20, self.numel, dtype=np.int32)
        scale = np.exp(rng.uniform(-self.dynamic_range, self.dynamic_range, self.numel))
        return (rng.standard_normal(self.numel) * scale).astype(np.float32)


@dataclass
class WorkerReport:
    rank: int
    stats: dict
    results: list[np.ndarray] | None
    max_err_over_bound: float
    seconds: list[float] = field(default_factory=list)
    started: list[float] = field(default_factory=list)  # time.perf_counter() (CLOCK_MONOTONIC) at each call


def check_result(spec: TensorSpec, y: np.ndarray, n: int, k: int) -> float:
    """max |error| / bound over the tensor (<= 1 means within the codec's proven bound);
    int32 results must be exact (returns 0.0 or inf)."""
    if not y.size:
        return 0.0
    xs = [spec.make(r) for r in range(n)]
    if spec.dtype == "int32":
        ref = np.sum(np.stack(xs).astype(np.int64), axis=0).astype(np.int32)  # wraps like int32
        return 0.0 if np.array_equal(y, ref) else float("inf")
    ref = np.sum(np.stack(xs).astype(np.float64), axis=0)
    exps = np.max(np.stack([codec.block_exponents(x, k)[0] for x in xs]), axis=0)
    bound = np.empty_like(ref)
    for c, e in enumerate(exps.tolist()):
        sl = slice(c * k, (c + 1) * k)
        bound[sl] = codec.error_bound(ref[sl], e, n) + 2.0**-52 * np.sum(
            np.abs(np.stack([x[sl] for x in xs]).astype(np.float64)), axis=0)
    return float(np.max(np.abs(y.astype(np.float64) - ref) / bound))


def _worker(rank: int, n: int, specs: list[TensorSpec], conn, keep: bool, check: bool, native: bool) -> None:
    transport = UdpTransport(("127.0.0.1", 0), bind=("127.0.0.1", 0))
    conn.send(transport.address)
    grant: Grant = conn.recv()
    transport.retarget(grant.aggregator)
    stream = (NativeSlotStream if native else SlotStream)(grant, rank, n, transport)
    results, seconds, started, worst = [], [], [], 0.0
    for spec in specs:
        x = spec.make(rank)
        t0 = time.perf_counter()
        stream.allreduce(x)
        seconds.append(time.perf_counter() - t0)
        started.append(t0)
        if keep:
            results.append(x)
        if check:
            worst = max(worst, check_result(spec, x, n, grant.values_per_packet))
    conn.send(WorkerReport(rank, stream.stats.as_dict(), results if keep else None, worst, seconds, started))
    transport.close()


@dataclass
class JobRun:
    workers: list[WorkerReport]
    aggregator: dict
    wall_seconds: float


def run_local_job(
    n_workers: int,
    specs: list[TensorSpec],
    *,
    window: int = HOST_WINDOW,
    values_per_packet: int = HOST_VALUES_PER_PACKET,
    drop_rate: float = 0.0,
    seed: int = 0,
    keep_results: bool = False,
    check: bool = True,
    timeout: float = 300.0,
    native: bool = True,
) -> JobRun:
    """Start the aggregator CLI and ``n_workers`` processes, allreduce ``specs`` in order.

    Each worker checks its results against the float64 reference when ``check`` is set
    (``WorkerReport.max_err_over_bound``) and returns them when ``keep_results`` is set.
    ``native``: workers run the C++ stream (else the Python one, its specification)."""
    ctx = mp.get_context("spawn")
    pipes, procs = _start_workers(ctx, n_workers, specs, keep_results, check, native)
    agg = None
    try:
        job = {"job_id": JOB_ID, "epoch": EPOCH, "slot_base": 0, "slot_count": window,
               "workers": _worker_addresses(pipes)}
        agg = subprocess.Popen(_aggregator_command(job, window, values_per_packet, drop_rate, seed),
                               stdout=subprocess.PIPE, text=True)
        address = _aggregator_address(agg)
        grant = Grant(JOB_ID, EPOCH, 0, window, values_per_packet, address, mode="host")
        t0 = time.perf_counter()
        for conn in pipes:
            conn.send(grant)
        reports = _reports(pipes, timeout)
        wall = time.perf_counter() - t0
    finally:
        out = _stop(procs, agg)
    return JobRun(reports, json.loads(out[out.index("{"):]), wall)


def _start_workers(ctx, n_workers: int, specs: list[TensorSpec], keep_results: bool, check: bool,
                   native: bool) -> tuple[list, list]:
    """One process a rank, each with a pipe to this one; returns (pipes, processes)."""
    pipes, procs = [], []
    for rank in range(n_workers):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(rank, n_workers, specs, child, keep_results, check, native),
                        daemon=True)
        p.start()
        pipes.append(parent)
        procs.append(p)
    return pipes, procs


def _worker_addresses(pipes: list) -> list[str]:
    """Each worker's "ip:port", sent once it bound its socket."""
    members = []
    for conn in pipes:
        if not conn.poll(60):
            raise RuntimeError("a worker process did not start")
        members.append("%s:%d" % conn.recv())
    return members


def _aggregator_command(job: dict, window: int, values_per_packet: int, drop_rate: float,
                        seed: int) -> list[str]:
    """The aggregator CLI serving ``job`` alone on a free loopback port."""
    return python_m(aggregator_server, "--bind", "127.0.0.1:0",
                    "--slots", str(window), "--values-per-packet", str(values_per_packet),
                    "--job", json.dumps(job), "--drop-rate", str(drop_rate), "--seed", str(seed))


def _aggregator_address(agg: subprocess.Popen) -> tuple[str, int]:
    """The address the aggregator announces on its first line."""
    line = agg.stdout.readline()
    if "listening on" not in line:
        raise RuntimeError(f"aggregator did not start: {line!r}")
    return parse_address(line.split()[3])


def _reports(pipes: list, timeout: float) -> list:
    """Every worker's report, in rank order."""
    reports = []
    for conn in pipes:
        if not conn.poll(timeout):
            raise TimeoutError(f"workers did not finish within {timeout}s")
        reports.append(conn.recv())
    return reports


def _stop(procs: list, agg: subprocess.Popen | None) -> str:
    """Wait for the workers (killing any left after 5 s each) and stop the aggregator; returns
    what it printed (its counters as JSON at the end)."""
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    out = ""
    if agg is not None:
        agg.terminate()
        out, _ = agg.communicate(timeout=30)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="inagg-allreduce-demo", description=__doc__.split("\n\n")[0])
    add_version_flag(p)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--mib", type=float, default=16.0, help="size of the largest tensor in MiB")
    p.add_argument("--window", type=int, default=HOST_WINDOW, help="aggregator slots of the job (W)")
    p.add_argument("--values-per-packet", type=int, default=HOST_VALUES_PER_PACKET)
    p.add_argument("--drop-rate", type=float, default=0.0, help="inject loss at the aggregator")
    args = p.parse_args(argv)
    big = int(args.mib * (1 << 20)) // 4
    specs = [TensorSpec(big, seed=1), TensorSpec(big // 4 + 3, dynamic_range=1.0, seed=2),
             TensorSpec(999_999, dtype="int32", seed=3)]
    total = sum(s.numel * 4 for s in specs)
    print(f"inagg demo: {args.workers} workers allreduce {len(specs)} tensors "
          f"({total / 2**20:.1f} MiB per worker) through the host aggregator on loopback")
    run = run_local_job(args.workers, specs, window=args.window,
                        values_per_packet=args.values_per_packet, drop_rate=args.drop_rate)
    print(f"{'rank':>4} {'seconds':>8} {'goodput MB/s':>13} {'wire sent/tensor':>17} "
          f"{'retransmits':>11} {'err/bound':>9}")
    ok = True
    for r in run.workers:
        s = r.stats
        ok &= r.max_err_over_bound <= 1.0
        print(f"{r.rank:>4} {s['seconds']:>8.2f} {total / s['seconds'] / 1e6:>13.1f} "
              f"{s['wire_bytes_sent'] / total:>17.4f} {s['retransmissions']:>11} "
              f"{r.max_err_over_bound:>9.3f}")
    job = run.aggregator["jobs"][str(JOB_ID)]
    print(f"aggregator: {job['aggregated']} contributions, {job['results']} results, "
          f"{job['duplicates']} duplicates, drops {job['drops'] or 'none'}")
    print("all results within the codec bound" if ok else "RESULT OUTSIDE THE CODEC BOUND")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
