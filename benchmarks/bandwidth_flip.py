"""The ``inagg`` backend's per-call path choice under a bandwidth change: a link's rate is cut
mid-run and restored, and the choice between inagg and gloo follows.

The emulation (``inagg.bmv2_env.emulation.mininet_run``, needs root and Mininet) brings up
``bmv2_env/emulation/topologies/bandwidth_flip.json``: three workers on one switch (the software data
plane, or BMv2) and the host aggregator. This script adds a management network, a Linux bridge
in a Mininet node of its own, with a second interface on every worker: the workers' gloo traffic
(``GLOO_SOCKET_IFNAME``) and the TCP store run on it, inagg's data plane traffic runs through the
switch. So the two paths use different links, and one worker's management link (both ends) is
the link that only gloo uses. With ``--data-rate`` every switch-side link is shaped too for the
whole run, so each path has a bottleneck link of its own and which path wins does not hinge on
how fast a bare veth and the machine's two cores happen to be.

The workers (one process per worker host) ``init_process_group("inagg")`` against the run's
controller and loop DDP-like steps: each step allreduces a gradient of ``--sizes`` tensors
(float32 SUM, the values checked) and ends with a one-element broadcast from rank 0 that says
whether to go on (a step boundary every rank agrees on). Per call, the path taken is read from
the process group's per-path call counters (``stats()["allreduce_paths"]``).

The launcher waits ``--phases`` seconds unthrottled, then throttles the link with ``tc tbf``
(``--rate``) for the second phase, restores it for the third, and stops the workers. Per step
(rank 0's clock): wall time, step seconds, each tensor's path, the link's rate. Writes
benchmarks/results/bandwidth_flip.csv and .png (step time with the throttle interval shaded;
the largest tensor's path), prints the flip times, each phase's median step time and path
shares, and the machine's load; exits 1 unless the largest tensor's path flipped away from the
unthrottled path while throttled and back after the restore.

    sudo .venv/bin/python benchmarks/bandwidth_flip.py [--phases 20 40 35] [--rate 20mbit] [--sizes 262144 65536 4]
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

from emulation_ranks import (READY_SECONDS, STORE_PORT, exit_now, launcher_can_run, node_sh,  # noqa: E402
                             shape_link, start_rank, wait_line, write_csv, write_deployment)
from plots import pyplot  # noqa: E402 - benchmarks/, the script's own folder

RESULTS = Path(__file__).resolve().parent / "results"
TOPOLOGY = ROOT / "bmv2_env" / "emulation" / "topologies" / "bandwidth_flip.json"
FIELDS = ("step", "time_s", "step_s", "rate", "phase", "paths")
PHASES = ("before", "throttled", "restored")


# -- worker side (one process in each worker's Mininet host) ----------------------------------

def _path_of_call(pg, tensor) -> str:
    """Allreduce ``tensor`` (SUM) and return the path the backend took, read from its counters."""
    import torch.distributed as dist

    before = dict(pg.dispatch.allreduces)         # stats()["allreduce_paths"], without the rest of stats()
    dist.all_reduce(tensor)
    after = pg.dispatch.allreduces
    taken = [p for p, n in after.items() if n != before.get(p, 0)]
    if len(taken) != 1:
        raise RuntimeError(f"one allreduce moved the path counters {before} -> {after}")
    return taken[0]


def worker(args: argparse.Namespace) -> int:
    """One rank: DDP-like steps until rank 0 says stop (the launcher's stop file, or
    ``--max-seconds``); rank 0 writes every step's record to ``--out``."""
    import torch
    import torch.distributed as dist

    import inagg.hostlib.pytorch.plugin  # noqa: F401 - registers "inagg" where entry points are off

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    torch.set_num_threads(1)
    dist.init_process_group("inagg", rank=args.rank, world_size=args.world,
                            init_method=f"tcp://{args.master}:{STORE_PORT}",
                            timeout=timedelta(seconds=120))
    pg = dist.group.WORLD
    pg.ready()   # its paths start in the background: up before the first timed step
    grads = [torch.empty(n // 4, dtype=torch.float32) for n in args.sizes]
    go_on = torch.zeros(1, dtype=torch.int32)
    stop_file = Path(args.stop_file)
    records, started = [], time.time()
    while True:
        t0 = time.perf_counter()
        paths = []
        for g in grads:
            g.fill_(1.0)                            # a fresh gradient every step
            paths.append(_path_of_call(pg, g))
            if g[0].item() != args.world or g[-1].item() != args.world:
                raise RuntimeError(f"rank {args.rank}: allreduce on {paths[-1]} summed to {g[0].item()}")
        if args.rank == 0:
            go_on[0] = int(not stop_file.exists() and time.time() - started < args.max_seconds)
        dist.broadcast(go_on, 0)
        records.append((time.time(), time.perf_counter() - t0, paths))
        if len(records) == args.warmup and args.rank == 0:
            print(json.dumps({"ready": time.time()}), flush=True)
        if not go_on[0]:
            break
    if args.rank == 0:
        Path(args.out).write_text(json.dumps({"records": records[args.warmup:], "stats": pg.stats()}))
    dist.barrier()
    dist.destroy_process_group()
    return 0


# -- launcher side (root namespace) -----------------------------------------------------------

class ManagementNetwork:
    """A Linux bridge in a Mininet node of its own and a link from each worker to it: the
    network gloo runs on. Everything lives in namespaces Mininet made for this run (the node's
    and the workers'), so its names cannot clash with another run's."""

    def __init__(self, net, run_dir, workers: list[str], subnet: ipaddress.IPv4Network) -> None:
        name = "mgmt"
        while name in net.nameToNode:
            name += "x"
        self.node = net.addHost(name, ip=None)
        run_dir.add_process(self.node.pid, f"management bridge node {name}")
        node_sh(self.node, "ip link add br0 type bridge && ip link set br0 up")
        self.ips: dict[str, str] = {}
        self.links: dict[str, object] = {}
        for host_name, address in zip(workers, subnet.hosts()):
            host = net.get(host_name)
            link = net.addLink(host, self.node)
            node_sh(self.node, f"ip link set {link.intf2.name} master br0 && ip link set {link.intf2.name} up")
            node_sh(host, f"ip addr add {address}/{subnet.prefixlen} dev {link.intf1.name} && "
                      f"ip link set {link.intf1.name} up")
            self.ips[host_name] = str(address)
            self.links[host_name] = link

    def interface(self, host: str) -> str:
        """The worker's own end of its management link (its GLOO_SOCKET_IFNAME)."""
        return self.links[host].intf1.name

    def set_rate(self, host: str, rate: str | None) -> None:
        """Throttle both directions of ``host``'s management link to ``rate`` (tc tbf on each
        end's egress), or restore it (None)."""
        shape_link(self.links[host], rate)


def start_workers(run, mgmt: ManagementNetwork, workers: list[str], args) -> list:
    """One worker process per host, rank order as in the topology's job; their inagg address is
    each host's switch-side IP, their gloo interface the management link."""
    from inagg.bmv2_env.emulation.topology import host_ip

    write_deployment(run, [host_ip(run.topo.hosts[h]) for h in workers])
    procs = []
    for rank, host_name in enumerate(workers):
        argv = [str(Path(__file__).resolve()), "--worker", "--rank", str(rank),
                "--world", str(len(workers)), "--master", mgmt.ips[workers[0]],
                "--sizes", *map(str, args.sizes), "--warmup", str(args.warmup),
                *(["--verbose"] if args.verbose else []), "--stop-file", str(run.run.path / "stop"),
                "--out", str(run.run.path / "steps.json"), "--max-seconds", str(sum(args.phases) + READY_SECONDS)]
        procs.append(start_rank(run, host_name, argv, {"GLOO_SOCKET_IFNAME": mgmt.interface(host_name)},
                                f"worker-{host_name}"))
    return procs


def check_setup(topo, args) -> tuple[list[str], str]:
    """The ranks' hosts (the topology's first job) and the host whose link is throttled; exits
    with a message on a setting the run cannot use."""
    workers = topo.jobs[0]["workers"]
    throttled = args.throttle_host or workers[0]
    if throttled not in workers:
        raise SystemExit(f"--throttle-host {throttled}: not one of the job's workers {workers}")
    if args.mgmt_subnet.num_addresses - 2 < len(workers):
        raise SystemExit(f"--mgmt-subnet {args.mgmt_subnet}: too small for {len(workers)} workers")
    for name, host in topo.hosts.items():
        own = ipaddress.ip_interface(host["ip"]).network
        if args.mgmt_subnet.overlaps(own):
            raise SystemExit(f"--mgmt-subnet {args.mgmt_subnet} overlaps {name}'s network {own} in {args.topo}")
    return workers, throttled


def run_phases(mgmt: ManagementNetwork, throttled: str, args, stop_file: Path, procs: list) -> dict[str, float]:
    """Unthrottled, throttled, restored (``--phases`` seconds each), then stop the workers.
    Returns when each began (time.time())."""
    events = {"start": wait_line(procs[0], procs, READY_SECONDS, stop_file.parent / "logs")["ready"]}
    time.sleep(args.phases[0])
    mgmt.set_rate(throttled, args.rate)
    events["throttle"] = time.time()
    print(f"{throttled}'s management link throttled to {args.rate}", flush=True)
    time.sleep(args.phases[1])
    mgmt.set_rate(throttled, None)
    events["restore"] = time.time()
    print(f"{throttled}'s management link restored", flush=True)
    time.sleep(args.phases[2])
    stop_file.touch()
    for p in procs:
        p.wait(60)
    events["end"] = time.time()
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError(f"workers exited with {[p.returncode for p in procs]}; see {stop_file.parent}/logs")
    return events


def run_experiment(args) -> tuple[list[dict], dict, dict]:
    """Bring up the emulation, run the three phases, tear down. Returns the step rows, the
    phase times (seconds from the first recorded step) and rank 0's final backend stats."""
    from inagg.bmv2_env.emulation.mininet_run import Run, choose_dataplane, program_files_for
    from inagg.bmv2_env.emulation.run_dir import RunDir
    from inagg.bmv2_env.emulation.topology import load_topology

    topo = load_topology(args.topo)
    workers, throttled = check_setup(topo, args)
    dataplane = choose_dataplane(args.dataplane)
    run_dir = RunDir.create()
    print(f"bandwidth flip: {args.topo.name}, data plane {dataplane}, run {run_dir.run_id} in {run_dir.path}",
          flush=True)
    run = Run(topo, dataplane, run_dir, program_files=program_files_for(dataplane), pcaps=args.pcaps)
    try:
        run.build()
        if args.data_rate:
            for link in run.net.links:      # the switch-side links only: gloo's come next
                shape_link(link, args.data_rate)
        run.start_services()
        mgmt = ManagementNetwork(run.net, run_dir, workers, args.mgmt_subnet)
        procs = start_workers(run, mgmt, workers, args)
        events = run_phases(mgmt, throttled, args, run_dir.path / "stop", procs)
        result = json.loads((run_dir.path / "steps.json").read_text())
    finally:
        run.teardown()      # stops the workers too (run.procs)
    rows = []
    for i, (t, seconds, paths) in enumerate(result["records"]):
        phase = "before" if t < events["throttle"] else "throttled" if t < events["restore"] else "restored"
        rows.append({"step": i, "time_s": round(t - events["start"], 4), "step_s": round(seconds, 6),
                     "rate": args.rate if phase == "throttled" else "unthrottled", "phase": phase,
                     "paths": "/".join(paths)})
    return rows, {k: v - events["start"] for k, v in events.items()}, result["stats"]


# -- what the run shows -----------------------------------------------------------------------

def main_path(row: dict) -> str:
    """The path of the step's first (largest, by convention of --sizes) tensor."""
    return row["paths"].split("/")[0]


def flips(rows: list[dict], steady: int = 3) -> list[tuple[float, str, str]]:
    """(time, from, to) where the largest tensor's path changed and held for ``steady`` steps
    (an exploration is a one-call excursion, not a flip); the first path to hold is the start."""
    out, current = [], None
    for i, row in enumerate(rows):
        path = main_path(row)
        if path != current and all(main_path(r) == path for r in rows[i:i + steady]):
            if current is not None:
                out.append((row["time_s"], current, path))
            current = path
    return out


def phase_summary(rows: list[dict]) -> dict[str, dict]:
    """Per phase: steps, median step seconds, and per path of the largest tensor the share of
    steps and their median step seconds."""
    out = {}
    for phase in PHASES:
        mine = [r for r in rows if r["phase"] == phase]
        if mine:
            by_path: dict[str, list[float]] = {}
            for r in mine:
                by_path.setdefault(main_path(r), []).append(r["step_s"])
            out[phase] = {"steps": len(mine), "median_step_s": statistics.median(r["step_s"] for r in mine),
                          "paths": {p: len(v) / len(mine) for p, v in sorted(by_path.items())},
                          "median_step_s_by_path": {p: statistics.median(v) for p, v in sorted(by_path.items())}}
    return out


def check_flipped(rows: list[dict], events: dict) -> str:
    """'' when the path left the unthrottled one (the most taken before the throttle) while
    throttled and came back to it after the restore; else what did not happen."""
    before = phase_summary(rows).get("before")
    if before is None:
        return "no step before the throttle"
    first = max(before["paths"], key=before["paths"].__getitem__)
    found = flips(rows)
    away = [f for f in found if events["throttle"] <= f[0] < events["restore"] and f[1] == first]
    if not away:
        return f"the path stayed {first} while throttled"
    back = [f for f in found if f[0] >= events["restore"] and f[2] == first]
    if not back:
        return f"the path did not return to {first} after the restore"
    return ""


def plot(rows: list[dict], events: dict, sizes: list[int], rate: str, path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    fig, (ax_t, ax_p) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True,
                                     gridspec_kw={"height_ratios": [3, 1]})
    t = [r["time_s"] for r in rows]
    for ax in (ax_t, ax_p):
        ax.axvspan(events["throttle"], events["restore"], color="orange", alpha=0.25,
                   label=f"gloo's link throttled to {rate}")
    ax_t.plot(t, [r["step_s"] * 1e3 for r in rows], linewidth=0.8, marker=".", markersize=2)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("step time (ms)")
    ax_t.set_title(f"inagg backend: allreduces of {', '.join(map(str, sizes))} B per step, "
                   f"path chosen per call")
    ax_t.legend(loc="upper left")
    paths = sorted({main_path(r) for r in rows})
    ax_p.scatter(t, [paths.index(main_path(r)) for r in rows], s=4)
    ax_p.set_yticks(range(len(paths)), paths)
    ax_p.set_ylim(-0.5, len(paths) - 0.5)
    ax_p.set_ylabel(f"path ({sizes[0]} B)")
    ax_p.set_xlabel("time since the first timed step (s)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def when(t: float, events: dict) -> str:
    """``t`` relative to the last link change before it."""
    for event in ("restore", "throttle"):
        if t >= events[event]:
            return f"{t - events[event]:.1f} s after the {event}"
    return "before the throttle"


def report(rows: list[dict], events: dict, stats: dict) -> str:
    """Print the flips, each phase's figures and the load; return check_flipped's verdict."""
    print(f"throttle at {events['throttle']:.1f} s, restore at {events['restore']:.1f} s, "
          f"end at {events['end']:.1f} s ({len(rows)} steps)")
    for t, a, b in flips(rows):
        print(f"flip at {t:.1f} s: {a} -> {b} ({when(t, events)})")
    for phase, s in phase_summary(rows).items():
        shares = ", ".join(f"{p} {100 * f:.0f} % ({s['median_step_s_by_path'][p] * 1e3:.1f} ms)"
                           for p, f in s["paths"].items())
        print(f"{phase:>9}: {s['steps']} steps, median step {s['median_step_s'] * 1e3:.1f} ms; "
              f"largest tensor's steps on {shares}")
    model = stats["path_model"]
    print(f"backend (rank 0): calls by path {stats['allreduce_paths']}, {model['agreements']} agreements, "
          f"{model['explorations']} explorations, {model.get('probes', 0)} probes")
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    verdict = check_flipped(rows, events)
    print("flipped away and back: yes" if not verdict else f"NOT FLIPPED: {verdict}")
    return verdict


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topo", type=Path, default=TOPOLOGY, help="its first job's workers are the ranks")
    p.add_argument("--dataplane", choices=["soft", "bmv2", "auto"], default="soft")
    p.add_argument("--sizes", type=int, nargs="+", default=[256 << 10, 64 << 10, 4],
                   help="bytes of each tensor allreduced per step, largest first (float32)")
    p.add_argument("--phases", type=float, nargs=3, default=[20.0, 40.0, 35.0],
                   metavar=("BEFORE", "THROTTLED", "RESTORED"), help="seconds of each phase")
    p.add_argument("--rate", default="20mbit", help="tc tbf rate of the throttled link")
    p.add_argument("--data-rate", help="tc tbf rate of every switch-side (inagg) link for the whole run; "
                   "unset, those links run at veth speed")
    p.add_argument("--throttle-host", help="whose management link to throttle (default: rank 0's)")
    p.add_argument("--mgmt-subnet", type=ipaddress.IPv4Network, default=ipaddress.IPv4Network("192.168.77.0/24"),
                   help="the management network (it exists inside the run's namespaces only)")
    p.add_argument("--warmup", type=int, default=200,
                   help="steps before the first phase (the path models settle), not recorded")
    p.add_argument("--pcaps", action="store_true",
                   help="keep the switch's per-port pcaps in the run directory (2-7 GB for the default phases)")
    p.add_argument("--verbose", action="store_true",
                   help="the workers' logs (build/emulation/<run>/logs/worker-*.log) at DEBUG, not INFO")
    p.add_argument("--name", default="bandwidth_flip", help="results file names (CSV, PNG)")
    p.add_argument("--results", type=Path, default=RESULTS, help="where the CSV and PNG go")
    p.add_argument("--json", type=Path, help="also write the steps, events and verdict here")
    # worker mode (the launcher starts these in the Mininet hosts)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for flag, kind in (("--rank", int), ("--world", int), ("--master", str), ("--stop-file", str),
                       ("--out", str), ("--max-seconds", float)):
        p.add_argument(flag, type=kind, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.sizes != sorted(args.sizes, reverse=True) or min(args.sizes) < 4 or any(n % 4 for n in args.sizes):
        p.error(f"--sizes must be multiples of 4 bytes, largest first; got {args.sizes}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        exit_now(worker(args))   # its groups destroyed: the launcher waits for its exit (exit_now)
    if not launcher_can_run("bandwidth_flip"):
        return 2
    rows, events, stats = run_experiment(args)
    args.results.mkdir(parents=True, exist_ok=True)
    write_csv(args.results / f"{args.name}.csv", FIELDS, rows)
    verdict = report(rows, events, stats)
    if plot(rows, events, args.sizes, args.rate, args.results / f"{args.name}.png"):
        print(f"plot: {args.results / args.name}.png")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "events": events, "flips": flips(rows),
                                         "phases": phase_summary(rows), "verdict": verdict, "stats": stats}))
    return 0 if not verdict else 1


if __name__ == "__main__":
    sys.exit(main())
