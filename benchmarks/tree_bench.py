"""Two-level aggregation against one level on shaped links: the same 8-rank job (inagg forced,
float32) on the leaf-spine tree (two ToRs of four workers under a spine) and on one switch, in one
Mininet network on the software data plane, every link shaped by ``tc tbf`` (100 Mbit/s by
default): the hosts' links and the switch-to-switch links alike.

The network is bmv2_env/emulation/topologies/leaf_spine.json (ranks on h1..h8, the host aggregator
on the spine) plus one more switch, ``flat``, with eight hosts f1..f8 and a link to the spine
(check_trees wants every switch joined to the host aggregator's; nothing crosses it). Two jobs
run at once, ``tree`` on h1..h8 and ``flat`` on f1..f8, each with a controller directory of its
own (its ranks' addresses beside a link to the run's socket), and take turns the launcher gives:
rank 0 waits for the turn's file, the job's ranks meet at a barrier, allreduce, meet again, and
rank 0 says it is done. Turn 0 is one untimed call of seeded random values at the first size
(the result's digest, so the two jobs' bits are compared); then per size ``--reps`` turns of each
job, the order alternating (reversed in odd repetitions), every sum checked. A call's time is its
slowest rank's.

Around every turn the launcher reads the switch-side interface counters
(/sys/class/net/<if>/statistics) of the job's links: each worker's host link and, for the tree,
each ToR's uplink, per direction (up: toward the root). A link's multiple is the bytes the call
carried on it over the tensor's bytes, as values (the frames' bytes less 58 header bytes each:
Ethernet, IPv4, UDP, inagg) and on the wire (whole frames; the framing alone makes that
(58 + 4K) / 4K). The barriers' few TCP segments are counted too.

Per (job, size): the median time, the framing limit (the tensor on one link at the rate in frames
of K values), the tree's ``ratio`` (the median over repetitions of tree / flat of the adjacent
calls), the ToR uplinks' multiples per direction (the larger of the two ToRs'; ``uplinks`` has
each), the host links' mean multiples, the calls' retransmissions, whether the bits matched,
the grant (K, window: the tree's is the controller's ``min_window`` on every level, fixed; the
one-switch job's grows from it, or stays at it with ``--sharing static``: equal windows) and where
the job was placed, and the load average before and after. Writes benchmarks/results/tree_bench.csv
and tree_bench.png, prints the table and the load.
Times are the slowest rank's (``clock``). A run cut short (a rank dies: killed, or dropped by the
controller's rank lease on a loaded machine) writes the rows of the turns that ended, their times
rank 0's own as it told them turn by turn, and a row naming the failed turn and the reason
(``failed``); no table or plot, exit status 1.

    sudo .venv/bin/python benchmarks/tree_bench.py [--rate 100mbit] [--sizes-mib 4 16] [--reps 5]
        [--min-window 1024] [--sharing static] [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

from emulation_ranks import (READY_SECONDS, RESULTS, STORE_PORT, PartialResult, add_machine_arguments,  # noqa: E402
                             add_output_arguments, add_rank_arguments, finish_job, join_job, rate_bits, run_benchmark,
                             shaped_network, slowest_times, start_ranks, wait_line, write_deployment)
from plots import pyplot  # noqa: E402 - benchmarks/, the script's own folder
from inagg.controller.allocator import SHARING  # noqa: E402
from wire_bench import ETH_IP_UDP_INAGG, MIB, framing_limit, timed_call  # noqa: E402

LEAF_SPINE = ROOT / "bmv2_env" / "emulation" / "topologies" / "leaf_spine.json"
JOBS = ("flat", "tree")          # the one-level job first: the even repetitions' order
TREE_REASON = "aggregation tree over"   # how the controller's grant names a tree placement
FIELDS = ("job", "rate", "mtu", "k", "window", "workers", "bytes", "reps", "median_s", "clock", "ratio",
          "framing_limit_s", "vs_limit", "uplink_up_x", "uplink_down_x", "uplink_up_wire_x", "uplink_down_wire_x",
          "uplinks", "host_up_x", "host_down_x", "retransmissions", "same_bits", "placement", "load1_start",
          "load1_end", "failed")


# -- rank side (one process in each worker's Mininet host) ------------------------------------

def wait_turn(turns: Path, job: str, turn: int, barrier) -> None:
    """Rank 0 waits for the launcher's file of this job's turn; the others wait for rank 0."""
    import torch.distributed as dist

    if dist.get_rank() == 0:
        while not (turns / f"{job}.{turn}").exists():
            time.sleep(0.01)
    dist.barrier(group=barrier)


def end_turn(turn: int, barrier, said: dict) -> None:
    """Every rank is through the call; rank 0 tells the launcher, with what it ``said`` of the
    turn (the launcher keeps it: a run cut short still has its turns)."""
    import torch.distributed as dist

    dist.barrier(group=barrier)
    if dist.get_rank() == 0:
        print(json.dumps({"done": turn, **said}), flush=True)


def grant_fields(pg) -> dict:
    """The job's grant now: values per packet, window, mode and where it was placed."""
    grant = pg.lifecycle.comm.grant
    return {"k": grant.values_per_packet, "window": grant.slot_count, "mode": grant.mode,
            "placement": grant.reason or grant.mode}


def result_digest(nbytes: int, pg, barrier) -> str:
    """One untimed allreduce of random float32 values seeded by the rank (so the same inputs on
    both jobs); the result's SHA-256, shortened, to compare the two jobs' bits."""
    import torch
    import torch.distributed as dist

    x = torch.randn(nbytes // 4, generator=torch.Generator().manual_seed(dist.get_rank()))
    dist.barrier(group=barrier)
    dist.all_reduce(x, group=pg)
    return hashlib.sha256(x.numpy().tobytes()).hexdigest()[:16]


def retransmissions_per_call(counts: list[int], barrier) -> list[int]:
    """Each call's retransmissions, summed over the job's ranks (``counts``: this rank's
    count before the first call, then after each)."""
    import torch
    import torch.distributed as dist

    summed = torch.tensor(counts, dtype=torch.int64)
    dist.all_reduce(summed, group=barrier)
    return torch.diff(summed).tolist()


def rank_main(args: argparse.Namespace) -> int:
    """One rank of one job: turn 0 the digest call, then each size's repetitions, one call a
    turn, rank 0 telling the launcher after each its own time and retransmissions and the
    grant; at the end rank 0 writes the slowest rank's time and the retransmissions of every
    call, the digest and the grant (K, window, mode, placement) to ``--out``."""
    import torch
    import torch.distributed as dist

    pg, barrier = join_job(args)
    turns, seconds = Path(args.turns), []
    wait_turn(turns, args.rank_of, 0, barrier)
    digest = result_digest(args.sizes[0], pg, barrier)
    end_turn(0, barrier, {"digest": digest, **grant_fields(pg)})
    retransmitted = [pg.stats()["inagg"]["retransmissions"]]
    for turn, (nbytes, _) in enumerate(turn_plan(args), 1):
        x = torch.empty(nbytes // 4, dtype=torch.float32)
        wait_turn(turns, args.rank_of, turn, barrier)
        seconds.append(timed_call(x, pg, barrier))
        retransmitted.append(pg.stats()["inagg"]["retransmissions"])
        end_turn(turn, barrier, {"seconds": seconds[-1], "retransmissions": retransmitted[-1] - retransmitted[-2],
                                 **grant_fields(pg)})
    slowest, retx = slowest_times(seconds, barrier), retransmissions_per_call(retransmitted, barrier)
    if args.rank == 0:
        Path(args.out).write_text(json.dumps({"seconds": slowest, "retransmissions": retx, "workers": args.world,
                                              "digest": digest, "clock": "slowest rank", **grant_fields(pg)}))
    dist.barrier(group=barrier)
    dist.destroy_process_group()
    return 0


def turn_plan(args: argparse.Namespace) -> list[tuple[int, int]]:
    """The timed turns after turn 0, in order: (bytes, repetition) per size and repetition."""
    return [(nbytes, rep) for nbytes in args.sizes for rep in range(args.reps)]


# -- launcher side (root namespace) -----------------------------------------------------------

def topology(mtu: int, min_window: int | None, sharing: str | None = None):
    """The leaf-spine topology with the ``tree`` job on its workers, and one switch ``flat``
    (its eight hosts f1..f8 running the ``flat`` job) linked to the spine; the controller's
    ``min_window`` (a tree's window on every level) and ``sharing`` the file's unless given."""
    from inagg.bmv2_env.emulation.topology import parse_topology

    data = json.loads(LEAF_SPINE.read_text())
    tree_hosts = data["jobs"][0]["workers"]
    flat_hosts = [f"f{i}" for i in range(1, len(tree_hosts) + 1)]
    data["hosts"].update({h: {"ip": f"10.0.0.{10 + i}/24", "mac": f"08:00:00:00:01:{i:02x}"}
                          for i, h in enumerate(flat_hosts, 1)})
    data["switches"]["flat"] = {"aggregator_ip": "10.0.0.253", "aggregator_mac": "00:00:00:00:03:fe"}
    spine_ports = {int(end.rsplit("-p", 1)[1]) for link in data["links"] for end in link if end.startswith("spine-p")}
    data["links"] += [[h, f"flat-p{i}"] for i, h in enumerate(flat_hosts, 1)]
    data["links"].append([f"flat-p{len(flat_hosts) + 1}", f"spine-p{max(spine_ports) + 1}"])
    data["jobs"] = [{"name": "flat", "workers": flat_hosts}, {"name": "tree", "workers": tree_hosts}]
    data["mtu"] = mtu
    if min_window is not None:
        data["controller"]["min_window"] = min_window
    if sharing is not None:
        data["controller"]["sharing"] = sharing
    return parse_topology(data, "tree_bench")


@dataclass(frozen=True)
class CountedLink:
    """A link of a job whose bytes are counted, at its switch-side interface: ``up`` is the
    statistic that counts the direction toward the root (``rx`` on a host's link, ``tx`` on a
    ToR's uplink), the other one counts the way down."""
    label: str
    interface: str
    up: str
    uplink: bool

    @property
    def down(self) -> str:
        return "tx" if self.up == "rx" else "rx"


def job_links(run, hosts: list[str]) -> list[CountedLink]:
    """Each worker's host link and, when the job spans several switches, each of its switches'
    links to a switch without its workers (a ToR's uplink)."""
    topo = run.topo
    ends = {h: topo.attachment(h) for h in hosts}
    links = [CountedLink(h, run.run.interface_name(e.node, e.port), "rx", False) for h, e in ends.items()]
    switches = {e.node for e in ends.values()}
    if len(switches) > 1:
        links += [CountedLink(mine.node, run.run.interface_name(mine.node, mine.port), "tx", True)
                  for link in topo.links if link.a.port is not None and link.b.port is not None
                  for mine, other in ((link.a, link.b), (link.b, link.a))
                  if mine.node in switches and other.node not in switches]
    return links


def read_counters(links: list[CountedLink]) -> dict[str, dict[str, int]]:
    """Every link's interface statistics now: {label: {"rx_bytes": .., "rx_packets": .., ...}}."""
    out = {}
    for link in links:
        stats = Path("/sys/class/net") / link.interface / "statistics"
        out[link.label] = {f"{d}_{kind}": int((stats / f"{d}_{kind}").read_text())
                           for d in ("rx", "tx") for kind in ("bytes", "packets")}
    return out


def carried(links: list[CountedLink], before: dict, after: dict) -> dict[str, dict[str, list[int]]]:
    """What each link carried between two readings: {label: {"up"|"down": [bytes, frames]}}."""
    def delta(label: str, stat: str) -> list[int]:
        return [after[label][f"{stat}_{k}"] - before[label][f"{stat}_{k}"] for k in ("bytes", "packets")]

    return {link.label: {"up": delta(link.label, link.up), "down": delta(link.label, link.down)} for link in links}


class TurnFailed(RuntimeError):
    """A turn that did not end (a rank died, or rank 0 said nothing in time): which job, at
    which size, and why."""

    def __init__(self, job: str, nbytes: int, turn: int, why: str) -> None:
        super().__init__(f"job {job}, turn {turn} ({nbytes / MIB:g} MiB): {why}")
        self.job, self.nbytes = job, nbytes


@dataclass
class Job:
    """One running job: its ranks, its counted links, where rank 0 writes its result, what
    each of its turns carried and what rank 0 said of it."""
    name: str
    procs: list
    links: list[CountedLink]
    out: Path
    turns: list = field(default_factory=list)   # each turn's bytes on the job's links
    said: list[dict] = field(default_factory=list)   # what rank 0 said at the end of each turn

    def take_turn(self, run, turn: int, timeout: float) -> None:
        """Let the job make its call ``turn``; its links' bytes then."""
        before = read_counters(self.links)
        (run.run.path / "turns" / f"{self.name}.{turn}").touch()
        said = wait_line(self.procs[0], self.procs, timeout, run.run.path / "logs")
        if said.get("done") != turn:
            raise RuntimeError(f"job {self.name}: rank 0 said {said} at turn {turn}")
        self.turns.append(carried(self.links, before, read_counters(self.links)))
        self.said.append(said)

    def told(self) -> dict | None:
        """The job's result as rank 0 told it turn by turn (its own clock), for a run cut
        short; None before its first turn ended."""
        if not self.said:
            return None
        timed = self.said[1:]
        return {"seconds": [s["seconds"] for s in timed], "retransmissions": [s["retransmissions"] for s in timed],
                "workers": len(self.procs), "digest": self.said[0]["digest"], "clock": "rank 0",
                **{k: self.said[-1][k] for k in ("k", "window", "mode", "placement")}, "turns": self.turns,
                "uplinks": [link.label for link in self.links if link.uplink]}


def start_jobs(run, args) -> list[Job]:
    """Both jobs' ranks, each with the controller directory of its own, started together."""
    from inagg.bmv2_env.emulation.topology import host_ip
    from inagg.hostlib.pytorch.path.links import LINK_RATE_ENV

    (run.run.path / "turns").mkdir()
    extra = ["--sizes-mib", *map(str, args.sizes_mib), "--reps", str(args.reps), "--turns", str(run.run.path / "turns")]
    jobs = []
    for i, spec in enumerate(run.topo.jobs):
        hosts = spec["workers"]
        ips = [host_ip(run.topo.hosts[h]) for h in hosts]
        controller = write_deployment(run, ips, run.run.path / "jobs" / spec["name"])
        procs = start_ranks(run, Path(__file__).resolve(), spec["name"], hosts, STORE_PORT + i, extra,
                            {"INAGG_CONTROLLER": controller, LINK_RATE_ENV: args.rate})
        jobs.append(Job(spec["name"], procs, job_links(run, hosts), run.run.path / f"{spec['name']}.json"))
    return jobs


def run_turns(run, jobs: list[Job], args) -> None:
    """Turn 0 (the digest call) then every timed turn, the jobs' order alternating; TurnFailed
    for the first turn that does not end."""
    first = READY_SECONDS + 20 * framing_limit(args.sizes[0], 64, args.rate)
    steps = [(0, args.sizes[0], jobs, first)] + [
        (turn, nbytes, jobs if rep % 2 == 0 else list(reversed(jobs)), 30 + 20 * framing_limit(nbytes, 64, args.rate))
        for turn, (nbytes, rep) in enumerate(turn_plan(args), 1)]
    for turn, nbytes, order, timeout in steps:
        for job in order:
            try:
                job.take_turn(run, turn, timeout)
            except RuntimeError as e:
                raise TurnFailed(job.name, nbytes, turn, str(e)) from e
        print(f"turn {turn}/{len(steps) - 1} done ({nbytes / MIB:g} MiB)", flush=True)


def run_experiment(args) -> tuple[dict, dict]:
    """Bring up the network with every link shaped, run both jobs turn by turn, tear down; each
    job's result (its turns' bytes added) and the load average before and after the turns. A
    turn that fails ends the run with ``PartialResult``: the rows of the turns that ended (rank
    0's times), and one marking the failed turn with its reason."""
    title = f"tree bench: jobs {', '.join(JOBS)} of 8 ranks, every link at {args.rate}, MTU {args.mtu}"
    with shaped_network(topology(args.mtu, args.min_window, args.sharing), args.rate, title, args.switch_nice, args.cpu_load,
                        args.rank_lease_seconds) as run:
        jobs = start_jobs(run, args)
        load = {"load1_start": round(os.getloadavg()[0], 2)}
        try:
            run_turns(run, jobs, args)
        except TurnFailed as failed:
            load["load1_end"] = round(os.getloadavg()[0], 2)
            told = {job.name: job.told() for job in jobs if job.told() is not None}
            rows = summarize(told, load, args) + [{"job": failed.job, "rate": args.rate, "mtu": args.mtu,
                                                   "bytes": failed.nbytes, "failed": str(failed), **load}]
            raise PartialResult(rows, str(failed)) from failed
        load["load1_end"] = round(os.getloadavg()[0], 2)
        results = {job.name: {**finish_job(job.procs, job.out, READY_SECONDS), "turns": job.turns,
                              "uplinks": [link.label for link in job.links if link.uplink]} for job in jobs}
    return results, load


# -- what the run shows -----------------------------------------------------------------------

def multiples(turns: list[dict], label: str, direction: str, nbytes: int) -> tuple[float, float]:
    """The median over ``turns`` of what one link carried one way, over the tensor's bytes: as
    values (less each frame's headers) and on the wire."""
    counts = [t[label][direction] for t in turns]
    values = statistics.median((b - ETH_IP_UDP_INAGG * f) / nbytes for b, f in counts)
    wire = statistics.median(b / nbytes for b, _ in counts)
    return round(values, 4), round(wire, 4)


def link_columns(turns: list[dict], uplinks: list[str], nbytes: int) -> dict:
    """The uplink and host link columns of one job's turns at one size (``uplinks``: the labels
    of its ToR uplinks; every other link is a host's)."""
    hosts = [label for label in turns[0] if label not in uplinks]
    up = {label: multiples(turns, label, "up", nbytes) for label in uplinks}
    down = {label: multiples(turns, label, "down", nbytes) for label in uplinks}
    host_mean = {d: round(statistics.mean(multiples(turns, h, d, nbytes)[0] for h in hosts), 4) for d in ("up", "down")}
    return {"uplink_up_x": max((v for v, _ in up.values()), default=None),
            "uplink_down_x": max((v for v, _ in down.values()), default=None),
            "uplink_up_wire_x": max((w for _, w in up.values()), default=None),
            "uplink_down_wire_x": max((w for _, w in down.values()), default=None),
            "uplinks": " ".join(f"{u} {up[u][0]:.3f}/{down[u][0]:.3f}" for u in uplinks),
            "host_up_x": host_mean["up"], "host_down_x": host_mean["down"]}


def summarize(results: dict, load: dict, args) -> list[dict]:
    """One CSV row per (job, size) with timed turns: the median, the tree's ratio to the flat
    job, the links' multiples. ``results`` may hold fewer turns than planned, or one job only
    (a run cut short: ``Job.told``)."""
    plan, rows = turn_plan(args), []
    digests = {results[name]["digest"] for name in JOBS if name in results}
    same = len(digests) == 1 and len(results) == len(JOBS)
    for name in JOBS:
        result = results.get(name, {"seconds": []})
        for nbytes in args.sizes:
            mine = [i for i, (b, _) in enumerate(plan) if b == nbytes and i < len(result["seconds"])]
            if not mine:
                continue
            times = [result["seconds"][i] for i in mine]
            ratios = [results["tree"]["seconds"][i] / results["flat"]["seconds"][i] for i in mine
                      if len(results) == len(JOBS) and i < min(len(r["seconds"]) for r in results.values())]
            limit = framing_limit(nbytes, result["k"], args.rate)
            rows.append({"job": name, "rate": args.rate, "mtu": args.mtu, "k": result["k"], "window": result["window"],
                         "workers": result["workers"], "bytes": nbytes, "reps": len(times),
                         "median_s": round(statistics.median(times), 4), "clock": result["clock"],
                         "ratio": round(statistics.median(ratios), 3) if name == "tree" and ratios else None,
                         "framing_limit_s": round(limit, 4), "vs_limit": round(statistics.median(times) / limit, 3),
                         **link_columns([result["turns"][i + 1] for i in mine], result["uplinks"], nbytes),
                         "retransmissions": sum(result["retransmissions"][i] for i in mine), "same_bits": same,
                         "placement": result["placement"], **load})
    return rows


def check_placement(results: dict) -> None:
    """The tree job on its tree and the flat job on its switch, or the comparison means nothing."""
    tree, flat = results["tree"], results["flat"]
    if not (tree["mode"] == "switch" and tree["placement"].startswith(TREE_REASON)) or flat["mode"] != "switch":
        raise RuntimeError(f"the jobs were not placed as compared: tree {tree['placement']!r} ({tree['mode']}), "
                           f"flat {flat['placement']!r} ({flat['mode']}); see the run's logs/controller.log")


def report(rows: list[dict]) -> None:
    """The table, whether the bits matched, where the tree was placed, and the load."""
    print(f"\n{'job':<5} {'MiB':>4} {'K':>4} {'win':>4} {'median s':>9} {'limit s':>8} {'ratio':>6} "
          f"{'up x':>6} {'down x':>6} {'up wire':>7} {'dn wire':>7} {'host up/dn':>11} {'retx':>5}")
    for r in rows:
        cells = [f"{r[key]:{width}.{digits}f}" if r[key] is not None else f"{'-':>{width}}"
                 for key, width, digits in (("ratio", 6, 3), ("uplink_up_x", 6, 3), ("uplink_down_x", 6, 3),
                                            ("uplink_up_wire_x", 7, 3), ("uplink_down_wire_x", 7, 3))]
        print(f"{r['job']:<5} {r['bytes'] / MIB:>4.0f} {r['k']:>4} {r['window']:>4} {r['median_s']:9.3f} "
              f"{r['framing_limit_s']:8.3f} {' '.join(cells)} {r['host_up_x']:5.3f}/{r['host_down_x']:5.3f} "
              f"{r['retransmissions']:>5}")
    tree = next(r for r in rows if r["job"] == "tree")
    print(f"uplinks (up/down, values): {'; '.join(r['uplinks'] for r in rows if r['job'] == 'tree')}")
    print(f"tree placed: {tree['placement']}")
    print(f"same bits on both jobs: {'yes' if tree['same_bits'] else 'NO'}")
    print(f"load average {tree['load1_start']:.2f} before the calls, {tree['load1_end']:.2f} after, "
          f"on {os.cpu_count()} cores")


def plot(rows: list[dict], path: Path) -> bool:
    """Per size: each job's median time beside the framing limit; the tree's uplink and both
    jobs' host link multiples per direction."""
    plt = pyplot()
    if plt is None:
        return False
    sizes = sorted({r["bytes"] for r in rows})
    by = {(r["job"], r["bytes"]): r for r in rows}
    fig, (times, bytes_ax) = plt.subplots(1, 2, figsize=(9, 3.6))
    xs = range(len(sizes))
    for offset, job in ((-0.2, "flat"), (0.2, "tree")):
        times.bar([x + offset for x in xs], [by[job, b]["median_s"] for b in sizes], 0.4,
                  label="one switch" if job == "flat" else "leaf-spine tree")
    times.plot(xs, [by["flat", b]["framing_limit_s"] for b in sizes], "k_", markersize=30, label="framing limit")
    for x, b in zip(xs, sizes):
        times.annotate(f"{by['tree', b]['ratio']:.2f}x", (x + 0.2, by["tree", b]["median_s"]), ha="center",
                       va="bottom", fontsize=8)
    times.set_ylabel(f"allreduce time (s), every link {rows[0]['rate']}")
    series = (("tree", "uplink_up_x", "ToR uplink, up"), ("tree", "uplink_down_x", "ToR uplink, down"),
              ("tree", "host_up_x", "tree host link, up"), ("flat", "host_up_x", "flat host link, up"))
    for i, (job, key, label) in enumerate(series):
        bytes_ax.bar([x - 0.3 + 0.2 * i for x in xs], [by[job, b][key] for b in sizes], 0.2, label=label)
    bytes_ax.axhline(1.0, color="k", linestyle="--", linewidth=0.8)
    bytes_ax.set_ylabel("values carried per call / tensor")
    bytes_ax.set_ylim(0, 1.45)
    times.set_ylim(0, 1.3 * max(r["median_s"] for r in rows))
    for ax in (times, bytes_ax):
        ax.set_xticks(list(xs), [f"{b / MIB:g} MiB" for b in sizes])
        ax.legend(fontsize=7, loc="upper left", ncol=2)
    fig.suptitle(f"{rows[0]['workers']} ranks: one switch vs 2 ToRs x 4 under a spine (uplinks: the larger ToR's), "
                 f"K = {rows[0]['k']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", default="100mbit", help="every link's rate (tc tbf), e.g. 1gbit")
    p.add_argument("--sizes-mib", type=float, nargs="+", default=[4, 16], help="tensor sizes (MiB)")
    p.add_argument("--reps", type=int, default=5, help="timed calls of each job per size")
    p.add_argument("--mtu", type=int, default=1500, help="every link's MTU; K follows it")
    p.add_argument("--min-window", type=int, help="the controller's min_window, the tree's window on every level "
                   "(default: leaf_spine.json's); the one-switch job's grows from it")
    p.add_argument("--sharing", choices=SHARING, help="the controller's sharing of a switch's slots (default: "
                   "leaf_spine.json's); static keeps the one-switch job at min_window, the tree's window")
    p.add_argument("--quick", action="store_true", help="4 MiB, one repetition")
    add_machine_arguments(p)
    add_output_arguments(p, "tree_bench", RESULTS)
    add_rank_arguments(p)
    p.add_argument("--turns", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.sizes_mib, args.reps = [4], 1
    if args.reps < 1 or not args.sizes_mib or min(args.sizes_mib) <= 0:
        p.error("--reps and every --sizes-mib must be positive")
    args.sizes = [int(s * MIB) // 4 * 4 for s in args.sizes_mib]
    rate_bits(args.rate)
    return args


def launch(args: argparse.Namespace) -> list[dict]:
    """The experiment's rows, once both jobs are known to be placed as compared."""
    results, load = run_experiment(args)
    check_placement(results)
    return summarize(results, load, args)


def main(argv: list[str] | None = None) -> int:
    return run_benchmark("tree_bench", parse_args(argv), rank_main, launch, FIELDS, report, plot)


if __name__ == "__main__":
    sys.exit(main())
