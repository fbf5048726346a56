"""Host-aggregator allreduce vs torch.distributed gloo: a sweep over worker counts and sizes.

For every (workers, MiB) configuration both systems allreduce the same float32 tensors on the
same machine in the same run; each time is the median over reps of the slowest rank's time for
one call. gloo ranks pass a barrier before each call; inagg ranks have none, so inagg's slowest
rank also waits for ranks that start late (a bias against inagg on a loaded machine).

Bytes per worker / tensor bytes: inagg's figure is what each worker sent, from its own counters
(headers included). gloo's comes from the loopback interface counter
/sys/class/net/lo/statistics/tx_bytes: it counts every byte any process sends over loopback
(TCP/IP headers, ACKs, barriers, the warm-up call, and any unrelated loopback traffic on the
machine), divided by the workers and calls. The CSV also has that loopback figure for inagg, where
it includes the aggregator's results back to the workers (about 2: 1 sent + 1 received per worker).

Writes benchmarks/results/allreduce.csv (one row per system and configuration) and
benchmarks/results/allreduce.png (needs matplotlib; without it only the CSV is written).
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hostlib.demo import TensorSpec, run_local_job  # noqa: E402
from hostlib.grant import HOST_VALUES_PER_PACKET, HOST_WINDOW  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FIELDS = ("system", "workers", "MiB", "reps", "seconds", "goodput_MBps",
          "sent_per_worker_over_tensor", "loopback_per_worker_over_tensor")


def lo_tx_bytes() -> int:
    return int(Path("/sys/class/net/lo/statistics/tx_bytes").read_text())


def slowest_median(times: list[list[float]]) -> float:
    """Median over calls of the slowest rank's time; ``times[rank][call]``."""
    return statistics.median(max(call) for call in zip(*times))


def inagg_allreduce(n: int, numel: int, reps: int, window: int, vpp: int) -> tuple[float, float, float]:
    """Seconds per call, bytes sent per worker per call, loopback bytes per call."""
    before = lo_tx_bytes()
    run = run_local_job(n, [TensorSpec(numel, seed=1)] * reps, window=window,
                        values_per_packet=vpp, check=False)
    loopback = (lo_tx_bytes() - before) / reps
    sent = statistics.mean(w.stats["wire_bytes_sent"] for w in run.workers) / reps
    return slowest_median([w.seconds for w in run.workers]), sent, loopback


def _gloo_worker(rank: int, n: int, numel: int, reps: int, init: str, q) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=n)
    x = torch.from_numpy(TensorSpec(numel, seed=1).make(rank))
    dist.all_reduce(x.clone())  # warm-up: connections, buffers
    times = []
    for _ in range(reps):
        y = x.clone()
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(y)
        times.append(time.perf_counter() - t0)
    q.put(times)
    dist.destroy_process_group()


def gloo_allreduce(n: int, numel: int, reps: int) -> tuple[float, float]:
    """Seconds per call and loopback bytes per call (the warm-up call counted as one)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        init = f"file://{d}/rendezvous"
        procs = [ctx.Process(target=_gloo_worker, args=(r, n, numel, reps, init, q)) for r in range(n)]
        before = lo_tx_bytes()
        for p in procs:
            p.start()
        times = [q.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
        loopback = lo_tx_bytes() - before
    return slowest_median(times), loopback / (reps + 1)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(12, 4.8))
    workers = sorted({r["workers"] for r in rows})
    sizes = sorted({r["MiB"] for r in rows})
    largest = max(sizes)
    for system, style, source in (("inagg-host", "o-", "own counters"), ("gloo", "s--", "lo counter")):
        mine = [r for r in rows if r["system"] == system]
        for i, n in enumerate(workers):
            pts = sorted((r["MiB"], r["seconds"]) for r in mine if r["workers"] == n)
            ax_t.plot(*zip(*pts), style, color=f"C{i}", label=f"{system}, {n} workers")
        pts = sorted((r["workers"], r["sent_per_worker_over_tensor"]) for r in mine if r["MiB"] == largest)
        ax_b.plot(*zip(*pts), style, label=f"{system} ({source})")
    ax_t.set(xscale="log", yscale="log", xlabel="tensor size per worker (MiB)",
             ylabel="allreduce time (s, median)", title="allreduce time")
    ax_t.set_xticks(sizes, [f"{m:g}" for m in sizes])
    ax_b.set(xlabel="workers", ylabel="bytes sent per worker / tensor bytes", xticks=workers,
             ylim=(0, None), title=f"bytes on the wire, {largest:g} MiB tensor")
    for ax in (ax_t, ax_b):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"inagg host aggregator vs gloo on loopback, {os.cpu_count()} cores")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--mib", type=float, nargs="+", default=[1, 16, 64], help="tensor sizes in MiB")
    p.add_argument("--reps", type=int, default=3, help="calls per configuration (median taken)")
    p.add_argument("--quick", action="store_true", help="smoke run: workers 2 4, MiB 1 4, reps 2")
    p.add_argument("--window", type=int, default=HOST_WINDOW)
    p.add_argument("--values-per-packet", type=int, default=HOST_VALUES_PER_PACKET)
    args = p.parse_args()
    if args.quick:
        args.workers, args.mib, args.reps = [2, 4], [1, 4], 2

    start = time.perf_counter()
    print(f"allreduce of float32 tensors on loopback, {os.cpu_count()} cores, median of {args.reps} "
          "calls; goodput = tensor bytes / time; sent = bytes sent per worker / tensor bytes")
    print(f"{'workers':>7} {'MiB':>5} {'inagg s':>8} {'gloo s':>8} {'inagg/gloo':>10} "
          f"{'inagg MB/s':>10} {'gloo MB/s':>10} {'inagg sent':>10} {'gloo sent':>10}")
    rows = []
    for n in args.workers:
        for mib in args.mib:
            numel = int(mib * 2**20) // 4
            nbytes = numel * 4
            t_inagg, sent, lo_inagg = inagg_allreduce(n, numel, args.reps, args.window,
                                                      args.values_per_packet)
            t_gloo, lo_gloo = gloo_allreduce(n, numel, args.reps)
            for system, t, s, lo in (("inagg-host", t_inagg, sent, lo_inagg),
                                     ("gloo", t_gloo, lo_gloo / n, lo_gloo)):
                rows.append(dict(zip(FIELDS, (system, n, mib, args.reps, t, nbytes / t / 1e6,
                                              s / nbytes, lo / n / nbytes))))
            print(f"{n:>7} {mib:>5g} {t_inagg:>8.3f} {t_gloo:>8.3f} {t_inagg / t_gloo:>10.2f} "
                  f"{nbytes / t_inagg / 1e6:>10.1f} {nbytes / t_gloo / 1e6:>10.1f} "
                  f"{sent / nbytes:>10.4f} {lo_gloo / n / nbytes:>10.4f}", flush=True)

    RESULTS.mkdir(exist_ok=True)
    with open(RESULTS / "allreduce.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {RESULTS / 'allreduce.csv'}")
    try:
        plot(rows, RESULTS / "allreduce.png")
        print(f"wrote {RESULTS / 'allreduce.png'}")
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
    print(f"sweep took {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
