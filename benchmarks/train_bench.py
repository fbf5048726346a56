"""Training where the links are the bottleneck: DDP's step time, time to a target accuracy and the
final accuracy with inagg (switch), inagg + AR-Topk, PowerSGD (over gloo) and plain gloo, side by
side in the same rank processes, on the Mininet emulation with every host link shaped (tc tbf).

Per worker count (``--workers``, default 4 and 8) one job of N rank processes on hosts h1..hN
(the topology and the ranks' launch are wire_bench's): the default group is the ``inagg``
backend with its path forced to the switch, a gloo group runs the ring over the same links, and
a third gloo group holds the barrier before every step. Each rank builds one DDP replica of
``--model`` (the emulation's zoo, ``inagg.bmv2_env.demos.workloads``) per configuration, all from
the same seed:

* ``gloo``: DDP on the gloo group (the baseline);
* ``inagg``: DDP on the inagg group (every bucket aggregated on the switch);
* ``inagg+artopk``: the same with ``artopk_hook`` (compression ratio ``--cr``);
* ``powersgd``: DDP on the gloo group with torch's ``powerSGD_hook`` (rank 2).

The replicas train in turns of ``--turn`` steps each, the configurations' order reversed every
other turn, on the same batches (each rank its own shard of the training set): load from other
processes lands on all of them alike. A step's time is the slowest rank's. After every turn each
replica's test accuracy is measured (untimed).

Per (N, configuration): the median step time and ``ratio``, the median over turns of (its median
step / gloo's median step in the same turn); the steps and the training seconds (the sum of its
step times) until the test accuracy first reached ``--target``; the final accuracy. Writes
benchmarks/results/train_bench.csv and .png (step time per configuration and N; accuracy against
training time at the largest N) and prints the table with the machine's load.

    sudo .venv/bin/python benchmarks/train_bench.py [--model cnn] [--workers 4 8] [--rate 100mbit]
        [--turns 6] [--turn 10] [--batch 32] [--target 0.9] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

from emulation_ranks import (READY_SECONDS, RESULTS, STORE_PORT, add_machine_arguments,  # noqa: E402
                             add_output_arguments, add_rank_arguments, finish_job, join_job, rate_bits,
                             run_benchmark, shaped_network, slowest_times, start_ranks, write_deployment)
from plots import pyplot  # noqa: E402 - benchmarks/, the script's own folder
from wire_bench import topology  # noqa: E402

CONFIGS = ("gloo", "inagg", "inagg+artopk", "powersgd")
FIELDS = ("model", "rate", "workers", "config", "parameters", "steps", "step_s", "ratio", "target",
          "steps_to_target", "seconds_to_target", "final_accuracy", "load1_start", "load1_end")


# -- rank side (one process in each worker's Mininet host) ------------------------------------

def replicas(args, pg, gloo) -> dict:
    """config -> (DDP model, optimizer), every model built from the same seed."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as power
    from torch.nn.parallel import DistributedDataParallel as DDP

    from inagg.bmv2_env.demos.workloads import build_model
    from inagg.hostlib.pytorch.hooks import ARTopkHookState, artopk_hook

    made = {}
    for config in args.configs:
        torch.manual_seed(0)
        model = DDP(build_model(args.model), process_group=gloo if config in ("gloo", "powersgd") else pg)
        if config == "inagg+artopk":
            model.register_comm_hook(ARTopkHookState(process_group=pg, cr=args.cr), artopk_hook)
        elif config == "powersgd":
            state = power.PowerSGDState(process_group=gloo, matrix_approximation_rank=2, start_powerSGD_iter=2)
            model.register_comm_hook(state, power.powerSGD_hook)
        made[config] = (model, torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9))
    return made


def shard(args, rank: int, world: int) -> tuple:
    """This rank's training batches (its shard of the training set) and the whole test set."""
    import torch

    from inagg.bmv2_env.demos.workloads import load_data

    x, y, x_test, y_test = (torch.from_numpy(a) for a in load_data(args.model))
    x, y = x[rank::world], y[rank::world]
    batches = [(x[i:i + args.batch], y[i:i + args.batch]) for i in range(0, len(y) - args.batch + 1, args.batch)]
    return batches, (x_test, y_test)


def train_turn(model, optimizer, batches: list, first: int, steps: int, barrier) -> list[float]:
    """``steps`` steps from batch ``first`` on; this rank's seconds of each."""
    import torch.distributed as dist

    from inagg.bmv2_env.demos.workloads import loss

    seconds = []
    for i in range(first, first + steps):
        x, y = batches[i % len(batches)]
        dist.barrier(group=barrier)
        t0 = time.perf_counter()
        optimizer.zero_grad()
        loss(model(x), y).backward()
        optimizer.step()
        seconds.append(time.perf_counter() - t0)
    return seconds


def test_accuracy(model, test: tuple) -> float:
    """The replica's accuracy on the test set (untimed, no gradients)."""
    import torch

    from inagg.bmv2_env.demos.workloads import accuracy

    with torch.no_grad():
        return accuracy(model.module(test[0]), test[1])


def rank_main(args: argparse.Namespace) -> int:
    """One rank: every configuration trained turn by turn; rank 0 writes per configuration the
    slowest rank's step times and the test accuracy after each turn to ``--out``."""
    import torch.distributed as dist

    pg, barrier = join_job(args)
    gloo = dist.new_group(backend="gloo")
    made, (batches, test) = replicas(args, pg, gloo), shard(args, args.rank, args.world)
    steps = {c: [] for c in args.configs}
    accuracy = {c: [] for c in args.configs}
    for turn in range(args.turns):
        for config in (args.configs if turn % 2 == 0 else list(reversed(args.configs))):
            model, optimizer = made[config]
            steps[config] += slowest_times(train_turn(model, optimizer, batches, turn * args.turn, args.turn, barrier),
                                           barrier)
            accuracy[config].append(test_accuracy(model, test))
    if args.rank == 0:
        parameters = sum(p.numel() for p in made[args.configs[0]][0].parameters())
        Path(args.out).write_text(json.dumps({"steps": steps, "accuracy": accuracy, "parameters": parameters,
                                              "mode": pg.lifecycle.comm.grant.mode}))
    dist.barrier(group=barrier)
    dist.destroy_process_group()
    return 0


# -- launcher side (root namespace) -----------------------------------------------------------

def run_experiment(args) -> list[dict]:
    """Bring up the network with every link shaped, one job per worker count, tear down."""
    from inagg.bmv2_env.emulation.topology import host_ip

    topo = topology(max(args.workers), args.mtu)
    title = f"train bench: {args.model}, {len(topo.hosts) - 1} worker hosts at {args.rate}"
    rows = []
    with shaped_network(topo, args.rate, title, args.switch_nice, args.cpu_load, args.rank_lease_seconds) as run:
        write_deployment(run, [host_ip(h) for name, h in topo.hosts.items() if name != "agg"])
        for n in args.workers:
            load = {"load1_start": round(os.getloadavg()[0], 2)}
            extra = ["--model", args.model, "--turns", str(args.turns), "--turn", str(args.turn), "--batch",
                     str(args.batch), "--lr", str(args.lr), "--cr", str(args.cr), "--configs", *args.configs]
            procs = start_ranks(run, Path(__file__).resolve(), f"train{n}", [f"h{r + 1}" for r in range(n)],
                                STORE_PORT + n, extra, {})
            result = finish_job(procs, run.run.path / f"train{n}.json", READY_SECONDS + args.job_timeout)
            load["load1_end"] = round(os.getloadavg()[0], 2)
            if result["mode"] != "switch":
                raise RuntimeError(f"the inagg group of N = {n} aggregated on {result['mode']}, not the switch")
            rows += summarize(result, args, n, load)
    return rows


def to_target(steps: list[float], accuracy: list[float], turn: int, target: float) -> tuple:
    """(steps, training seconds) until the accuracy measured after a turn first reached
    ``target``; empty strings when it never did."""
    for i, acc in enumerate(accuracy):
        if acc >= target:
            return (i + 1) * turn, round(sum(steps[:(i + 1) * turn]), 4)
    return "", ""


def summarize(result: dict, args, n: int, load: dict) -> list[dict]:
    """One row per configuration of one worker count."""
    steps, accuracy = result["steps"], result["accuracy"]
    turns = range(len(accuracy[args.configs[0]]))

    def turn_median(config: str, t: int) -> float:
        return statistics.median(steps[config][t * args.turn:(t + 1) * args.turn])

    rows = []
    for config in args.configs:
        ratio = statistics.median(turn_median(config, t) / turn_median("gloo", t) for t in turns) \
            if "gloo" in args.configs else ""
        to_steps, to_seconds = to_target(steps[config], accuracy[config], args.turn, args.target)
        rows.append({"model": args.model, "rate": args.rate, "workers": n, "config": config,
                     "parameters": result["parameters"], "steps": len(steps[config]),
                     "step_s": round(statistics.median(steps[config]), 5),
                     "ratio": round(ratio, 3) if ratio != "" else "", "target": args.target,
                     "steps_to_target": to_steps, "seconds_to_target": to_seconds,
                     "final_accuracy": round(accuracy[config][-1], 4), **load})
    return rows


def report(rows: list[dict]) -> None:
    """The table, one line per (N, configuration)."""
    print(f"{'N':>3} {'config':<13} {'step ms':>8} {'/ gloo':>7} {'to target':>10} {'final acc':>9}  load")
    for r in rows:
        target = f"{r['seconds_to_target']}s" if r["seconds_to_target"] != "" else "never"
        print(f"{r['workers']:>3} {r['config']:<13} {1000 * r['step_s']:>8.1f} {r['ratio']!s:>7} {target:>10} "
              f"{r['final_accuracy']:>9.3f}  {r['load1_start']}-{r['load1_end']}")


def plot(rows: list[dict], path: Path) -> bool:
    """Step time per configuration for each N (bars)."""
    plt = pyplot()
    if plt is None:
        return False
    ns = sorted({r["workers"] for r in rows})
    configs = list(dict.fromkeys(r["config"] for r in rows))
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(ns), 3.6))
    width = 0.8 / len(configs)
    for i, config in enumerate(configs):
        mine = {r["workers"]: r["step_s"] for r in rows if r["config"] == config}
        ax.bar([j + i * width for j in range(len(ns))], [1000 * mine[n] for n in ns], width, label=config)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ns))], [f"{n} workers" for n in ns])
    ax.set_ylabel(f"DDP step time (ms), {rows[0]['model']}, links {rows[0]['rate']}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from inagg.bmv2_env.demos.workloads import MODELS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="cnn", choices=MODELS, help="the zoo's model")
    p.add_argument("--workers", type=int, nargs="+", default=[4, 8], help="worker counts, one job each")
    p.add_argument("--rate", default="100mbit", help="every link's rate (tc tbf), e.g. 1gbit")
    p.add_argument("--mtu", type=int, default=1500, help="every link's MTU; K follows it")
    p.add_argument("--turns", type=int, default=6, help="turns of every configuration")
    p.add_argument("--turn", type=int, default=10, help="steps of one configuration per turn")
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=0.05, help="SGD's learning rate (momentum 0.9)")
    p.add_argument("--cr", type=float, default=0.01, help="AR-Topk's compression ratio")
    p.add_argument("--target", type=float, default=0.9, help="the test accuracy whose time is reported")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS, help="what to train")
    p.add_argument("--job-timeout", type=float, default=1800, help="seconds one job may take")
    p.add_argument("--quick", action="store_true", help="4 workers, 2 turns of 5 steps")
    add_machine_arguments(p)
    add_output_arguments(p, "train_bench", RESULTS)
    add_rank_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.workers, args.turns, args.turn = [4], 2, 5
    if min(args.workers) < 2 or args.turns < 1 or args.turn < 1 or args.batch < 1:
        p.error("--workers must be >= 2, and --turns, --turn and --batch positive")
    rate_bits(args.rate)
    return args


def main(argv: list[str] | None = None) -> int:
    return run_benchmark("train_bench", parse_args(argv), rank_main, run_experiment, FIELDS, report, plot)


if __name__ == "__main__":
    sys.exit(main())
