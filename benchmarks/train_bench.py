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

Per (N, configuration), phase ``all``: the median step time and ``ratio``, the median over turns
of (its median step / gloo's median step in the same turn); the steps and the training seconds
(the sum of its step times) until the test accuracy first reached ``--target`` ("not reached"
when it never did); the final accuracy. ``--steps`` sizes the run (steps per configuration) and
``--until-target`` ends it after the first round of turns in which every configuration reached
the target, so a long run to the target costs no more than it needs. ``start_s``, in every row
of a worker count: the job's start, the slowest rank's ``init_process_group`` until its paths
are up and calibrated (``ready``); rank 0's result file keeps what the calibration ran and the
figures it agreed on (``calibrated``).

``--bw-schedule 0:100,20:20,40:100`` (seconds:Mbit/s) changes every link's rate mid-run: the
links start at the first rate and shaping.py's ``BandwidthSchedule`` (make run's ``bw_schedule``)
re-rates both ends of each from time zero, which rank 0 takes when every rank is ready to train
and prints for the launcher; every job (worker count) starts the schedule afresh. Each rate is
a phase with rows of its own: the steps that began once tc had re-rated every link and ended
before the next change began (a step across a change counts only in ``all``), their median,
the ratio of its median to gloo's in the same phase, and the rate and time of the change as tc
then showed it on every link end (``mbit_applied``, ``applied_at_s`` after time zero; blank: the
run ended before it). Writes benchmarks/results/train_bench.csv and .png (step time per
configuration and N, with a schedule per phase, a dashed line at each rate change) and prints
the table with the machine's load.

    sudo .venv/bin/python benchmarks/train_bench.py [--model cnn] [--workers 4 8]
        [--rate 100mbit | --bw-schedule 0:100,20:20,40:100] [--turns 6 | --steps 600] [--turn 10]
        [--batch 32] [--target 0.9] [--until-target] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
from collections import Counter
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

from emulation_ranks import (READY_SECONDS, RESULTS, STORE_PORT, add_machine_arguments,  # noqa: E402
                             add_output_arguments, add_rank_arguments, finish_job, join_job, rate_bits,
                             run_benchmark, shaped_network, slowest_times, start_ranks, wait_line,
                             write_deployment)
from plots import pyplot  # noqa: E402 - benchmarks/, the script's own folder
from wire_bench import topology  # noqa: E402

CONFIGS = ("gloo", "inagg", "inagg+artopk", "powersgd")
FIELDS = ("model", "rate", "workers", "config", "phase", "phase_start_s", "mbit_applied", "applied_at_s",
          "parameters", "steps", "step_s", "ratio", "target", "steps_to_target", "seconds_to_target",
          "final_accuracy", "start_s", "load1_start", "load1_end")
NOT_REACHED = "not reached"


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


def train_turn(model, optimizer, batches: list, first: int, steps: int, barrier,
               time_zero: float) -> tuple[list[float], list[float]]:
    """``steps`` steps from batch ``first`` on; when each began (seconds after ``time_zero``, the
    wall clock: the bandwidth schedule's) and this rank's seconds of each."""
    import torch.distributed as dist

    from inagg.bmv2_env.demos.workloads import loss

    began, seconds = [], []
    for i in range(first, first + steps):
        x, y = batches[i % len(batches)]
        dist.barrier(group=barrier)
        began.append(time.time() - time_zero)
        t0 = time.perf_counter()
        optimizer.zero_grad()
        loss(model(x), y).backward()
        optimizer.step()
        seconds.append(time.perf_counter() - t0)
    return began, seconds


def test_accuracy(model, test: tuple) -> float:
    """The replica's accuracy on the test set (untimed, no gradients)."""
    import torch

    from inagg.bmv2_env.demos.workloads import accuracy

    with torch.no_grad():
        return accuracy(model.module(test[0]), test[1])


def agree_time_zero(rank: int, barrier) -> float:
    """Time zero once every rank is ready to train: rank 0's wall clock (Mininet's hosts share
    the kernel's), on every rank; rank 0 prints it (a JSON line) for the launcher, which starts
    the bandwidth schedule from it."""
    import torch
    import torch.distributed as dist

    dist.barrier(group=barrier)
    zero = torch.tensor([time.time()], dtype=torch.float64)
    dist.broadcast(zero, src=0, group=barrier)
    if rank == 0:
        print(json.dumps({"time_zero": zero.item()}), flush=True)
    return zero.item()


def all_reached(accuracy: dict, target: float, barrier) -> bool:
    """Whether every configuration's latest test accuracy reached ``target`` on every rank."""
    import torch
    import torch.distributed as dist

    reached = torch.tensor([int(min(a[-1] for a in accuracy.values()) >= target)])
    dist.all_reduce(reached, op=dist.ReduceOp.MIN, group=barrier)
    return bool(reached.item())


def rank_main(args: argparse.Namespace) -> int:
    """One rank: every configuration trained turn by turn (with ``--until-target`` until every
    one reached the target); rank 0 writes per configuration the slowest rank's step times,
    when each began and the test accuracy after each turn to ``--out``."""
    import torch.distributed as dist

    started = time.perf_counter()
    pg, barrier = join_job(args)
    start_s = slowest_times([time.perf_counter() - started], barrier)[0]
    model = pg.stats()["path_model"]
    calibrated = {"agreed": model["agreed"], **model["calibration"]}   # the figures the job starts from
    gloo = dist.new_group(backend="gloo")
    made, (batches, test) = replicas(args, pg, gloo), shard(args, args.rank, args.world)
    steps, began, accuracy = ({c: [] for c in args.configs} for _ in range(3))
    time_zero = agree_time_zero(args.rank, barrier)
    for turn in range(args.turns):
        for config in (args.configs if turn % 2 == 0 else list(reversed(args.configs))):
            model, optimizer = made[config]
            starts, seconds = train_turn(model, optimizer, batches, turn * args.turn, args.turn, barrier, time_zero)
            began[config] += starts
            steps[config] += slowest_times(seconds, barrier)
            accuracy[config].append(test_accuracy(model, test))
        if args.until_target and all_reached(accuracy, args.target, barrier):
            break
    if args.rank == 0:
        parameters = sum(p.numel() for p in made[args.configs[0]][0].parameters())
        Path(args.out).write_text(json.dumps({"steps": steps, "began": began, "accuracy": accuracy,
                                              "parameters": parameters, "mode": pg.lifecycle.comm.grant.mode,
                                              "start_s": start_s, "calibrated": calibrated}))
    dist.barrier(group=barrier)
    dist.destroy_process_group()
    return 0


# -- launcher side (root namespace) -----------------------------------------------------------

def run_experiment(args) -> list[dict]:
    """Bring up the network with every link shaped, one job per worker count, tear down."""
    from inagg.bmv2_env.emulation.topology import host_ip

    topo = topology(max(args.workers), args.mtu)
    title = f"train bench: {args.model}, {len(topo.hosts) - 1} worker hosts at {rate_label(args)}"
    rows = []
    with shaped_network(topo, args.rate, title, args.switch_nice, args.cpu_load, args.rank_lease_seconds) as run:
        write_deployment(run, [host_ip(h) for name, h in topo.hosts.items() if name != "agg"])
        for n in args.workers:
            load = {"load1_start": round(os.getloadavg()[0], 2)}
            result = train_job(run, args, n)
            load["load1_end"] = round(os.getloadavg()[0], 2)
            if result["mode"] != "switch":
                raise RuntimeError(f"the inagg group of N = {n} aggregated on {result['mode']}, not the switch")
            rows += summarize(result, args, n, load)
    return rows


def link_schedule(run, schedule: list | None):
    """A ``BandwidthSchedule`` of every link of the run (each a host's) on ``schedule``; one of
    no links without a schedule (the links keep ``--rate``)."""
    from inagg.bmv2_env.emulation.shaping import BandwidthSchedule

    return BandwidthSchedule([(f"{link.intf1.node.name}-{link.intf2.node.name}", [link.intf1, link.intf2], schedule)
                              for link in run.net.links] if schedule else [])


def train_job(run, args, n: int) -> dict:
    """One job of ``n`` ranks, the links at the schedule's first rate from its start and re-rated
    from the time zero rank 0 prints; rank 0's result with the schedule's ``changes`` (tc's)."""
    schedule = link_schedule(run, args.bw_schedule)
    schedule.bring_up()
    extra = ["--model", args.model, "--turns", str(args.turns), "--turn", str(args.turn), "--batch",
             str(args.batch), "--lr", str(args.lr), "--cr", str(args.cr), "--target", str(args.target),
             *(["--until-target"] if args.until_target else []), "--configs", *args.configs]
    procs = start_ranks(run, Path(__file__).resolve(), f"train{n}", [f"h{r + 1}" for r in range(n)],
                        STORE_PORT + n, extra, {})
    time_zero = wait_line(procs[0], procs, READY_SECONDS + args.job_timeout, run.run.path / "logs")["time_zero"]
    schedule.start(time_zero)
    try:
        result = finish_job(procs, run.run.path / f"train{n}.json", args.job_timeout)
    finally:
        schedule.stop()
    return {**result, "changes": schedule.applied(time_zero)}


def to_target(steps: list[float], accuracy: list[float], turn: int, target: float) -> tuple:
    """(steps, training seconds) until the accuracy measured after a turn first reached
    ``target``; "not reached" for both when it never did."""
    for i, acc in enumerate(accuracy):
        if acc >= target:
            return (i + 1) * turn, round(sum(steps[:(i + 1) * turn]), 4)
    return NOT_REACHED, NOT_REACHED


def phase_changes(schedule: list, changes: list[dict]) -> list[list[dict]]:
    """The schedule's changes by phase: a link's k-th change (bring-up's the 0th) is phase k."""
    phases: list[list[dict]] = [[] for _ in schedule]
    seen: Counter = Counter()
    for change in changes:
        phases[seen[change["link"]]].append(change)
        seen[change["link"]] += 1
    return phases


def phase_window(schedule: list, phases: list[list[dict]], i: int) -> tuple[float, float] | None:
    """Phase ``i``'s steady seconds after time zero: from when tc had re-rated every link (the
    last link's change) until the next change began (its time in the schedule); None when the
    run ended before every link had the phase's rate."""
    if len(phases[i]) < len(phases[0]):
        return None
    end = schedule[i + 1][0] if i + 1 < len(schedule) else math.inf
    return max(c["at_s"] for c in phases[i]), end


def applied_text(changes: list[dict]) -> str:
    """The rates tc showed on the link ends after a phase's changes, each once (Mbit/s)."""
    shown = {rate for c in changes for rate in c["mbit_applied"]}
    return ";".join(sorted(f"{rate:g}" if rate is not None else "none" for rate in shown))


def steps_inside(result: dict, config: str, window: tuple[float, float] | None) -> list[float]:
    """``config``'s step times of the steps that began and ended inside ``window`` (None: none)."""
    if window is None:
        return []
    return [s for b, s in zip(result["began"][config], result["steps"][config]) if window[0] <= b and b + s <= window[1]]


def phase_rows(result: dict, args, base: dict) -> list[dict]:
    """Per phase of the schedule and configuration: the steps wholly inside the phase's window,
    their median and its ratio to gloo's median in the same phase, and tc's rates."""
    phases = phase_changes(args.bw_schedule, result["changes"])
    rows = []
    for i, (start, mbit) in enumerate(args.bw_schedule):
        window = phase_window(args.bw_schedule, phases, i)
        inside = {config: steps_inside(result, config, window) for config in args.configs}
        median = {config: statistics.median(times) if times else None for config, times in inside.items()}
        tc_shows = {"mbit_applied": applied_text(phases[i]),
                    "applied_at_s": round(max(c["at_s"] for c in phases[i]), 3) if phases[i] else ""}
        for config in args.configs:
            ratio = median[config] / median["gloo"] if median[config] and median.get("gloo") else None
            rows.append({**base[config], **tc_shows, "phase": i, "phase_start_s": start, "rate": f"{mbit:g}mbit",
                         "steps": len(inside[config]),
                         "step_s": "" if median[config] is None else round(median[config], 5),
                         "ratio": "" if ratio is None else round(ratio, 3)})
    return rows


def summarize(result: dict, args, n: int, load: dict) -> list[dict]:
    """One row per configuration of one worker count (phase ``all``), then with a schedule one
    per configuration and phase."""
    steps, accuracy = result["steps"], result["accuracy"]
    turns = range(len(accuracy[args.configs[0]]))

    def turn_median(config: str, t: int) -> float:
        return statistics.median(steps[config][t * args.turn:(t + 1) * args.turn])

    base = {config: {"model": args.model, "workers": n, "config": config, "parameters": result["parameters"],
                     "target": args.target, "start_s": round(result["start_s"], 2), **load} for config in args.configs}
    rows = []
    for config in args.configs:
        ratio = statistics.median(turn_median(config, t) / turn_median("gloo", t) for t in turns) \
            if "gloo" in args.configs else ""
        to_steps, to_seconds = to_target(steps[config], accuracy[config], args.turn, args.target)
        rows.append({**base[config], "rate": rate_label(args), "phase": "all", "steps": len(steps[config]),
                     "step_s": round(statistics.median(steps[config]), 5),
                     "ratio": round(ratio, 3) if ratio != "" else "", "steps_to_target": to_steps,
                     "seconds_to_target": to_seconds, "final_accuracy": round(accuracy[config][-1], 4)})
    return rows + (phase_rows(result, args, base) if args.bw_schedule else [])


def report(rows: list[dict]) -> None:
    """The table, one line per (N, configuration, phase)."""
    print(f"{'N':>3} {'config':<13} {'phase':>5} {'rate':>18} {'tc shows':>9} {'steps':>5} {'step ms':>8} "
          f"{'/ gloo':>7} {'to target':>11} {'final acc':>9}  load")
    for r in rows:
        step = f"{1000 * r['step_s']:.1f}" if r["step_s"] != "" else "-"
        target = f"{r['seconds_to_target']}s" if isinstance(r.get("seconds_to_target"), float) \
            else r.get("seconds_to_target", "")
        final = f"{r['final_accuracy']:.3f}" if "final_accuracy" in r else ""
        print(f"{r['workers']:>3} {r['config']:<13} {r['phase']!s:>5} {r['rate']:>18} {r.get('mbit_applied', '')!s:>9} "
              f"{r['steps']:>5} {step:>8} {r['ratio']!s:>7} {target:>11} {final:>9}  "
              f"{r['load1_start']}-{r['load1_end']}")


def plot(rows: list[dict], path: Path) -> bool:
    """Step time per configuration (bars) for each N, with a schedule for each of its phases (a
    dashed line where the rate changes)."""
    plt = pyplot()
    if plt is None:
        return False
    phased = [r for r in rows if r["phase"] != "all"]
    groups = list(dict.fromkeys((r["workers"], r["phase"]) for r in phased or rows))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    step = {(r["workers"], r["phase"], r["config"]): r["step_s"] for r in rows}
    label = {(r["workers"], r["phase"]): f"{r['workers']} workers" + (
        f"\n{r['rate']} from {r['phase_start_s']:g} s" if r["phase"] != "all" else "") for r in rows}
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(groups), 3.6))
    width = 0.8 / len(configs)
    for i, config in enumerate(configs):
        ms = [1000 * step[(*g, config)] if step[(*g, config)] != "" else math.nan for g in groups]
        ax.bar([j + i * width for j in range(len(groups))], ms, width, label=config)
    for j in range(1, len(groups)):
        if groups[j][0] == groups[j - 1][0]:
            ax.axvline(j - 0.1 - width / 2, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], [label[g] for g in groups], fontsize=7)
    ax.set_ylabel(f"DDP step time (ms), {rows[0]['model']}, links {rows[0]['rate']}", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def parse_bw_schedule(text: str) -> list[list[float]]:
    """``0:100,20:20,40:100`` (seconds after time zero:Mbit/s) as make run's ``bw_schedule``
    ([[0, 100], [20, 20], [40, 100]]), checked by the topology schema's rules."""
    from inagg.bmv2_env.emulation.topology_schema import check_bw_schedule

    try:
        schedule = [[float(part) for part in entry.split(":")] for entry in text.split(",")]
        check_bw_schedule({"bw_schedule": schedule}, "--bw-schedule")
    except ValueError as e:   # a TopologyError is one
        raise argparse.ArgumentTypeError(f"{text!r}: write seconds:Mbit/s pairs, e.g. 0:100,20:20,40:100 ({e})")
    return schedule


def rate_label(args) -> str:
    """The links' rate as the rows and the title give it: ``--rate``, or the schedule's text."""
    if not args.bw_schedule:
        return args.rate
    return "schedule " + ",".join(f"{at:g}:{mbit:g}" for at, mbit in args.bw_schedule)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from inagg.bmv2_env.demos.workloads import MODELS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="cnn", choices=MODELS, help="the zoo's model")
    p.add_argument("--workers", type=int, nargs="+", default=[4, 8], help="worker counts, one job each")
    p.add_argument("--rate", help="every link's rate (tc tbf), e.g. 1gbit (default 100mbit)")
    p.add_argument("--bw-schedule", type=parse_bw_schedule, metavar="S:MBIT,...",
                   help="every link's rate changing mid-run instead of --rate, e.g. 0:100,20:20,40:100")
    p.add_argument("--mtu", type=int, default=1500, help="every link's MTU; K follows it")
    p.add_argument("--turns", type=int, default=6, help="turns of every configuration")
    p.add_argument("--turn", type=int, default=10, help="steps of one configuration per turn")
    p.add_argument("--steps", type=int, help="steps per configuration instead of --turns (a multiple of --turn)")
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=0.05, help="SGD's learning rate (momentum 0.9)")
    p.add_argument("--cr", type=float, default=0.01, help="AR-Topk's compression ratio")
    p.add_argument("--target", type=float, default=0.9, help="the test accuracy whose time is reported")
    p.add_argument("--until-target", action="store_true",
                   help="end after the first round of turns in which every configuration reached --target")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=CONFIGS, help="what to train")
    p.add_argument("--job-timeout", type=float, default=1800, help="seconds one job may take")
    p.add_argument("--quick", action="store_true", help="4 workers, 2 turns of 5 steps")
    add_machine_arguments(p)
    add_output_arguments(p, "train_bench", RESULTS)
    add_rank_arguments(p)
    return checked(p, p.parse_args(argv))


def checked(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """The flags' combinations checked and resolved: --quick's sizes, --steps as turns, the
    links' first rate (--rate, or the schedule's first entry)."""
    if args.quick:
        args.workers, args.turns, args.turn = [4], 2, 5
    if min(args.workers) < 2 or args.turns < 1 or args.turn < 1 or args.batch < 1:
        p.error("--workers must be >= 2, and --turns, --turn and --batch positive")
    if args.steps is not None:
        if args.steps < 1 or args.steps % args.turn:
            p.error(f"--steps {args.steps} must be a positive multiple of --turn {args.turn}")
        args.turns = args.steps // args.turn
    if args.rate and args.bw_schedule:
        p.error("--rate and --bw-schedule both given: the schedule's first entry is the rate from the start")
    args.rate = f"{args.bw_schedule[0][1]:g}mbit" if args.bw_schedule else args.rate or "100mbit"
    rate_bits(args.rate)
    return args


def main(argv: list[str] | None = None) -> int:
    return run_benchmark("train_bench", parse_args(argv), rank_main, run_experiment, FIELDS, report, plot)


if __name__ == "__main__":
    sys.exit(main())
