"""inagg allreduce vs torch.distributed gloo, interleaved in the same worker processes.

The deployment is the embedded default that ``make demo`` uses (bmv2_env/emulation/loopback.py: the
software data plane, the controller and the host aggregator as processes on loopback), with the
switch (``soft``: jobs aggregate in the software data plane) or without it (``host``: the host
aggregator). Each of the N worker processes opens a gloo process group and an inagg
Communicator on the same store, then for every repetition times one inagg call and one gloo call
of the same tensor, each after a barrier on a gloo group of its own (neither measured one), so both systems see the same machine load, after
``--warmup`` untimed calls of each (inagg's window grows out of slow start over its first
calls, as in any training run). A figure is the median over repetitions of the slowest rank's
time; the ratio is inagg / gloo.

Cases (the targets of issue 11): ``soft`` 4 workers x 16 MiB (ratio <= 3), ``soft`` 4 workers x
1 element (median latency ratio <= 1.0), ``host`` 4 workers x 64 MiB (ratio <= 1.5); and the
retransmissions on the loss-free soft path as a share of the packets sent (<= 0.1 %).

The machine's load average is printed and written with every figure: on a shared machine read
the ratios, not the absolute times. Writes benchmarks/results/allreduce.csv and allreduce.png
(needs matplotlib; without it only the CSV).
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
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inagg.bmv2_env.emulation.loopback import LoopbackDeployment  # noqa: E402
from inagg.bmv2_env.demos.allreduce_demo import TensorSpec  # noqa: E402
from plots import pyplot  # noqa: E402  (benchmarks/, the script's own folder)

RESULTS = Path(__file__).resolve().parent / "results"
FIELDS = ("case", "path", "workers", "elements", "reps", "system", "median_s", "ratio_vs_gloo",
          "retransmit_pct", "load_1min")
SYSTEMS = ("inagg", "gloo")


@dataclass(frozen=True)
class Case:
    name: str
    elements: int
    reps: int


def _rank(rank: int, n: int, store_path: str, controller: str, bind_ip: str, cases: list[Case],
          warmup: int, q) -> None:
    """One worker process: both systems, every case, interleaved call by call."""
    import torch
    import torch.distributed as dist

    from inagg.hostlib.worker.communicator import Communicator

    torch.set_num_threads(1)
    store = dist.FileStore(store_path, n)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n)
    comm = Communicator(store, rank, n, controller, bind_ip=bind_ip)
    # the barrier before each timed call runs on a group of its own: on the measured gloo group it
    # leaves that group's threads awake for its next call (two identical gloo groups measured so
    # came out 1.4x apart at 8 workers / 4 B; benchmarks/backend_sweep.py)
    barrier = dist.new_group(backend="gloo")
    calls = {"inagg": comm.allreduce, "gloo": dist.all_reduce}
    times: dict[tuple[str, str], list[float]] = {}
    for case in cases:
        x = torch.from_numpy(TensorSpec(case.elements, seed=1).make(rank))
        for _ in range(warmup):  # connections, buffers, and inagg's window out of slow start
            for system in SYSTEMS:
                calls[system](x.clone())
        for _ in range(case.reps):
            for system in SYSTEMS:
                y = x.clone()
                dist.barrier(group=barrier)
                t0 = time.perf_counter()
                calls[system](y)
                times.setdefault((case.name, system), []).append(time.perf_counter() - t0)
    q.put((rank, times, comm.stats()))
    dist.barrier()
    comm.close()
    dist.destroy_process_group()


def run_path(path: str, n: int, cases: list[Case], warmup: int) -> tuple[dict, list[dict]]:
    """Run ``cases`` on one deployment; (slowest-rank times per (case, system), ranks' stats)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with LoopbackDeployment(n, with_switch=path == "soft") as dep, tempfile.TemporaryDirectory() as d:
        procs = [ctx.Process(target=_rank, args=(r, n, f"{d}/store", dep.controller, dep.worker_ip(r), cases, warmup, q))
                 for r in range(n)]
        for p in procs:
            p.start()
        reports = sorted(q.get(timeout=1800) for _ in procs)
        for p in procs:
            p.join(60)
    slowest = {key: [max(calls) for calls in zip(*(times[key] for _, times, _ in reports))]
               for key in reports[0][1]}
    return slowest, [stats for _, _, stats in reports]


def plot(rows: list[dict], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False

    cases = list(dict.fromkeys(r["case"] for r in rows))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for i, system in enumerate(SYSTEMS):
        t = [next(r["median_s"] for r in rows if r["case"] == c and r["system"] == system) for c in cases]
        ax.bar([j + 0.4 * i for j in range(len(cases))], t, 0.4, label=system)
    for j, c in enumerate(cases):
        ratio = next(r["ratio_vs_gloo"] for r in rows if r["case"] == c and r["system"] == "inagg")
        ax.annotate(f"{ratio:.2f}x", (j + 0.2, 0), xytext=(0, 3), textcoords="offset points", ha="center")
    ax.set(yscale="log", ylabel="median of the slowest rank (s)", xticks=[j + 0.2 for j in range(len(cases))],
           title=f"inagg vs gloo, interleaved; load {rows[0]['load_1min']:.1f} on {os.cpu_count()} cores")
    ax.set_xticklabels(cases, fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--soft-mib", type=float, default=16.0)
    p.add_argument("--host-mib", type=float, default=64.0)
    p.add_argument("--reps", type=int, default=3, help="repetitions of the large calls")
    p.add_argument("--latency-reps", type=int, default=200, help="repetitions of the 1-element call")
    p.add_argument("--warmup", type=int, default=6,
                   help="untimed calls of each case first (inagg's window leaves slow start)")
    p.add_argument("--paths", nargs="+", default=["soft", "host"], choices=["soft", "host"])
    args = p.parse_args()

    plans = {
        "soft": [Case(f"soft {args.workers}x{args.soft_mib:g}MiB", int(args.soft_mib * 2**20) // 4, args.reps),
                 Case(f"soft {args.workers}x1 element", 1, args.latency_reps)],
        "host": [Case(f"host {args.workers}x{args.host_mib:g}MiB", int(args.host_mib * 2**20) // 4, args.reps)],
    }
    start = time.perf_counter()
    print(f"inagg vs gloo, interleaved in the same {args.workers} processes on loopback, {os.cpu_count()} cores; "
          "median of the slowest rank")
    print(f"{'case':>22} {'inagg s':>10} {'gloo s':>10} {'ratio':>7} {'retransmit %':>12} {'load':>5}")
    rows = []
    for path in args.paths:
        slowest, stats = run_path(path, args.workers, plans[path], args.warmup)
        load = os.getloadavg()[0]
        sent = sum(s["packets_sent"] for s in stats)
        retransmit_pct = 100.0 * sum(s["retransmissions"] for s in stats) / max(sent, 1)
        for case in plans[path]:
            med = {system: statistics.median(slowest[(case.name, system)]) for system in SYSTEMS}
            ratio = med["inagg"] / med["gloo"]
            for system in SYSTEMS:
                rows.append(dict(zip(FIELDS, (case.name, path, args.workers, case.elements, case.reps, system,
                                              med[system], ratio if system == "inagg" else 1.0,
                                              retransmit_pct if system == "inagg" else 0.0, load))))
            print(f"{case.name:>22} {med['inagg']:>10.5f} {med['gloo']:>10.5f} {ratio:>7.2f} "
                  f"{retransmit_pct:>12.3f} {load:>5.1f}", flush=True)
        print(f"{'':>22} ({path}: {sent} packets sent by the workers, modes "
              f"{sorted({s['mode'] for s in stats})}, windows {[s['window'] for s in stats]})")
        print("                       (stats: " + ", ".join(f"{k}={sum(s.get(k, 0) for s in stats)}" for k in ("retransmissions", "fast_retransmissions", "backoffs", "spurious_retransmissions")) + ")")

    RESULTS.mkdir(exist_ok=True)
    with open(RESULTS / "allreduce.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {RESULTS / 'allreduce.csv'}")
    if plot(rows, RESULTS / "allreduce.png"):
        print(f"wrote {RESULTS / 'allreduce.png'}")
    print(f"took {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
