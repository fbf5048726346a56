"""Training step time of a ~1 M-parameter CNN with 4 DDP processes: inagg against plain gloo.

Issue 11's "must show" item 4: the step time with the inagg DDP comm hook on the embedded
default (software data plane) over gloo DDP's should be <= 1.5, and on the host aggregator
path <= 1.05.

One job of ``--workers`` CPU processes (spawn, env://, one thread each) holds one DDP model per
configuration, all initialised alike and trained on the same synthetic 3x32x32 batches
(10 classes):

* ``gloo``: plain DDP on a gloo process group (the baseline);
* ``switch``: DDP with ``inagg_hook`` through a Communicator on a loopback deployment with the
  software data plane (what ``make demo`` runs);
* ``host``: the same on a loopback deployment without a switch (the host aggregator path);
* ``backend``: DDP on the ``inagg`` process group (``init_process_group("inagg")``, its local
  deployment started by rank 0), every eligible allreduce pinned to the inagg path
  (``INAGG_ALLREDUCE_PATH=inagg``).

Per repetition each configuration runs ``--warmup`` untimed steps then ``--steps`` timed ones,
the configurations' order alternating between repetitions. Each step starts after a gloo
barrier; its time is the slowest rank's. Per configuration: the median step time, and ``ratio``,
the median over repetitions of (its median step / gloo's median step in the same repetition),
which cancels most of the load that other processes put on the shared machine.

Writes benchmarks/results/train_step_bench.csv and .png (needs matplotlib) and prints the
ratios with the machine's load average.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from plots import pyplot  # benchmarks/, the script's own folder

RESULTS = Path(__file__).resolve().parent / "results"
CONFIGS = ("gloo", "switch", "host", "backend")
TARGETS = {"switch": 1.5, "host": 1.05}
FIELDS = ("config", "workers", "params", "batch", "reps", "steps_per_rep", "median_step_s", "ratio",
          "ratio_of_medians", "target", "load1")


@dataclass
class Job:
    """What every worker needs: the configurations, the loopback deployments' addresses and the
    schedule."""

    workers: int
    port: int
    configs: tuple[str, ...]
    deployments: dict[str, tuple[str, list[str]]]   # config -> (controller, worker ips)
    rdv_dir: str
    batch: int
    warmup: int
    steps: int
    reps: int
    seed: int = 0


def make_cnn():
    """A small VGG-like CNN for 3x32x32 inputs and 10 classes, about 1.03 M parameters (most of
    them in the first fully connected layer, as in small CIFAR models)."""
    from torch import nn

    def block(cin: int, cout: int) -> list:
        return [nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU()]

    return nn.Sequential(*block(3, 32), *block(32, 64), nn.MaxPool2d(2), *block(64, 128), nn.MaxPool2d(2),
                         *block(128, 128), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                         nn.Linear(128 * 16, 384), nn.ReLU(), nn.Linear(384, 10))


def count_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def build_ddp(config: str, job: Job, rank: int, gloo_group, comms: list):
    """One DDP model for ``config``, initialised from the job's seed (the same on every rank and
    for every configuration)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(job.seed)
    model = make_cnn()
    if config == "backend":
        return DDP(model, process_group=dist.group.WORLD)
    ddp = DDP(model, process_group=gloo_group)
    if config in ("switch", "host"):
        from inagg.hostlib.worker.communicator import Communicator
        from inagg.hostlib.pytorch.hooks import InaggHookState, inagg_hook

        controller, ips = job.deployments[config]
        comm = Communicator.from_rendezvous(
            f"file://{job.rdv_dir}/{config}?rank={rank}&world_size={job.workers}", controller,
            bind_ip=ips[rank], bytes_per_iteration=4 * count_params(model), iteration_seconds=0.2,
            name=f"train-step-bench-{config}")
        comms.append(comm)
        ddp.register_comm_hook(InaggHookState(comm), inagg_hook)
    return ddp


def timed_steps(ddp, opt, x, y, n: int, gloo_group) -> list[float]:
    """``n`` training steps, each after a barrier; this rank's time of each."""
    import torch
    import torch.distributed as dist

    times = []
    for _ in range(n):
        dist.barrier(group=gloo_group)
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return times


def worker(rank: int, job: Job, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(job.port), RANK=str(rank),
                      WORLD_SIZE=str(job.workers), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(job.workers))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if "backend" in job.configs:
        import inagg.hostlib.pytorch.plugin  # noqa: F401 - registers "inagg" where entry points are off

        os.environ["INAGG_ALLREDUCE_PATH"] = "inagg"
        dist.init_process_group("inagg")
        gloo_group = dist.new_group(backend="gloo")
    else:
        dist.init_process_group("gloo")
        gloo_group = dist.group.WORLD
    comms: list = []
    models = {c: build_ddp(c, job, rank, gloo_group, comms) for c in job.configs}
    opts = {c: torch.optim.SGD(m.parameters(), lr=0.01) for c, m in models.items()}
    gen = torch.Generator().manual_seed(job.seed * 1000 + rank)
    x = torch.randn(job.batch, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (job.batch,), generator=gen)
    times = {c: [] for c in job.configs}     # per repetition, this rank's step times
    for rep in range(job.reps):
        order = job.configs if rep % 2 == 0 else job.configs[::-1]
        for c in order:
            timed_steps(models[c], opts[c], x, y, job.warmup, gloo_group)
            times[c].append(timed_steps(models[c], opts[c], x, y, job.steps, gloo_group))
    gathered = [None] * job.workers
    dist.all_gather_object(gathered, times, group=gloo_group)
    if rank == 0:
        out.put((count_params(models[job.configs[0]]), gathered))
    dist.barrier(group=gloo_group)
    for comm in comms:
        comm.close()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(job: Job, timeout: float) -> tuple[int, list[dict]]:
    """Run the workers; the parameter count and, per rank, {config: [[step seconds] per rep]}."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, job, out), daemon=True) for r in range(job.workers)]
    for p in procs:
        p.start()
    deadline = time.time() + timeout
    while True:
        try:
            result = out.get(timeout=1.0)
            break
        except Exception:  # queue.Empty: check the workers are alive
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if failed or time.time() > deadline:
                for p in procs:
                    p.kill()
                raise RuntimeError(f"benchmark workers failed: exit codes {[p.exitcode for p in procs]}"
                                   f"{'' if failed else f' (timeout {timeout} s)'}") from None
    for p in procs:
        p.join(60)
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"benchmark workers: exit codes {[p.exitcode for p in procs]}")
    return result


def summarise(job: Job, params: int, per_rank: list[dict]) -> list[dict]:
    """Per configuration: median of the slowest rank's step times, and the median over
    repetitions of its median / gloo's median in the same repetition."""
    load = os.getloadavg()[0]
    rep_medians = {}
    for c in job.configs:
        reps = [[max(step) for step in zip(*(r[c][rep] for r in per_rank))] for rep in range(job.reps)]
        rep_medians[c] = ([statistics.median(r) for r in reps], statistics.median(s for r in reps for s in r))
    base_reps, base_median = rep_medians["gloo"]
    rows = []
    for c in job.configs:
        reps, median = rep_medians[c]
        rows.append(dict(config=c, workers=job.workers, params=params, batch=job.batch, reps=job.reps,
                         steps_per_rep=job.steps, median_step_s=median,
                         ratio=statistics.median(a / b for a, b in zip(reps, base_reps)),
                         ratio_of_medians=median / base_median, target=TARGETS.get(c, ""),
                         load1=round(load, 2)))
    return rows


def plot(rows: list[dict], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False

    fig, ax = plt.subplots(figsize=(6, 4))
    names = [r["config"] for r in rows]
    ax.bar(names, [r["ratio"] for r in rows], color=["gray"] + ["tab:blue"] * (len(rows) - 1))
    for i, r in enumerate(rows):
        if r["target"] != "":
            ax.hlines(r["target"], i - 0.4, i + 0.4, colors="red", linestyles="--")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.set_ylabel("step time / gloo DDP (median of paired reps)")
    ax.set_title(f"{rows[0]['params'] / 1e6:.2f} M-param CNN, {rows[0]['workers']} DDP processes "
                 f"(red: targets)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def parse_configs(text: str) -> tuple[str, ...]:
    configs = tuple(c.strip() for c in text.split(",") if c.strip())
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown configuration(s) {unknown}; choose from {list(CONFIGS)}")
    return ("gloo",) + tuple(c for c in configs if c != "gloo")   # the baseline always runs


def target_text(row: dict) -> str:
    return f"<= {row['target']}" if row["target"] != "" else ""


def main(argv: list[str] | None = None) -> int:
    from inagg.bmv2_env.emulation.loopback import LoopbackDeployment

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--batch", type=int, default=16, help="samples per worker per step")
    p.add_argument("--steps", type=int, default=8, help="timed steps per configuration and repetition")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    p.add_argument("--reps", type=int, default=5, help="repetitions (configurations interleaved)")
    p.add_argument("--configs", type=parse_configs, default=CONFIGS,
                   help=f"comma-separated, of {','.join(CONFIGS)} (gloo always runs)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds before the workers are killed")
    args = p.parse_args(argv)
    for name, value in (("--workers", args.workers), ("--batch", args.batch), ("--steps", args.steps),
                        ("--reps", args.reps)):
        if value < 1:
            p.error(f"{name} must be at least 1, got {value}")
    if args.warmup < 0:
        p.error(f"--warmup must be at least 0, got {args.warmup}")
    for k in [k for k in os.environ if k.startswith("INAGG_")]:
        del os.environ[k]   # the backend's zero-setup default (its own local deployment)
    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as rdv, contextlib.ExitStack() as stack:
        deployments = {}
        for config in ("switch", "host"):   # the hook configurations' own loopback deployments
            if config in args.configs:
                dep = stack.enter_context(LoopbackDeployment(args.workers, with_switch=config == "switch"))
                deployments[config] = (dep.controller, dep.worker_ips)
        job = Job(args.workers, free_port(), args.configs, deployments, rdv, args.batch, args.warmup,
                  args.steps, args.reps)
        print(f"training step bench: {args.workers} DDP processes, batch {args.batch}/worker, "
              f"configs {','.join(job.configs)}, {args.reps} reps x ({args.warmup} warm-up + {args.steps} "
              f"timed steps); load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
        params, per_rank = run_job(job, args.timeout)
    rows = summarise(job, params, per_rank)
    print(f"CNN parameters: {params:,}")
    print(f"{'config':>8} {'median step':>12} {'ratio':>7} {'of medians':>10} {'target':>7}")
    for r in rows:
        print(f"{r['config']:>8} {r['median_step_s'] * 1e3:>9.1f} ms {r['ratio']:>7.2f} "
              f"{r['ratio_of_medians']:>10.2f} {target_text(r):>7}")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    with open(RESULTS / "train_step_bench.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    plot(rows, RESULTS / "train_step_bench.png")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.exit(main())
