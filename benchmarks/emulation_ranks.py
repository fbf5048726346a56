"""What the benchmarks that run torch.distributed ranks in the Mininet emulation share
(``bandwidth_flip.py``, ``wire_bench.py``, ``tree_bench.py``): whether the emulation can run
here, shaping a link with ``tc tbf`` (make run's ``bmv2_env/emulation/shaping.py``; netem is not needed, so kernels without sch_netem work),
starting one rank process per worker host against the run's controller, a rank joining its job
and reporting its slowest rank's times, waiting for rank 0's next line, and writing the
results' CSV.

A rank finds its inagg address in ``deployment.json`` beside the controller socket it is given
(``inagg.hostlib.worker.local``): each worker host's switch-side IP, in rank order."""

from __future__ import annotations

import csv
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from inagg.bmv2_env.emulation.forked import exit_now
from inagg.bmv2_env.emulation.shaping import rate_bits, shape  # noqa: F401 - make run's tbf, for every benchmark

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"   # CSV and PNG by default (not committed: docs/results/ keeps runs)
STORE_PORT = 29500        # in the ranks' own namespaces: no other process can hold it
READY_SECONDS = 180.0     # bring-up and the process group's start on a loaded 2-core machine
_DROPPED = re.compile(r"\(dropped (\d+),")


def emulation_missing() -> str | None:
    """None when the emulation can run here (root, Mininet's mnexec), else why not."""
    if os.geteuid() != 0 or shutil.which("mnexec") is None:
        return "the emulation needs root and Mininet (make setup-emulation)"
    return None


def launcher_can_run(name: str) -> bool:
    """Whether a benchmark's launcher can bring up the emulation here (else it says why on
    stderr); from here on SIGTERM exits through the caller's ``finally`` (the run's teardown)."""
    missing = emulation_missing()
    if missing:
        print(f"{name}: {missing}", file=sys.stderr)
        return False
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(f"{name}: stopped (SIGTERM)"))
    return True


def node_sh(node, command: str) -> None:
    """Run ``command`` in a Mininet node's shell; ip and tc print nothing unless they fail."""
    out = node.cmd(command).strip()
    if out:
        raise RuntimeError(f"{node.name}: {command}: {out}")


def link_drops(links) -> int:
    """The frames every end of ``links`` has dropped so far (tc's count: a full tbf queue)."""
    total = 0
    for link in links:
        for intf in (link.intf1, link.intf2):
            total += sum(int(n) for n in _DROPPED.findall(intf.node.cmd(f"tc -s qdisc show dev {intf.name}")))
    return total


def applied_loss_pct(run) -> float | None:
    """The share of frames the run's switch ports dropped, all ports and directions together,
    in percent (what the ports counted, not what was asked; None when they counted none). The
    switches rewrite their counts every IMPAIR_STATS_SECONDS: waits two of those first."""
    from inagg.bmv2_env.emulation import impairments
    from inagg.bmv2_env.softswitch.switch import IMPAIR_STATS_SECONDS

    time.sleep(2 * IMPAIR_STATS_SECONDS)
    stats = impairments.read_port_stats(run.run.path / "logs", list(run.topo.switches))
    seen = sum(e["seen"] for entries in stats.values() for e in entries)
    dropped = sum(e["dropped"] for entries in stats.values() for e in entries)
    return round(100 * dropped / seen, 4) if seen else None


def shape_link(link, rate: str | None) -> None:
    """Both directions of a Mininet link at ``rate`` (each end's egress), or unlimited (None)."""
    for intf in (link.intf1, link.intf2):
        shape(intf, rate)


@contextmanager
def cpu_load(processes: int):
    """``processes`` busy loops at the default priority for as long as the block runs: the load
    from other work that a shared machine has (the data plane runs ahead of it, the ranks not)."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def positive_seconds(text: str) -> float:
    """A positive number of seconds (argparse names the flag when this raises)."""
    value = float(text)
    if not value > 0:
        raise ValueError(text)
    return value


def add_machine_arguments(parser) -> None:
    """The data plane's priority (``--switch-nice``) and other work on the machine (``--cpu-load``)."""
    from inagg.bmv2_env.emulation.mininet_run import DATA_PLANE_NICE

    parser.add_argument("--switch-nice", type=int, default=DATA_PLANE_NICE,
                        help="the data plane's nice(1) value (default %(default)s: ahead of the ranks)")
    parser.add_argument("--cpu-load", type=int, default=0, metavar="N",
                        help="N busy processes at the ranks' priority for the whole run (other work on the machine)")
    parser.add_argument("--rank-lease-seconds", type=positive_seconds, metavar="S",
                        help="the controller's rank lease (default: the topology's): a loaded machine's ranks "
                             "may miss heartbeats for longer than the default 8 s")


@contextmanager
def shaped_network(topo, rate: str, title: str, switch_nice: int, cpu_busy: int = 0,
                   rank_lease_seconds: float | None = None):
    """The emulation of ``topo`` on the software data plane (pcaps off, at ``switch_nice``),
    every link shaped to ``rate`` both ways, the controller (its rank lease
    ``rank_lease_seconds`` when given) and the host aggregator started, ``cpu_busy`` busy loops
    beside it; torn down on leaving, the ranks with it (``run.procs``). Prints ``title`` and the
    run's directory first."""
    from inagg.bmv2_env.emulation.mininet_run import Run, program_files_for
    from inagg.bmv2_env.emulation.run_dir import RunDir

    if rank_lease_seconds is not None:
        topo.controller = {**topo.controller, "rank_lease_seconds": rank_lease_seconds}
    run_dir = RunDir.create()
    print(f"{title}, soft data plane at nice {switch_nice}, {cpu_busy} busy processes beside, "
          f"run {run_dir.run_id} in {run_dir.path}", flush=True)
    run = Run(topo, "soft", run_dir, program_files=program_files_for("soft"), pcaps=False, switch_nice=switch_nice)
    try:
        run.build()
        for link in run.net.links:
            shape_link(link, rate)
        run.start_services()
        with cpu_load(cpu_busy):
            yield run
    finally:
        run.teardown()


def write_deployment(run, worker_ips: list[str], directory: Path | None = None) -> str:
    """Tell the ranks their inagg addresses (rank order) and the run's controller: beside the
    run's controller socket, or (jobs on different hosts at once) in ``directory``, a job's own,
    with a link to that socket. Returns the controller address the job's ranks are given."""
    from inagg.hostlib.worker.local import DEPLOYMENT_FILE

    socket_path = Path(run.controller_addr[len("unix:"):])
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / socket_path.name).symlink_to(socket_path)
        socket_path = directory / socket_path.name
    (socket_path.parent / DEPLOYMENT_FILE).write_text(json.dumps(
        {"controller": run.controller_addr, "worker_ips": worker_ips}))
    return f"unix:{socket_path}"


def start_rank(run, host_name: str, argv: list[str], env: dict[str, str], label: str) -> subprocess.Popen:
    """One rank process (this Python, ``argv``) in ``host_name``'s namespace, its stdout piped
    to the launcher, its stderr in the run's logs (``<label>.log``); recorded in the run
    directory and stopped by the run's teardown."""
    host = run.net.get(host_name)
    env = {**os.environ, "INAGG_CONTROLLER": run.controller_addr, **env}
    with run.log(f"{label}.log") as log:
        proc = host.popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=log, text=True)
    run.run.add_process(proc.pid, label)
    run.procs.append(proc)
    return proc


def start_ranks(run, script: Path, job: str, hosts: list[str], port: int, extra: list[str],
                env: dict[str, str]) -> list[subprocess.Popen]:
    """One rank of ``job`` per host (rank order) running ``script`` in rank mode (``--rank-of``
    and the flags ``add_rank_arguments`` declares, then ``extra``), its store on the first
    host's ``port``, its default group forced to the switch path (``env`` may say otherwise);
    rank 0 writes the job's result to ``<run>/<job>.json``."""
    from inagg.bmv2_env.emulation.topology import host_ip

    master = host_ip(run.topo.hosts[hosts[0]])
    procs = []
    for rank, host in enumerate(hosts):
        argv = [str(script), "--rank-of", job, "--rank", str(rank), "--world", str(len(hosts)), "--master", master,
                "--store-port", str(port), "--out", str(run.run.path / f"{job}.json"), *extra]
        host_env = {"GLOO_SOCKET_IFNAME": run.net.get(host).defaultIntf().name, "INAGG_ALLREDUCE_PATH": "inagg",
                    "TORCHELASTIC_RUN_ID": job, **env}
        procs.append(start_rank(run, host, argv, host_env, f"{job}-{host}"))
    return procs


def finish_job(procs: list, out: Path, timeout: float) -> dict:
    """Wait for a job's ranks to exit (all of them, within ``timeout``) and read its result."""
    deadline = time.time() + timeout
    for p in procs:
        p.wait(max(1.0, deadline - time.time()))
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError(f"ranks exited with {[p.returncode for p in procs]}; see {out.parent}/logs")
    return json.loads(out.read_text())


def add_rank_arguments(parser) -> None:
    """The flags ``start_ranks`` gives each rank (hidden: the launcher's, not a user's)."""
    import argparse

    parser.add_argument("--rank-of", help=argparse.SUPPRESS)
    for flag, kind in (("--rank", int), ("--world", int), ("--master", str), ("--store-port", int), ("--out", str)):
        parser.add_argument(flag, type=kind, help=argparse.SUPPRESS)


def join_job(args):
    """This rank in its job (one thread for torch): the default group of the ``inagg`` backend
    (its path as ``INAGG_ALLREDUCE_PATH`` says) and a gloo group of its own for the barriers, so
    no measured group waits in one; returns both."""
    import torch
    import torch.distributed as dist

    import inagg.hostlib.pytorch.plugin  # noqa: F401 - registers "inagg" where entry points are off

    torch.set_num_threads(1)
    dist.init_process_group("inagg", rank=args.rank, world_size=args.world,
                            init_method=f"tcp://{args.master}:{args.store_port}", timeout=timedelta(seconds=300))
    dist.group.WORLD.ready()   # its paths start in the background: up before the first measured call
    return dist.group.WORLD, dist.new_group(backend="gloo")


def slowest_times(seconds: list[float], barrier) -> list[float]:
    """Every call's slowest rank's time (``seconds``: this rank's)."""
    import torch
    import torch.distributed as dist

    slowest = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=barrier)
    return slowest.tolist()


def job_retransmissions(pg, barrier) -> tuple[int, int]:
    """The job's retransmissions on ``pg`` (an ``inagg`` group) so far and how many of them were
    spurious (the first answer came after all), each summed over its ranks."""
    import torch
    import torch.distributed as dist

    inagg = pg.stats()["inagg"]
    retx = torch.tensor([inagg["retransmissions"], inagg["spurious_retransmissions"]], dtype=torch.int64)
    dist.all_reduce(retx, group=barrier)
    return int(retx[0].item()), int(retx[1].item())


def wait_line(rank0, procs: list, timeout: float, logs: Path) -> dict:
    """Rank 0's next stdout line (JSON); fails fast when a rank exits first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if select.select([rank0.stdout], [], [], 0.5)[0]:
            line = rank0.stdout.readline()
            if line:
                return json.loads(line)
        dead = [p.returncode for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"a rank exited (status {dead}) first; see {logs}/*.log")
    raise RuntimeError(f"no word from rank 0 within {timeout:.0f}s; see {logs}/*.log")


def add_output_arguments(parser, name: str, results: Path) -> None:
    """Where a benchmark's CSV and PNG go: ``--results`` (a folder), ``--name`` (their stem)."""
    parser.add_argument("--name", default=name, help="results file names (CSV, PNG)")
    parser.add_argument("--results", type=Path, default=results, help="where the CSV and PNG go")


class PartialResult(Exception):
    """A benchmark run cut short (a rank died, a turn never ended): the ``rows`` it measured
    before, the failed one among them marked with the reason (its ``failed`` column)."""

    def __init__(self, rows: list[dict], reason: str) -> None:
        super().__init__(reason)
        self.rows = rows


def run_benchmark(name: str, args, rank_main, launch, fields: tuple[str, ...], report, plot) -> int:
    """A benchmark script's main: as one of its ranks (``--rank-of``: ``start_ranks`` started it
    in a Mininet host) ``rank_main(args)``; as the launcher, where the emulation can run,
    ``launch(args)``'s rows written (``write_results``) and the wall time printed. A run cut
    short (``PartialResult``) still writes the rows it has, as CSV and one line each (no
    table, no plot: they are not the whole), and exits 1."""
    if args.rank_of:
        exit_now(rank_main(args))   # its groups destroyed: the launcher waits for its exit (exit_now)
    if not launcher_can_run(name):
        return 2
    started = time.time()
    try:
        rows = launch(args)
    except PartialResult as partial:
        args.results.mkdir(parents=True, exist_ok=True)
        write_csv(args.results / f"{args.name}.csv", fields, partial.rows)
        for row in partial.rows:
            print(", ".join(f"{k} {row[k]}" for k in fields if row.get(k) not in (None, "")))
        print(f"{name} FAILED, partial results in {args.results / args.name}.csv: {partial}", file=sys.stderr)
        return 1
    write_results(args, fields, rows, report, plot)
    print(f"wall time {time.time() - started:.0f} s")
    return 0


def write_results(args, fields: tuple[str, ...], rows: list[dict], report, plot) -> None:
    """The rows as CSV and ``plot(rows, path)``'s PNG under ``--results`` (named ``--name``),
    and ``report(rows)``'s table."""
    args.results.mkdir(parents=True, exist_ok=True)
    write_csv(args.results / f"{args.name}.csv", fields, rows)
    report(rows)
    if plot(rows, args.results / f"{args.name}.png"):
        print(f"plot: {args.results / args.name}.png")


def write_csv(path: Path, fields: tuple[str, ...], rows: list[dict]) -> None:
    """The results' rows as CSV, one column per field."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
