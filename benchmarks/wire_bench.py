"""inagg against gloo's ring where the links are the bottleneck: the Mininet emulation with every
host link shaped by ``tc tbf`` (100 Mbit/s by default, ``--rate 1gbit``), both going through the
same switch (the software data plane), N workers, tensors of 1-64 MiB.

The emulation (needs root and Mininet) brings up one switch, ``max(--workers)`` worker hosts
and the host aggregator's host, every host's link shaped in both directions (each end's egress),
at the links' MTU (``--mtu``; the switch's K follows it). Each worker count then runs as one
torch.distributed job of N rank processes on hosts h1..hN: the default group is the ``inagg``
backend with its path forced to the switch (``INAGG_ALLREDUCE_PATH=inagg``), a second group is
plain gloo (its ring over the same links, ``GLOO_SOCKET_IFNAME`` the switch-side interface), and
a third gloo group only holds the barrier before every call, and (``--auto``, the default) a
fourth is the ``inagg`` backend choosing its own path (``INAGG_ALLREDUCE_PATH=auto``, told the
links' rate by ``INAGG_LINK_RATE``: a second job at the controller). One untimed call on each path
at the first size; per size, ``--warmup`` untimed calls of the auto group (a training job's first
steps), then ``--reps`` repetitions of one call on each path, the order alternating (reversed in
odd repetitions), the float32 sums checked; a call's time is the slowest rank's.

Per (N, size): each path's median time, ``ratio`` (the median of the repetitions' inagg / gloo:
its calls run back to back, so load from other processes moves both alike), the auto group's
median over the better forced one's (``auto_vs_best``) and the paths its timed calls took
(``auto_paths``), and beside inagg's
time the framing limit, the time the tensor takes on one link at the rate when every frame
carries K values: bytes x frame bytes / value bytes / rate (the frame: Ethernet 14, IPv4 20,
UDP 8, inagg 16 + 4K bytes; twice that for two jobs sharing the links), and gloo's ideal ring
time, 2(N-1)/N of the tensor at the rate in full TCP segments of the MTU; the ranks'
retransmissions summed (``spurious``: those the aggregator answered twice, the round was only
late) and the frames the links' tbf queues dropped meanwhile (``link_drops``: the losses).
``--two-jobs N`` adds two jobs of N ranks on the same hosts (so on the same links), both
inagg-forced, released together once both aggregate on the switch (``settle``): each job's
median and the wall time of all its calls (``job_s``): a job held up by loss leaves the links to
the other, so its calls' median alone does not show the share.

Writes benchmarks/results/wire_bench.csv and wire_bench.png (time vs N for both paths per size,
the framing limit dashed: SwitchML's figure), prints the table and the machine's load.
``--collective reduce_scatter`` times reduce-scatters of the tensor instead (FSDP's gradient
collective: inagg's switch sends each rank only its shard's values, ``Communicator.reduce_scatter_async``;
gloo's ring moves (N-1)/N of the tensor each way, so its ideal is half its allreduce's, and a
rank's uplink still carries its whole tensor to the switch: inagg's framing limit is unchanged).
``--loss PCT`` drops that share of the frames at the switch's port of every host link, both
ways (the software data plane's ports: this kernel has no netem; ``loss_pct`` is what they
dropped, counted, not what was asked): ``benchmarks/fig_loss.py`` runs it per loss rate.

    sudo .venv/bin/python benchmarks/wire_bench.py [--rate 100mbit] [--workers 2 4 8]
        [--sizes-mib 1 4 16 64] [--reps 3] [--warmup 32] [--no-auto] [--mtu 1500] [--two-jobs 4] [--loss 0]
        [--collective allreduce|reduce_scatter] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

from emulation_ranks import (READY_SECONDS, RESULTS, STORE_PORT, add_machine_arguments,  # noqa: E402
                             add_output_arguments, add_rank_arguments, applied_loss_pct, finish_job, job_retransmissions,
                             join_job, link_drops, rate_bits, run_benchmark,
                             shaped_network, slowest_times, start_ranks, wait_line, write_deployment)
from plots import pyplot  # noqa: E402 - benchmarks/, the script's own folder

MIB = 1 << 20
PATHS = ("inagg", "gloo")
AUTO = "auto"     # the group whose backend chooses its own path
FIELDS = ("case", "collective", "rate", "mtu", "mode", "k", "workers", "bytes", "reps", "job_s", "inagg_s", "gloo_s", "ratio",
          "auto_s", "auto_vs_best", "auto_paths", "framing_limit_s", "inagg_vs_limit", "gloo_ideal_s", "ideal_ratio",
          "retransmissions", "spurious", "link_drops", "loss_pct", "switch_nice", "cpu_load", "load1")
ETH_IP_UDP_INAGG = 14 + 20 + 8 + 16    # bytes of a frame besides its K values
ETH_IP_TCP = 14 + 20 + 32              # a TCP segment's headers (timestamps on)


# -- rank side (one process in each worker's Mininet host) ------------------------------------

def timed_call(tensor, group, barrier, collective: str = "allreduce") -> float:
    """One allreduce (or reduce-scatter of ``tensor`` into this rank's shard) on ``group`` after
    a barrier on ``barrier``, its sum checked; seconds."""
    import torch.distributed as dist

    world = dist.get_world_size()
    tensor.fill_(1.0)
    out = tensor if collective == "allreduce" else tensor.new_empty(tensor.numel() // world)
    dist.barrier(group=barrier)
    t0 = time.perf_counter()
    if collective == "allreduce":
        dist.all_reduce(tensor, group=group)
    else:
        dist.reduce_scatter_tensor(out, tensor, group=group)
    seconds = time.perf_counter() - t0
    if out[0].item() != world or out[-1].item() != world:
        raise RuntimeError(f"{collective} summed to {out[0].item()}, not {world}")
    return seconds


def measure(groups: dict, barrier, args) -> list[list]:
    """[bytes, rep, path, seconds, path taken] of every timed call (this rank's clock): one
    untimed call on each path at the first size, then per size the auto group's warm-up and the
    repetitions, the paths' order alternating."""
    import torch

    calls = []
    for i, nbytes in enumerate(args.sizes):
        x = torch.empty(nbytes // 4, dtype=torch.float32)
        for path in groups if i == 0 else ():
            timed_call(x, groups[path], barrier, args.collective)
        for _ in range(args.warmup if AUTO in groups else 0):
            timed_call(x, groups[AUTO], barrier, args.collective)
        for rep in range(args.reps):
            order = list(groups) if rep % 2 == 0 else list(reversed(groups))
            calls += [[nbytes, rep, path, timed_call(x, groups[path], barrier, args.collective),
                       taken(groups[path], path)] for path in order]
    return calls


def taken(group, path: str) -> str:
    """The path the last call on ``group`` took: the auto group's choice, else ``path``."""
    return group.path_history()[-1]["path"] if path == AUTO else path


def auto_group():
    """A group of the ``inagg`` backend that chooses its own path (a second job at the
    controller, beside the forced one)."""
    import torch.distributed as dist

    from inagg.hostlib.pytorch.lifecycle import PATH_ENV

    forced, os.environ[PATH_ENV] = os.environ.get(PATH_ENV), "auto"
    try:
        return dist.new_group(backend="inagg")
    finally:
        os.environ[PATH_ENV] = forced or "auto"


def settle(pg, barrier, go_file: str, timeout: float = READY_SECONDS) -> None:
    """One-element calls on ``pg`` until both sharing jobs aggregate on the switch: the job that
    registered second starts on the host aggregator and moves to the switch only once the first
    gave up half its slots, each at a call boundary of its own (make-before-break,
    ``inagg.controller.allocator``), so both keep calling until the placement files that each
    job's rank 0 writes beside ``go_file`` say switch. The sharing is then measured on the
    links alone, not on the jobs' placement."""
    import torch
    import torch.distributed as dist

    mine = Path(f"{go_file}.{os.environ['TORCHELASTIC_RUN_ID']}")
    deadline = time.time() + timeout
    while True:
        dist.all_reduce(torch.zeros(1), group=pg)
        placed = torch.zeros(1)
        if dist.get_rank() == 0:
            mine.write_text(pg.lifecycle.comm.grant.mode)
            modes = [f.read_text() for f in mine.parent.glob(f"{Path(go_file).name}.*")]
            placed[0] = modes == ["switch", "switch"]
        dist.broadcast(placed, 0, group=barrier)
        if placed.item():
            return
        if time.time() > deadline:
            raise RuntimeError(f"the two sharing jobs were not both on the switch within {timeout:.0f}s")
        time.sleep(0.05)


def settle_auto(pg, auto, barrier, timeout: float = READY_SECONDS) -> None:
    """One-element calls on the forced group and the auto group until the auto group's job
    aggregates on the switch too: it registered second, so it starts on the host aggregator
    and is offered the switch once the forced job gave up half its slots at a call of its own;
    its path choice takes the offer at its next agreement (``inagg.hostlib.pytorch.path.links.GrantMove``).
    The choice is then measured against the forced path on the same switch, not on where the
    controller placed it."""
    import torch
    import torch.distributed as dist

    deadline, one = time.time() + timeout, torch.zeros(1)
    while True:
        dist.all_reduce(one, group=pg)
        dist.all_reduce(one, group=auto)
        placed = torch.tensor([float(auto.lifecycle.comm.grant.mode == "switch")])
        dist.all_reduce(placed, op=dist.ReduceOp.MIN, group=barrier)
        if placed.item():
            return
        if time.time() > deadline:
            raise RuntimeError(f"the auto group's job was not on the switch within {timeout:.0f}s")


def wait_go(go_file: str | None, barrier) -> None:
    """Rank 0 says it is ready and waits for the launcher's go file (two jobs start together);
    the other ranks wait for rank 0 at the barrier."""
    import torch.distributed as dist

    if go_file:
        if dist.get_rank() == 0:
            print(json.dumps({"ready": time.time()}), flush=True)
            while not Path(go_file).exists():
                time.sleep(0.05)
        dist.barrier(group=barrier)


def rank_main(args: argparse.Namespace) -> int:
    """One rank of one job: the groups, the calls, and (rank 0) the slowest rank's time of every
    call, the grant's K and the job's retransmissions written to ``--out``."""
    import torch.distributed as dist

    pg, barrier = join_job(args)
    groups = {"inagg": pg, "gloo": dist.new_group(backend="gloo")}
    if AUTO in args.paths:
        groups[AUTO] = auto_group()
    groups = {p: groups[p] for p in args.paths}
    if AUTO in groups:
        settle_auto(pg, groups[AUTO], barrier)
    if args.go_file:
        settle(pg, barrier, args.go_file)
    wait_go(args.go_file, barrier)
    started = time.perf_counter()
    calls = measure(groups, barrier, args)
    job_seconds = time.perf_counter() - started
    slowest, (retx, spurious) = slowest_times([c[3] for c in calls], barrier), job_retransmissions(pg, barrier)
    if args.rank == 0:
        for c, t in zip(calls, slowest):
            c[3] = t
        auto = groups.get(AUTO)
        history = [[h["path"], h["calls"], h["bytes"]] for h in auto.path_history()] if auto else []
        auto_stats = auto.stats() if auto else {"path_model": None, "inagg": {}}
        Path(args.out).write_text(json.dumps({"calls": calls, "job_s": job_seconds, "k": pg.lifecycle.comm.grant.values_per_packet,
                                              "mode": pg.lifecycle.comm.grant.mode, "retransmissions": retx,
                                              "spurious": spurious,
                                              "auto_history": history,
                                              "auto_model": auto_stats["path_model"],
                                              "auto_grants": auto_stats["inagg"].get("grants"),
                                              "inagg_stats": pg.lifecycle.comm.stats()}, default=str))
    dist.barrier(group=barrier)
    dist.destroy_process_group()
    return 0


# -- launcher side (root namespace) -----------------------------------------------------------

def topology(n_hosts: int, mtu: int, loss: float = 0.0):
    """One switch, worker hosts h1..h<n_hosts> on ports 1..n and the host aggregator's host,
    every link at ``mtu``, ``loss`` percent of the frames dropped at its switch port both ways."""
    from inagg.bmv2_env.emulation.topology import parse_topology

    hosts = {f"h{i}": {"ip": f"10.0.0.{i}/24", "mac": f"08:00:00:00:00:{i:02x}"} for i in range(1, n_hosts + 1)}
    hosts["agg"] = {"ip": "10.0.0.100/24", "mac": "08:00:00:00:00:64"}
    links = [[h, f"s1-p{i}", *([{"loss": loss}] if loss else [])] for i, h in enumerate(hosts, 1)]
    return parse_topology({
        "hosts": hosts, "links": links, "aggregator": "agg", "mtu": mtu,
        "switches": {"s1": {"aggregator_ip": "10.0.0.254", "aggregator_mac": "00:00:00:00:00:fe"}},
        "jobs": [{"name": "wire", "workers": [h for h in hosts if h != "agg"]}]}, "wire_bench")


def start_job(run, args, n: int, name: str, paths: tuple[str, ...], go_file: Path | None, port: int):
    """N rank processes of one job on h1..hN (its store on rank 0's ``port``); returns them and
    where rank 0 writes its result."""
    from inagg.hostlib.pytorch.path.links import LINK_RATE_ENV

    extra = ["--sizes-mib", *map(str, args.sizes_mib), "--reps", str(args.reps), "--warmup", str(args.warmup),
             "--paths", *paths, "--collective", args.collective, *(["--go-file", str(go_file)] if go_file else [])]
    procs = start_ranks(run, Path(__file__).resolve(), name, [f"h{rank + 1}" for rank in range(n)], port, extra,
                        {LINK_RATE_ENV: args.rate})
    return procs, run.run.path / f"{name}.json"


def expected_seconds(args, n: int, paths: tuple[str, ...], share: int = 1) -> float:
    """The calls' time for one job of ``n`` ranks at the framing limit and gloo's ideal (a K of
    64, the smallest a target grants, so never under; the auto group's calls at the slower of
    the two), ``share`` jobs on each link."""
    per_call = {"inagg": lambda b: framing_limit(b, 64, args.rate),
                "gloo": lambda b: gloo_ideal(b, n, args.mtu, args.rate)}
    per_call[AUTO] = lambda b: max(per_call["inagg"](b), per_call["gloo"](b))
    first = sum(per_call[p](args.sizes[0]) for p in paths)
    warmup = args.warmup * sum(per_call[AUTO](b) for b in args.sizes) if AUTO in paths else 0.0
    return share * (first + warmup + args.reps * sum(per_call[p](b) for b in args.sizes for p in paths))


def run_counts(run, args) -> list[dict]:
    """One job per worker count, each after the last; every job's result with its N."""
    results, paths = [], PATHS + ((AUTO,) if args.auto else ())
    for n in args.workers:
        print(f"N = {n}: about {expected_seconds(args, n, paths):.1f} s of calls at the links' rate", flush=True)
        drops = link_drops(run.net.links)
        procs, out = start_job(run, args, n, f"wire{n}", paths, None, STORE_PORT + n)
        result = finish_job(procs, out, READY_SECONDS + 3 * expected_seconds(args, n, paths))
        results.append({"case": "single", "workers": n, **result, "link_drops": link_drops(run.net.links) - drops})
    return results


def run_two_jobs(run, args) -> list[dict]:
    """Two inagg-forced jobs of ``--two-jobs`` ranks on the same hosts, released together."""
    n, go = args.two_jobs, run.run.path / "go"
    jobs = [start_job(run, args, n, name, ("inagg",), go, STORE_PORT + 100 + i)
            for i, name in enumerate(("shareA", "shareB"))]
    for procs, _ in jobs:
        wait_line(procs[0], procs, READY_SECONDS, run.run.path / "logs")
    drops = link_drops(run.net.links)
    go.touch()
    timeout = READY_SECONDS + 3 * expected_seconds(args, n, ("inagg",), share=2)
    results = [{"case": f"shared{i}", "workers": n, **finish_job(procs, out, timeout)}
               for i, (procs, out) in enumerate(jobs, 1)]
    return [{**r, "link_drops": link_drops(run.net.links) - drops} for r in results]


def run_experiment(args) -> list[dict]:
    """Bring up the network with every link shaped, run the jobs, tear down."""
    from inagg.bmv2_env.emulation.topology import host_ip

    topo = topology(max(args.workers + [args.two_jobs or 0]), args.mtu, args.loss)
    title = f"wire bench: {len(topo.hosts) - 1} worker hosts at {args.rate}, MTU {args.mtu}, loss {args.loss:g} %"
    with shaped_network(topo, args.rate, title, args.switch_nice, args.cpu_load,
                        args.rank_lease_seconds) as run:
        write_deployment(run, [host_ip(h) for name, h in topo.hosts.items() if name != "agg"])
        results = run_counts(run, args)
        if args.two_jobs:
            results += run_two_jobs(run, args)
        loss = applied_loss_pct(run) if args.loss else 0.0
    return [{**r, "loss_pct": loss} for r in results]


# -- what the run shows -----------------------------------------------------------------------

def framing_limit(nbytes: int, k: int, rate: str) -> float:
    """Seconds a tensor of ``nbytes`` takes on a link of ``rate`` in frames of K values."""
    return nbytes * (ETH_IP_UDP_INAGG + 4 * k) / (4 * k) * 8 / rate_bits(rate)


def gloo_ideal(nbytes: int, n: int, mtu: int, rate: str) -> float:
    """Seconds of a ring allreduce's traffic per link direction, 2(N-1)/N of the tensor, in full
    TCP segments of ``mtu`` bytes."""
    mss = mtu - ETH_IP_TCP + 14
    return 2 * (n - 1) / n * nbytes * (mtu + 14) / mss * 8 / rate_bits(rate)


def auto_figures(mine: list[list], forced_best: float | None) -> dict:
    """The auto group's columns from one size's calls: its median, over the better forced
    path's (``forced_best``), and the paths its timed calls took (``inagg:3``)."""
    auto = [c for c in mine if c[2] == AUTO]
    if not auto:
        return {"auto_s": None, "auto_vs_best": None, "auto_paths": ""}
    median = statistics.median(c[3] for c in auto)
    took = Counter(c[4] for c in auto)
    return {"auto_s": round(median, 4), "auto_vs_best": forced_best and round(median / forced_best, 3),
            "auto_paths": " ".join(f"{p}:{n}" for p, n in sorted(took.items()))}


def summarize(result: dict, args, load: float) -> list[dict]:
    """One CSV row per size of one job: medians, ratio, the auto group's, framing limit,
    gloo's ideal."""
    n, k, rows = result["workers"], result["k"], []
    for nbytes in args.sizes:
        mine = [c for c in result["calls"] if c[0] == nbytes]
        by_path = {p: [c[3] for c in mine if c[2] == p] for p in PATHS}
        inagg = statistics.median(by_path["inagg"])
        limit = framing_limit(nbytes, k, args.rate) * (2 if result["case"].startswith("shared") else 1)
        gloo = statistics.median(by_path["gloo"]) if by_path["gloo"] else None
        ratios = [i / g for i, g in zip(by_path["inagg"], by_path["gloo"])]
        ring = 1 if args.collective == "allreduce" else 2   # a ring reduce-scatter: half the allreduce
        rows.append({"case": result["case"], "collective": args.collective, "rate": args.rate, "mtu": args.mtu, "mode": result["mode"], "k": k,
                     "workers": n, "job_s": round(result["job_s"], 3),
                     "bytes": nbytes, "reps": len(by_path["inagg"]), "inagg_s": round(inagg, 4),
                     "gloo_s": gloo and round(gloo, 4),
                     "ratio": round(statistics.median(ratios), 3) if ratios else None,
                     **auto_figures(mine, gloo and min(inagg, gloo)),
                     "framing_limit_s": round(limit, 4), "inagg_vs_limit": round(inagg / limit, 3),
                     "gloo_ideal_s": round(gloo_ideal(nbytes, n, args.mtu, args.rate) / ring, 4),
                     "ideal_ratio": round(ring * n / (2 * (n - 1)), 3),
                     "retransmissions": result["retransmissions"], "spurious": result["spurious"],
                     "link_drops": result["link_drops"], "loss_pct": result["loss_pct"], "switch_nice": args.switch_nice, "cpu_load": args.cpu_load,
                     "load1": round(load, 2)})
    return rows


def report(rows: list[dict]) -> None:
    """The table, the two-jobs fairness and the load."""
    print(f"\n{'case':<8} {'N':>2} {'MiB':>4} {'K':>5} {'inagg s':>8} {'gloo s':>8} {'ratio':>6} {'ideal':>6} "
          f"{'limit s':>8} {'/limit':>7} {'retx':>5} {'drops':>5} {'auto/best':>9}  auto took")
    for r in rows:
        gloo, ratio, auto = (f"{r[key]:{width}.{digits}f}" if r[key] is not None else f"{'-':>{width}}"
                             for key, width, digits in (("gloo_s", 8, 3), ("ratio", 6, 2), ("auto_vs_best", 9, 3)))
        print(f"{r['case']:<8} {r['workers']:>2} {r['bytes'] / MIB:>4.0f} {r['k']:>5} {r['inagg_s']:8.3f} {gloo} "
              f"{ratio} {r['ideal_ratio']:6.2f} {r['framing_limit_s']:8.3f} {r['inagg_vs_limit']:7.3f} "
              f"{r['retransmissions']:>5} {r['link_drops']:>5} {auto}  {r['auto_paths']}")
    shared = {r["case"]: r for r in rows if r["case"].startswith("shared")}   # one job's calls: its time
    if shared:
        a, b = (r["job_s"] for r in shared.values())
        retx = " and ".join(f"{r['retransmissions']} ({r['spurious']} spurious)" for r in shared.values())
        print(f"two jobs sharing the links: all their calls in {a:.2f} s and {b:.2f} s ({max(a, b) / min(a, b):.2f}x "
              f"apart), retransmissions {retx}, frames the links dropped {next(iter(shared.values()))['link_drops']}")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")


def plot(rows: list[dict], path: Path) -> bool:
    """Time vs N per size: inagg, gloo, the framing limit (dashed) and gloo's ideal (dotted)."""
    plt = pyplot()
    if plt is None:
        return False
    single = [r for r in rows if r["case"] == "single"]
    sizes = sorted({r["bytes"] for r in single})
    fig, axes = plt.subplots(1, len(sizes), figsize=(3.6 * len(sizes), 3.6), squeeze=False)
    for ax, nbytes in zip(axes[0], sizes):
        mine = sorted((r for r in single if r["bytes"] == nbytes), key=lambda r: r["workers"])
        ns = [r["workers"] for r in mine]
        for key, style, label in (("inagg_s", "o-", "inagg (switch)"), ("gloo_s", "s-", "gloo ring"),
                                  ("framing_limit_s", "k--", "framing limit"), ("gloo_ideal_s", "k:", "ring ideal")):
            ax.plot(ns, [r[key] for r in mine], style, label=label, markersize=4)
        ax.set_title(f"{nbytes / MIB:.0f} MiB, K = {mine[0]['k']}")
        ax.set_xlabel("workers")
        ax.set_xticks(ns)
        ax.set_ylim(bottom=0)
    axes[0][0].set_ylabel(f"allreduce time (s), links {single[0]['rate']}")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", default="100mbit", help="every host link's rate (tc tbf), e.g. 1gbit")
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8], help="worker counts, one job each")
    p.add_argument("--sizes-mib", type=float, nargs="+", default=[1, 4, 16, 64], help="tensor sizes (MiB)")
    p.add_argument("--reps", type=int, default=3, help="timed calls of each path per size")
    p.add_argument("--auto", action=argparse.BooleanOptionalAction, default=True,
                   help="a group whose backend chooses its own path, against the better forced one")
    p.add_argument("--warmup", type=int, default=32,
                   help="the auto group's untimed calls per size first (a new size's probes and rechecks take ~20)")
    p.add_argument("--mtu", type=int, default=1500, help="every link's MTU (9000: jumbo frames); K follows it")
    p.add_argument("--two-jobs", type=int, default=4, metavar="N",
                   help="ranks of each of two jobs sharing the links (0: no such case)")
    p.add_argument("--loss", type=float, default=0.0, metavar="PCT",
                   help="percent of the frames every host link's switch port drops, both ways")
    p.add_argument("--collective", choices=("allreduce", "reduce_scatter"), default="allreduce",
                   help="the timed collective (reduce_scatter: of the tensor into each rank's shard)")
    p.add_argument("--quick", action="store_true", help="N = 2 and 4, 4 MiB, one repetition, no two-jobs case")
    add_machine_arguments(p)
    add_output_arguments(p, "wire_bench", RESULTS)
    # rank mode (the launcher starts these in the Mininet hosts)
    add_rank_arguments(p)
    p.add_argument("--go-file", help=argparse.SUPPRESS)
    p.add_argument("--paths", nargs="+", default=list(PATHS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.workers, args.sizes_mib, args.reps, args.two_jobs = [2, 4], [4], 1, 0
    args.sizes = [int(s * MIB) // 4 * 4 for s in args.sizes_mib]
    rate_bits(args.rate)
    if not 0 <= args.loss <= 100:
        p.error(f"--loss {args.loss:g}: a percentage in 0..100, e.g. 0.1")
    return args


def launch(args: argparse.Namespace) -> list[dict]:
    """The experiment's rows, with the load average at its end."""
    results = run_experiment(args)
    load = os.getloadavg()[0]
    return [row for result in results for row in summarize(result, args, load)]


def main(argv: list[str] | None = None) -> int:
    return run_benchmark("wire_bench", parse_args(argv), rank_main, launch, FIELDS, report, plot)


if __name__ == "__main__":
    sys.exit(main())
