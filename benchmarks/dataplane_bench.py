"""One job's traffic through a switch data plane: packets per second and aggregated Gbit/s.

Two workers (ports 1 and 2) stream rounds over a window of W slots: each round sends both
workers' contributions for every slot, then waits for the 2*W result replicas. Runs on the
software data plane, and on BMv2 too when it is installed (printing the ratio), in both
encapsulations (UDP, and RoCEv2 where results also get a recomputed ICRC; printing the RoCE/UDP
ratio). Needs root (network namespace). Writes benchmarks/results/dataplane.csv.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scapy.layers.inet import IP, UDP  # noqa: E402
from scapy.layers.l2 import Ether  # noqa: E402

from bmv2_env.testbed import Dataplane, bmv2_missing, have_netns, program_testbed  # noqa: E402
from controller.switch import SwitchConnection, SwitchJob, WorkerBinding  # noqa: E402
from hostlib.protocol import SWITCH_VALUES_PER_PACKET as K, UDP_PORT, build_contribution, mac  # noqa: E402
from hostlib.roce import frame as roce_frame  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SWITCH_MAC, SWITCH_IP = "00:00:00:00:00:fe", "10.0.0.254"


def contribution_frame(w: WorkerBinding, encap: str, inagg: bytes) -> bytes:
    if encap == "roce":
        return roce_frame(inagg, dst_mac=SWITCH_MAC, src_mac=mac(w.mac), src_ip=w.ip,
                          dst_ip=SWITCH_IP, src_port=0xC000 | w.rank, psn=0)
    return bytes(Ether(src=w.mac, dst=SWITCH_MAC) / IP(src=w.ip, dst=SWITCH_IP)
                 / UDP(sport=w.udp_port, dport=UDP_PORT, chksum=0) / inagg)


def run(target: str, encap: str, rounds: int, window: int) -> dict:
    workers = tuple(WorkerBinding(r, r + 1, f"10.0.0.{r + 1}", f"00:00:00:00:00:0{r + 1}", 50000 + r,
                                  qp=0x100 + r) for r in range(2))
    job = SwitchJob(1, 0, 1, 0, window, workers, encap)
    frames = []  # frames[set][slot][rank]
    for s in (0, 1):
        frames.append([[contribution_frame(w, encap, build_contribution(
            1, w.rank, 1, slot, s, slot * K, np.full(K, w.rank + 1, np.int32), K)) for w in workers]
            for slot in range(window)])
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
                    plane.send(w.port, frames[r % 2][slot][w.rank])
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--window", type=int, default=16)
    args = p.parse_args()
    reason = have_netns()
    if reason:
        print(f"dataplane benchmark skipped: {reason}")
        return 0
    targets = ["soft"] + (["bmv2"] if bmv2_missing() is None else [])
    rows = [run(target, encap, args.rounds, args.window) for target in targets for encap in ("udp", "roce")]
    RESULTS.mkdir(exist_ok=True)
    with open(RESULTS / "dataplane.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"one job, 2 workers, W={args.window}, K={K}: contributions through the data plane")
    for r in rows:
        print(f"  {r['target']:>5} {r['encap']:>4}: {r['pps']:9.0f} contributions/s  {r['gbps']:.3f} Gbit/s "
              f"aggregated  ({r['contributions']} in {r['seconds']:.2f} s, {r['missing_results']} results missing)")
    pps = {(r["target"], r["encap"]): r["pps"] for r in rows}
    for target in targets:
        print(f"  {target}: RoCEv2 / UDP throughput ratio: {pps[target, 'roce'] / pps[target, 'udp']:.2f}")
    if len(targets) == 2:
        print(f"  soft / bmv2 throughput ratio (UDP): {pps['soft', 'udp'] / pps['bmv2', 'udp']:.2f}")
    else:
        print(f"  bmv2: skipped ({bmv2_missing()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
