"""Host-aggregator allreduce vs torch.distributed gloo, same machine, same tensor, one run.

Prints goodput, time ratio (inagg / gloo) and bytes on the wire per worker over tensor bytes,
counted by inagg itself and, for both systems, from the loopback interface's byte counter.
Writes benchmarks/results/allreduce.csv.
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostlib.demo import TensorSpec, run_local_job  # noqa: E402
from hostlib.grant import HOST_VALUES_PER_PACKET, HOST_WINDOW  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def lo_tx_bytes() -> int:
    return int(Path("/sys/class/net/lo/statistics/tx_bytes").read_text())


def _gloo_worker(rank: int, n: int, numel: int, reps: int, init: str, q) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=n)
    x = torch.from_numpy(TensorSpec(numel, seed=1).make(rank))
    dist.all_reduce(x.clone())  # warm-up: connections, buffers
    dist.barrier()
    times = []
    for _ in range(reps):
        y = x.clone()
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(y)
        times.append(time.perf_counter() - t0)
    q.put((rank, times))
    dist.destroy_process_group()


def gloo_allreduce(n: int, numel: int, reps: int) -> tuple[float, int]:
    """Median per-call seconds (slowest rank) and loopback bytes per call."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        init = f"file://{d}/rendezvous"
        procs = [ctx.Process(target=_gloo_worker, args=(r, n, numel, reps, init, q)) for r in range(n)]
        before = lo_tx_bytes()
        for p in procs:
            p.start()
        results = [q.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
        wire = lo_tx_bytes() - before
    per_call = [max(t[i] for _, t in results) for i in range(reps)]
    return statistics.median(per_call), wire // (reps + 1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--mib", type=float, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--window", type=int, default=HOST_WINDOW)
    p.add_argument("--values-per-packet", type=int, default=HOST_VALUES_PER_PACKET)
    args = p.parse_args()
    n, numel = args.workers, int(args.mib * 2**20) // 4
    nbytes = numel * 4

    before = lo_tx_bytes()
    run = run_local_job(n, [TensorSpec(numel, seed=1)] * args.reps, window=args.window,
                        values_per_packet=args.values_per_packet, check=False)
    lo_inagg = (lo_tx_bytes() - before) / args.reps
    per_call = [max(w.seconds[i] for w in run.workers) for i in range(args.reps)]
    t_inagg = statistics.median(per_call)
    sent = statistics.mean(w.stats["wire_bytes_sent"] for w in run.workers) / args.reps
    t_gloo, lo_gloo = gloo_allreduce(n, numel, args.reps)

    rows = [
        ("system", "workers", "MiB", "seconds", "goodput_MBps", "wire_sent_per_worker_over_tensor",
         "loopback_bytes_per_worker_over_tensor"),
        ("inagg-host", n, args.mib, t_inagg, nbytes / t_inagg / 1e6, sent / nbytes, lo_inagg / n / nbytes),
        ("gloo", n, args.mib, t_gloo, nbytes / t_gloo / 1e6, "", lo_gloo / n / nbytes),
    ]
    RESULTS.mkdir(exist_ok=True)
    with open(RESULTS / "allreduce.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    print(f"allreduce of {args.mib:g} MiB float32, {n} workers, loopback, "
          f"{os.cpu_count()} cores, median of {args.reps}")
    print(f"  inagg host aggregator: {t_inagg:7.3f} s  {nbytes / t_inagg / 1e6:8.1f} MB/s  "
          f"bytes sent per worker / tensor bytes {sent / nbytes:.4f}")
    print(f"  gloo ring allreduce:   {t_gloo:7.3f} s  {nbytes / t_gloo / 1e6:8.1f} MB/s  "
          f"bytes sent per worker / tensor bytes {lo_gloo / n / nbytes:.4f} (from lo counter)")
    print(f"  all loopback bytes / (workers * tensor bytes): inagg {lo_inagg / n / nbytes:.3f} "
          f"(worker->aggregator and back), gloo {lo_gloo / n / nbytes:.3f}")
    print(f"  time ratio inagg/gloo: {t_inagg / t_gloo:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
