"""The ``inagg`` backend against plain gloo: allreduce time from 4 B to 64 MiB at 2, 4 and 8
workers. The backend chooses each call's path (inagg on the job's grant, its host lane beside a
switch grant, or gloo) by its measured model, so its time should never exceed gloo's by more
than its own overhead: the target is inagg-backend / gloo <= 1.1 at every point.

A job is one torch.distributed job of real processes (env://, no controller named: rank 0
brings up the local deployment, as ``torchrun`` users get it) with three measured process
groups: the default one on ``inagg``, a ``gloo`` group (the baseline) and a second, identical
gloo group (``gloo2``, the control: what the harness reads for two systems that are the same).
For each size every group first makes ``_WARMUP_CALLS`` untimed calls (the backend probes every
path at a new size, a one-time cost a training job pays once per bucket size), then allreduces a
fresh copy of one float32 tensor for about ``--seconds`` / ``--jobs`` per system (the repetitions
follow from gloo's warm-up calls). A repetition makes two calls of each system, in a rotation of the three
and then its reverse (ABCCBA, BCAACB, CABBAC, ...), so over three repetitions every system is
first, last and in the middle equally often; each call after a barrier on a fourth gloo group;
a call's time is the slowest rank's. The barrier's group is none of the measured ones: a group
whose threads just ran the barrier answers its next call sooner than one whose threads were
asleep (two plain gloo groups measured this way, the barrier on one of them, came out 1.4x apart
at 8 workers / 4 B on the loaded 2-core machine; with a group of its own, 0.97).

Each worker count runs as ``--jobs`` separate jobs (fresh processes, groups and local
deployment), each with its share of the time: two identical gloo groups of one job differ by a
few percent for the whole job (2-core machine, 4 workers / 4 MiB: 0.92-1.08 between groups,
the same in both halves of a job, different in the next job; 4 workers / 4 B: 0.85-1.15 over
six jobs), so one job measures its groups' draw as much as the systems; pooled over jobs the
draws average out. Five by default: with three, the small sizes' points, whose jobs read
0.96-1.17x with nearly every call on gloo, came out over 1.1 in one run in three on the draw.

Per size: each system's median time; ``ratio``, the median over all jobs' repetitions of the
ratio of the inagg backend's summed time to gloo's within a repetition (its calls run back to
back, so the ratio cancels the load other processes put on the shared machine, which moves both
alike), with a 95 % bootstrap interval that resamples jobs, then repetitions within each (so it
counts the groups' draw); ``job_ratios``, each job's own ratio; ``gloo_vs_gloo``, the same
ratio of the control group to the baseline, which shows how far from 1 the harness reads where
nothing differs. ``ratio_of_medians`` and ``ratio_of_means`` (the total time's ratio) are in the
CSV too: where a system's call times are bimodal, as gloo's were at 2 workers / 256 KiB (0.5 or
3 ms), the three differ.

Writes benchmarks/results/backend_sweep.csv and backend_sweep.png (ratio per size and worker
count; needs matplotlib), and prints the worst ratio, where it occurred and the machine's load.
"""

from __future__ import annotations

import argparse
import csv
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from plots import pyplot  # benchmarks/, the script's own folder

RESULTS = Path(__file__).resolve().parent / "results"
FULL_SIZES = tuple(4 * 16 ** i for i in range(7))            # 4 B, 64 B, ..., 64 MiB
QUICK_SIZES = (4, 1024, 256 * 1024, 4 << 20)
PATHS = ("inagg", "host", "gloo")   # the backend's paths (inagg.hostlib.pytorch.path.choice)
SYSTEMS = ("inagg", "gloo", "gloo2")   # the backend, the baseline, the control (module docstring)
FIELDS = ("workers", "bytes", "jobs", "reps", "inagg_backend_s", "gloo_s", "ratio", "ratio_ci_low", "ratio_ci_high",
          "job_ratios", "gloo_vs_gloo", "ratio_of_medians", "ratio_of_means", "inagg_calls", "host_calls", "gloo_calls", "load1")
_BOOTSTRAP = 2000   # resamples (of jobs, then repetitions) for the ratio's 95 % interval
TARGET = 1.1
_SETTLE_CALLS = 50   # untimed calls on each group before the first size
# untimed calls of each size on each group before its timed ones: the backend's first calls of
# a size probe every path (3 calls each, hostlib/pytorch/path/choice.py) before the ranks agree; a
# training job repeats its sizes every step, so the sweep times the steady state after that
# one-time cost, explorations (2 % budget) and agreements included
_WARMUP_CALLS = 12


def reps_for(call_seconds: float, budget: float, fewest: int, most: int) -> int:
    """Repetitions for a size whose calls take ``call_seconds``: enough to spend about
    ``budget`` seconds on each system (each repetition makes two calls of each), within
    [``fewest``, ``most``]. A fixed count was too few where calls are short next to the
    machine's noise: nine repetitions of 2 workers / 4 MiB calls (4-27 ms each at load 0.4)
    read 0.6x and 1.3x in two runs."""
    return max(fewest, min(most, round(budget / (2 * call_seconds))))


def timed(tensor, group) -> float:
    import torch.distributed as dist

    t0 = time.perf_counter()
    dist.all_reduce(tensor, group=group)
    return time.perf_counter() - t0


def worker(rank: int, n: int, port: int, sizes: tuple[int, ...], reps: tuple[float, int, int], out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(n),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(n))
    import torch
    import torch.distributed as dist

    import inagg.hostlib.pytorch.plugin  # noqa: F401 - registers "inagg" where entry points are off

    torch.set_num_threads(1)
    dist.init_process_group("inagg")
    groups = {"inagg": dist.group.WORLD, "gloo": dist.new_group(backend="gloo"),
              "gloo2": dist.new_group(backend="gloo")}
    barrier = dist.new_group(backend="gloo")   # none of the measured groups (module docstring)
    for _ in range(_SETTLE_CALLS):   # every group past the job's start-up transient
        for g in groups.values():
            timed(torch.ones(1), g)   # a fresh one: summed in place 100 times it overflowed at 4 workers
    inagg = groups["inagg"]
    rows = []
    for nbytes in sizes:
        x = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
        gloo_warm = []
        for _ in range(_WARMUP_CALLS):  # warm-up: buffers, connections, the backend's probes
            for name, g in groups.items():
                t = timed(x.clone(), g)
                if name == "gloo":
                    gloo_warm.append(t)
        call = torch.tensor([statistics.median(gloo_warm)], dtype=torch.float64)
        dist.all_reduce(call, op=dist.ReduceOp.MAX, group=barrier)   # every rank the same count
        before = dict(inagg.stats()["allreduce_paths"])
        times = {name: [] for name in groups}
        for rep in range(reps_for(call.item(), *reps)):
            for name in call_order(rep):
                dist.barrier(group=barrier)
                times[name].append(timed(x.clone(), groups[name]))
        after = inagg.stats()["allreduce_paths"]
        calls = {p: after.get(p, 0) - before.get(p, 0) for p in PATHS}
        rows.append((nbytes, times, calls))
    gathered = [None] * n
    dist.all_gather_object(gathered, rows, group=groups["gloo"])
    if rank == 0:
        out.put(gathered)
    dist.destroy_process_group()


def call_order(rep: int) -> tuple[str, ...]:
    """Repetition ``rep``'s calls: a rotation of ``SYSTEMS``, then its reverse (module
    docstring); two calls of each system."""
    k = rep % len(SYSTEMS)
    rotation = SYSTEMS[k:] + SYSTEMS[:k]
    return rotation + rotation[::-1]


def paired_ratios(slowest: dict[str, list[float]], a: str, b: str) -> np.ndarray:
    """Per repetition, ``a``'s summed call time over ``b``'s (each system's calls in
    ``slowest`` in order, two per repetition)."""
    per_rep = {name: np.add.reduceat(np.asarray(slowest[name]), np.arange(0, len(slowest[name]), 2))
               for name in (a, b)}
    return per_rep[a] / per_rep[b]


def pooled_median_interval(per_job: list[np.ndarray], rng: np.random.Generator) -> tuple[float, float]:
    """A 95 % bootstrap interval of the median of all jobs' ``per_job`` values pooled:
    each resample draws jobs with replacement, then each drawn job's values with replacement."""
    medians = np.empty(_BOOTSTRAP)
    for b in range(_BOOTSTRAP):
        drawn = rng.integers(len(per_job), size=len(per_job))
        medians[b] = np.median(np.concatenate([rng.choice(per_job[j], size=len(per_job[j])) for j in drawn]))
    low, high = np.percentile(medians, [2.5, 97.5])
    return float(low), float(high)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(n: int, sizes: tuple[int, ...], reps: tuple[float, int, int]) -> list[tuple[int, dict, dict]]:
    """One job of ``n`` workers over ``sizes``: per size, its bytes, each system's call times
    (the slowest rank's) and the backend's calls by path."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, n, port, sizes, reps, out)) for r in range(n)]
    for p in procs:
        p.start()
    gathered = out.get(timeout=900)
    for p in procs:
        p.join(60)
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"{n} workers: exit codes {[p.exitcode for p in procs]}")
    results = []
    for i, (nbytes, _, calls) in enumerate(gathered[0]):
        per_rank = [g[i][1] for g in gathered]
        slowest = {name: [max(call) for call in zip(*(r[name] for r in per_rank))] for name in SYSTEMS}
        results.append((nbytes, slowest, calls))
    return results


def summarize(n: int, jobs: list[list[tuple[int, dict, dict]]], rng: np.random.Generator) -> list[dict]:
    """One CSV row per size from ``jobs`` (``run_job``'s results, same sizes): times and
    ratios pooled over the jobs (module docstring)."""
    rows = []
    load = os.getloadavg()[0]
    for per_size in zip(*jobs):
        nbytes = per_size[0][0]
        slowest = {name: [t for _, times, _ in per_size for t in times[name]] for name in SYSTEMS}
        ratios = [paired_ratios(times, "inagg", "gloo") for _, times, _ in per_size]
        pooled = np.concatenate(ratios)
        low, high = pooled_median_interval(ratios, rng)
        control = np.concatenate([paired_ratios(times, "gloo2", "gloo") for _, times, _ in per_size])
        med = {name: statistics.median(v) for name, v in slowest.items()}
        calls = {p: sum(c[p] for _, _, c in per_size) for p in PATHS}
        rows.append(dict(workers=n, bytes=nbytes, jobs=len(per_size), reps=len(pooled), inagg_backend_s=med["inagg"],
                         gloo_s=med["gloo"], ratio=float(np.median(pooled)), ratio_ci_low=low, ratio_ci_high=high,
                         job_ratios=" ".join(f"{np.median(r):.3f}" for r in ratios),
                         gloo_vs_gloo=float(np.median(control)), ratio_of_medians=med["inagg"] / med["gloo"],
                         ratio_of_means=sum(slowest["inagg"]) / sum(slowest["gloo"]),
                         **{f"{p}_calls": calls[p] for p in PATHS}, load1=round(load, 2)))
    return rows


def human(nbytes: int) -> str:
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes // size} {unit}"
    return f"{nbytes} B"


def plot(rows: list[dict], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False

    fig, ax = plt.subplots(figsize=(7, 4))
    for n in sorted({r["workers"] for r in rows}):
        mine = [r for r in rows if r["workers"] == n]
        x = [r["bytes"] for r in mine]
        errors = [[r["ratio"] - r["ratio_ci_low"] for r in mine], [r["ratio_ci_high"] - r["ratio"] for r in mine]]
        line = ax.errorbar(x, [r["ratio"] for r in mine], yerr=errors, marker="o", capsize=3, label=f"{n} workers")
        ax.plot(x, [r["gloo_vs_gloo"] for r in mine], linestyle=":", color=line[0].get_color(),
                label=f"{n} workers, gloo / gloo (control)")
    ax.axhline(TARGET, color="red", linestyle="--", label=f"target {TARGET}")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("allreduce size (bytes, float32)")
    ax.set_ylabel("inagg backend / gloo (paired, 95 % CI)")
    ax.set_title("inagg backend vs gloo, interleaved, slowest rank per call")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--seconds", type=float, default=3.0,
                   help="time to spend on each system per size, over all jobs (the repetitions follow from gloo's "
                        "warm-up calls)")
    p.add_argument("--jobs", type=int, default=5, help="separate jobs per worker count (module docstring)")
    p.add_argument("--min-reps", type=int, default=5, help="fewest repetitions per size and job (two calls of each system)")
    p.add_argument("--max-reps", type=int, default=200, help="most repetitions per size and job")
    p.add_argument("--quick", action="store_true",
                   help=f"sizes {', '.join(map(human, QUICK_SIZES))} only, a sixth of the time")
    p.add_argument("--sizes", type=int, nargs="+", help="these sizes (bytes) instead, each with --seconds")
    p.add_argument("--name", default="backend_sweep", help="the results' file names in benchmarks/results/")
    args = p.parse_args(argv)
    sizes, seconds = (QUICK_SIZES, args.seconds / 6) if args.quick else (FULL_SIZES, args.seconds)
    if args.sizes:
        sizes = tuple(args.sizes)
    if not (seconds > 0 and args.jobs >= 1 and 1 <= args.min_reps <= args.max_reps and min(sizes) >= 4):
        p.error("--seconds must be > 0, --jobs >= 1, 1 <= --min-reps <= --max-reps and --sizes >= 4 bytes")
    reps = (seconds / args.jobs, args.min_reps, args.max_reps)
    for k in [k for k in os.environ if k.startswith("INAGG_")]:
        del os.environ[k]   # the backend's zero-setup default, automatic path choice
    RESULTS.mkdir(parents=True, exist_ok=True)
    rows = []
    rng = np.random.default_rng(0)   # the same resamples for the same times
    print(f"{'workers':>7} {'size':>8} {'inagg backend':>14} {'gloo':>10} {'ratio':>6} {'95 % CI':>11} "
          f"{'per job':>17} {'gloo/gloo':>9} {'of medians':>10} {'of means':>8}  calls inagg/host/gloo  load")
    for n in args.workers:
        for r in summarize(n, [run_job(n, sizes, reps) for _ in range(args.jobs)], rng):
            rows.append(r)
            print(f"{n:>7} {human(r['bytes']):>8} {r['inagg_backend_s'] * 1e3:>11.3f} ms {r['gloo_s'] * 1e3:>7.3f} ms "
                  f"{r['ratio']:>6.2f} {r['ratio_ci_low']:>5.2f}-{r['ratio_ci_high']:<5.2f} "
                  f"{r['job_ratios']:>17} {r['gloo_vs_gloo']:>9.2f} "
                  f"{r['ratio_of_medians']:>10.2f} {r['ratio_of_means']:>8.2f}  "
                  f"{'/'.join(str(r[f'{p}_calls']) for p in PATHS):<21} {r['load1']}", flush=True)
    with open(RESULTS / f"{args.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    worst = max(rows, key=lambda r: r["ratio"])
    control = [r["gloo_vs_gloo"] for r in rows]
    print(f"worst ratio {worst['ratio']:.3f} (95 % CI {worst['ratio_ci_low']:.3f}-{worst['ratio_ci_high']:.3f}) at "
          f"{worst['workers']} workers, {human(worst['bytes'])} (target <= {TARGET}); "
          f"{sum(r['ratio'] <= TARGET for r in rows)} of {len(rows)} points <= {TARGET}; gloo / gloo control "
          f"{min(control):.3f}-{max(control):.3f}; load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    plot(rows, RESULTS / f"{args.name}.png")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
