"""The software data plane, measured two ways; writes benchmarks/results/dataplane*.csv/png.

1. CPU per contribution over UDP (loopback, no root): the software switch as ``make demo`` runs
   it, 4 workers, K = 64, vs the floor, a C program that only echoes each datagram with the same
   batched system calls (benchmarks/udp_echo.c, built here with cc). The same C load generator
   drives both, interleaved, several repetitions; CPU is user + sys of the switch's (or echo's)
   process from /proc/<pid>/stat. Medians and their ratio are printed with the machine's load.
   One run of the Python reference engine is added for comparison.
2. Throughput through veth ports (needs root: network namespace): two workers stream rounds over
   a window of W slots, both encapsulations (UDP, and RoCEv2 where results also get a recomputed
   ICRC), on each software engine, and on BMv2 when it is installed.

Allreduce through the software switch against gloo, with its retransmissions, is
benchmarks/allreduce_bench.py's part.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scapy.layers.inet import IP, UDP  # noqa: E402
from scapy.layers.l2 import Ether  # noqa: E402

from inagg.bmv2_env.emulation.loopback import random_loopback_net  # noqa: E402
from inagg.bmv2_env.softswitch.switch import udp_host_mac  # noqa: E402
from inagg.bmv2_env.emulation.testbed import SOFT_ENGINES, Dataplane, bmv2_missing, have_netns, program_testbed  # noqa: E402
from inagg.controller.config import default_program  # noqa: E402
from inagg.controller.program import Program  # noqa: E402
from inagg.controller.switch import (  # noqa: E402
    INSERT, JobAdmission, ReplicaRewrite, ResultReplication, SwitchConnection, SwitchJob, WorkerBinding,
)
from inagg.hostlib.wire.protocol import (  # noqa: E402
    ROUND_CYCLE, SWITCH_VALUES_PER_PACKET as K, UDP_PORT, build_contribution, mac, round_fields,
)
from inagg.hostlib.wire.roce import frame as roce_frame  # noqa: E402
from tools.soft_p4info import soft_p4info_text  # noqa: E402
from plots import pyplot  # noqa: E402  (benchmarks/, the script's own folder)

RESULTS = Path(__file__).resolve().parent / "results"
SWITCH_MAC, SWITCH_IP = "00:00:00:00:00:fe", "10.0.0.254"
ECHO_SOURCE = Path(__file__).resolve().parent / "udp_echo.c"
ECHO_BIN = ROOT / "build" / "bench" / "udp_echo"
WORKER_PORT_BASE = 50000
ECHO_PORT = UDP_PORT + 1


def load_text() -> str:
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def write_csv(name: str, rows: list[dict]) -> None:
    RESULTS.mkdir(exist_ok=True)
    with open(RESULTS / name, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


# -- 1. CPU per contribution vs the C echo floor ----------------------------------------------

def build_echo() -> Path:
    """Compile benchmarks/udp_echo.c into build/bench (when missing or older than the source)."""
    if not ECHO_BIN.exists() or ECHO_BIN.stat().st_mtime < ECHO_SOURCE.stat().st_mtime:
        ECHO_BIN.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cc", "-O2", "-o", str(ECHO_BIN), str(ECHO_SOURCE)], check=True)
    return ECHO_BIN


def cpu_seconds(pid: int) -> float:
    """user + sys CPU of a process (all its threads) so far, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def worker_addrs(net: str, n: int) -> list[str]:
    return [f"{net}.{r + 1}:{WORKER_PORT_BASE + r}" for r in range(n)]


def program_of_k(directory: Path, k: int) -> Program:
    """The software target's program at K values per packet (its P4Info written into
    ``directory``): the switch takes K from the P4Info it is pushed."""
    soft = default_program("soft")
    p4info = directory / "inagg.p4info.txtpb"
    p4info.write_text(soft_p4info_text(soft.p4info_path.read_text(), k))
    return Program("soft", p4info, soft.files)


@contextmanager
def udp_switch(engine: str, net: str, n: int, window: int, k: int):
    """A software switch over UDP at net.254 with hosts net.1..n aggregating K values per packet,
    one job of those n workers over ``window`` slots; yields its pid."""
    with tempfile.TemporaryDirectory() as d:
        ports = [a for r in range(n) for a in ("-i", f"{r + 1}@udp:{net}.{r + 1}")]
        proc = subprocess.Popen(
            [sys.executable, "-m", "inagg.bmv2_env.softswitch.switch", "--engine", engine, *ports, "--udp-bind", f"{net}.254", "--no-p4", "--",
             "--grpc-server-addr", f"unix:{d}/p4rt.sock"],
            cwd=ROOT, stdout=subprocess.PIPE, text=True)
        try:
            if "inagg-soft-switch" not in proc.stdout.readline():
                raise RuntimeError("the software switch did not start")
            sw = SwitchConnection(f"unix:{d}/p4rt.sock")
            sw.push_pipeline(program_of_k(Path(d), k))
            job = SwitchJob(1, 0, 1, 0, window, tuple(
                WorkerBinding(r, r + 1, f"{net}.{r + 1}", udp_host_mac(f"{net}.{r + 1}"), WORKER_PORT_BASE + r)
                for r in range(n)))
            sw.write(JobAdmission(sw).updates(INSERT, job) + ReplicaRewrite(sw).updates(INSERT, job)
                     + [ResultReplication(sw).job_update(INSERT, job)])
            sw.close()
            yield proc.pid
        finally:
            proc.terminate()
            proc.wait(10)


@contextmanager
def udp_echo(ip: str):
    proc = subprocess.Popen([str(ECHO_BIN), "echo", ip, str(ECHO_PORT)])
    try:
        time.sleep(0.2)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def drive(pid: int, target: str, port: int, net: str, n: int, window: int, rounds: int, k: int) -> dict:
    """Run the load generator (contributions of K values) against ``target``; CPU the process
    ``pid`` spent per contribution."""
    before = cpu_seconds(pid)
    out = subprocess.run([str(ECHO_BIN), "load", target, str(port), str(window), str(rounds), str(k),
                          *worker_addrs(net, n)], check=True, capture_output=True, text=True).stdout
    cpu = cpu_seconds(pid) - before
    sent, received = (int(w) for w in out.split()[1::2])
    return {"contributions": sent, "lost": sent - received, "cpu_seconds": cpu,
            "us_per_contribution": cpu / sent * 1e6}


def cpu_benchmark(reps: int, rounds: int, window: int, k: int, n: int = 4) -> list[dict]:
    build_echo()
    net = random_loopback_net()
    rows = []
    with udp_switch("native", net, n, window, k) as switch_pid, udp_echo(f"{net}.253") as echo_pid:
        drive(switch_pid, f"{net}.254", UDP_PORT, net, n, window, rounds // 10, k)   # warm-up
        drive(echo_pid, f"{net}.253", ECHO_PORT, net, n, window, rounds // 10, k)
        for rep in range(reps):
            for system, pid, target, port in (("switch-native", switch_pid, f"{net}.254", UDP_PORT),
                                              ("c-echo-floor", echo_pid, f"{net}.253", ECHO_PORT)):
                rows.append({"rep": rep, "system": system, "K": k, "load1": round(os.getloadavg()[0], 2),
                             **drive(pid, target, port, net, n, window, rounds, k)})
    with udp_switch("python", net, n, window, k) as switch_pid:
        rows.append({"rep": 0, "system": "switch-python", "K": k, "load1": round(os.getloadavg()[0], 2),
                     **drive(switch_pid, f"{net}.254", UDP_PORT, net, n, window, max(1, rounds // 20), k)})
    return rows


def report_cpu(rows: list[dict]) -> None:
    med = {s: statistics.median(r["us_per_contribution"] for r in rows if r["system"] == s)
           for s in dict.fromkeys(r["system"] for r in rows)}
    per_rep = [a["us_per_contribution"] / b["us_per_contribution"]
               for a, b in zip([r for r in rows if r["system"] == "switch-native"],
                               [r for r in rows if r["system"] == "c-echo-floor"])]
    n = sum(r["system"] == "switch-native" for r in rows)
    print(f"CPU (user+sys) per contribution over UDP, 4 workers, K={rows[0]['K']}, "
          f"{rows[0]['contributions']} contributions x {n} interleaved reps (medians):")
    for system, us in med.items():
        lost = sum(r["lost"] for r in rows if r["system"] == system)
        print(f"  {system:>14}: {us:7.2f} us/contribution  ({lost} datagrams lost)")
    ratio = med["switch-native"] / med["c-echo-floor"]
    print(f"  native switch / C echo floor: {ratio:.2f} (median of per-rep ratios "
          f"{statistics.median(per_rep):.2f}; target <= 2)")
    print(f"  python reference / native switch: {med['switch-python'] / med['switch-native']:.1f}")


def plot_cpu(rows: list[dict], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return

    fig, ax = plt.subplots(figsize=(7, 4.2))
    systems = list(dict.fromkeys(r["system"] for r in rows))
    for i, system in enumerate(systems):
        ys = [r["us_per_contribution"] for r in rows if r["system"] == system]
        ax.scatter([i] * len(ys), ys, color=f"C{i}", alpha=0.6)
        ax.hlines(statistics.median(ys), i - 0.3, i + 0.3, color=f"C{i}")
    ax.set(xticks=range(len(systems)), xticklabels=systems, yscale="log",
           ylabel="CPU us per contribution (user+sys)",
           title=f"software switch over UDP vs a C echo, K={rows[0]['K']}, {os.cpu_count()} cores")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- 2. throughput through veth ports --------------------------------------------------------

def contribution_frame(w: WorkerBinding, encap: str, inagg: bytes) -> bytes:
    if encap == "roce":
        return roce_frame(inagg, dst_mac=SWITCH_MAC, src_mac=mac(w.mac), src_ip=w.ip,
                          dst_ip=SWITCH_IP, src_port=0xC000 | w.rank, psn=0)
    return bytes(Ether(src=w.mac, dst=SWITCH_MAC) / IP(src=w.ip, dst=SWITCH_IP)
                 / UDP(sport=w.udp_port, dport=UDP_PORT, chksum=0) / inagg)


def veth_run(target: str, encap: str, rounds: int, window: int) -> dict:
    workers = tuple(WorkerBinding(r, r + 1, f"10.0.0.{r + 1}", f"00:00:00:00:00:0{r + 1}", 50000 + r,
                                  qp=0x100 + r) for r in range(2))
    job = SwitchJob(1, 0, 1, 0, window, workers, encap)
    frames = []  # frames[round mod ROUND_CYCLE][slot][rank]: each round's set and round tag
    for round_no in range(ROUND_CYCLE):
        s, tag_flags = round_fields(round_no)
        frames.append([[contribution_frame(w, encap, build_contribution(
            1, w.rank, 1, slot, s, slot * K, np.full(K, w.rank + 1, np.int32), K, flags=tag_flags))
            for w in workers] for slot in range(window)])
    plane = Dataplane(target, n_ports=2).start()
    try:
        sw = SwitchConnection(plane.grpc_addr)
        sw.push_pipeline()
        program_testbed(sw, [job], 2)
        lost = 0
        t0 = time.perf_counter()
        for r in range(rounds):
            for slot in range(window):
                for w in workers:
                    plane.send(w.port, frames[r % ROUND_CYCLE][slot][w.rank])
            got = 0
            deadline = time.perf_counter() + 5
            while got < 2 * window and time.perf_counter() < deadline:
                got += sum(len(v) for v in plane.recv_all(0.002).values())
            lost += 2 * window - got
        seconds = time.perf_counter() - t0
        sw.close()
    finally:
        plane.stop()
    contributions = rounds * window * 2
    return {"target": target, "encap": encap, "contributions": contributions, "seconds": seconds,
            "pps": contributions / seconds, "gbps": contributions * K * 32 / seconds / 1e9,
            "missing_results": lost}


def veth_benchmark(rounds: int, window: int) -> list[dict] | None:
    reason = have_netns()
    if reason:
        print(f"veth throughput skipped: {reason}")
        return None
    targets = list(SOFT_ENGINES) + (["bmv2"] if bmv2_missing() is None else [])
    rows = [veth_run(target, encap, rounds, window) for target in targets for encap in ("udp", "roce")]
    print(f"throughput through veth ports: one job, 2 workers, W={window}, K={K}")
    for r in rows:
        print(f"  {r['target']:>11} {r['encap']:>4}: {r['pps']:9.0f} contributions/s  {r['gbps']:.3f} Gbit/s "
              f"aggregated  ({r['contributions']} in {r['seconds']:.2f} s, {r['missing_results']} results missing)")
    pps = {(r["target"], r["encap"]): r["pps"] for r in rows}
    for target in targets:
        print(f"  {target}: RoCEv2 / UDP throughput ratio: {pps[target, 'roce'] / pps[target, 'udp']:.2f}")
    if "bmv2" in targets:
        print(f"  soft / bmv2 throughput ratio (UDP): {pps['soft', 'udp'] / pps['bmv2', 'udp']:.2f}")
    else:
        print(f"  bmv2: skipped ({bmv2_missing()})")
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-reps", type=int, default=5)
    p.add_argument("--cpu-rounds", type=int, default=400, help="rounds of W slots x 4 workers per rep")
    p.add_argument("--cpu-window", type=int, default=64)
    p.add_argument("--cpu-k", type=int, default=K, help="values per packet (the switch's K)")
    p.add_argument("--rounds", type=int, default=200, help="veth throughput: rounds")
    p.add_argument("--window", type=int, default=16, help="veth throughput: window")
    p.add_argument("--only", choices=("cpu", "veth"), help="run one part")
    args = p.parse_args()
    print(load_text())
    if args.only in (None, "cpu"):
        rows = cpu_benchmark(args.cpu_reps, args.cpu_rounds, args.cpu_window, args.cpu_k)
        write_csv("dataplane_cpu.csv", rows)
        report_cpu(rows)
        plot_cpu(rows, RESULTS / "dataplane_cpu.png")
        print(f"  {load_text()}")
    if args.only in (None, "veth"):
        rows = veth_benchmark(args.rounds, args.window)
        if rows:
            write_csv("dataplane.csv", rows)
            print(f"  {load_text()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
