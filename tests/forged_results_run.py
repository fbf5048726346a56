"""A job under attack on the emulation (tests/test_forged_results.py runs it, as root): two ranks
on h1 and h2 allreduce int32 tensors through the software switch while h3, a host of the same
switch and no part of the job, sends forged results at them: frames with the switch's
aggregator MAC and IPv4 address and its inagg UDP port as their source, each worker's own
address and port as their destination, the job's id and epoch, slots, offsets and round tags of
its grant, and garbage values; and as many results from h3's own address.

Every rank checks every element of every sum against the sum it computes itself (each rank's
values are a function of the call and the rank). The launcher prints one JSON line: the calls,
the wrong ones, the frames forged of each kind and the switch's SourceGuard drop counts (the
P4 counter ``guard_drops``, by reason).

    python tests/forged_results_run.py [--calls 150]
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from emulation_ranks import (READY_SECONDS, STORE_PORT, add_rank_arguments, finish_job, join_job,  # noqa: E402
                             shaped_network, start_rank, start_ranks, write_deployment)
from wire_bench import topology  # noqa: E402

VALUES = 20_000   # per call: several windows of the switch's K


# -- the ranks -----------------------------------------------------------------------------

def values(call: int, rank: int):
    """Rank ``rank``'s tensor of call ``call``: the same on every rank that computes it."""
    import torch

    g = torch.Generator().manual_seed(call * 1000 + rank)
    return torch.randint(-1000, 1000, (VALUES,), generator=g, dtype=torch.int32)


def rank_main(args: argparse.Namespace) -> int:
    """Say where this rank listens (for the forger), wait for the go, run the calls, count the
    wrong ones; rank 0 writes the job's count to ``--out``."""
    import torch
    import torch.distributed as dist

    pg, barrier = join_job(args)
    comm = pg.lifecycle.comm
    g = comm.grant
    Path(f"{args.out}.rank{args.rank}").write_text(json.dumps(
        {"port": comm.transport.address[1], "job": g.job_id, "epoch": g.epoch, "mode": g.mode,
         "slot_base": g.slot_base, "slot_count": g.slot_count, "k": g.values_per_packet}))
    while not Path(args.go).exists():
        time.sleep(0.05)
    dist.barrier(group=barrier)
    wrong = 0
    for call in range(args.calls):
        x = values(call, args.rank)
        dist.all_reduce(x)
        wrong += not torch.equal(x, sum(values(call, r) for r in range(args.world)))
    total = torch.tensor([wrong])
    dist.all_reduce(total, group=barrier)
    if args.rank == 0:
        Path(args.out).write_text(json.dumps({"calls": args.calls, "wrong": int(total.item()), "mode": g.mode}))
    dist.barrier(group=barrier)
    dist.destroy_process_group()
    return 0


# -- the forger (in h3's namespace) --------------------------------------------------------

def forged_frame(target: dict, own: bool, rng: random.Random) -> bytes:
    """One forged result for ``target`` (a rank's port, MAC, IPv4 and its grant): from the
    switch's aggregator address, or (``own``) from h3's own."""
    import numpy as np
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether

    from inagg.hostlib.wire import protocol

    k = target["k"]
    slot = target["slot_base"] + rng.randrange(target["slot_count"])
    payload = bytearray(protocol.build_contribution(
        target["job"], rng.randrange(2), target["epoch"], slot, rng.randrange(2), k * rng.randrange(64),
        np.full(k, rng.randrange(1 << 20), np.int64), k))
    payload[0] = (protocol.VERSION << 4) | protocol.MSG_RESULT
    payload[1] = rng.randrange(8) << 4                       # any round tag, no other flag
    src = (target["h3_mac"], target["h3_ip"], 47999) if own else (target["agg_mac"], target["agg_ip"], protocol.UDP_PORT)
    return bytes(Ether(src=src[0], dst=target["mac"]) / IP(src=src[1], dst=target["ip"])
                 / UDP(sport=src[2], dport=target["port"]) / bytes(payload))


def forge_main(args: argparse.Namespace) -> int:
    """Send forged results at every target until ``--stop`` exists, alternating the switch's
    address and h3's own; print the counts sent of each."""
    targets = json.loads(Path(args.forge).read_text())
    rng, sent = random.Random(7), {"aggregator_addr": 0, "result": 0}
    frames = [(own, forged_frame(t, own, rng)) for t in targets for own in (False, True) for _ in range(64)]
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as sock:
        sock.bind((args.iface, 0))
        while not Path(args.stop).exists():
            for own, frame in frames:
                sock.send(frame)
                sent["result" if own else "aggregator_addr"] += 1
            time.sleep(0.05)     # about 5,000 frames a second
    print(json.dumps(sent), flush=True)
    return 0


# -- the launcher ----------------------------------------------------------------------------

def targets(topo, ranks: list[dict]) -> list[dict]:
    """What the forger needs of each rank: its addresses and grant, and the two sources."""
    from inagg.bmv2_env.emulation.topology import host_ip

    switch = topo.switches["s1"]
    h3 = topo.hosts["h3"]
    return [{**r, "ip": host_ip(topo.hosts[h]), "mac": topo.hosts[h]["mac"], "agg_ip": switch["aggregator_ip"],
             "agg_mac": switch["aggregator_mac"], "h3_ip": host_ip(h3), "h3_mac": h3["mac"]}
            for h, r in zip(("h1", "h2"), ranks)]


def wait_for(paths: list[Path], procs: list, timeout: float) -> list[dict]:
    """The JSON the ranks write once joined, each in its file."""
    deadline = time.time() + timeout
    while not all(p.exists() for p in paths):
        if time.time() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError(f"the ranks did not say where they listen (exits {[p.poll() for p in procs]})")
        time.sleep(0.1)
    return [json.loads(p.read_text()) for p in paths]


def guard_drops(run) -> dict[str, int]:
    """The switch's SourceGuard drops by reason (GUARD_DROP_REASONS)."""
    from inagg.controller.config import default_program
    from inagg.controller.switch import SwitchConnection
    from inagg.hostlib.wire.protocol import GUARD_DROP_REASONS

    sw = SwitchConnection(run.net.get("s1").grpc, program=default_program("soft"), election_id=(0, 0))
    try:
        counts = sw.counter("guard_drops")
    finally:
        sw.close()
    return {name: counts.get(code, 0) for code, name in enumerate(GUARD_DROP_REASONS)}


def launch(args: argparse.Namespace) -> int:
    """The network, the job, the forger; one JSON line of what happened."""
    from inagg.bmv2_env.emulation.topology import host_ip

    topo = topology(3, 1500)
    with shaped_network(topo, "1gbit", "forged results", -10) as run:
        write_deployment(run, [host_ip(topo.hosts[h]) for h in ("h1", "h2")])
        out, go, stop = run.run.path / "victim.json", run.run.path / "go", run.run.path / "stop"
        procs = start_ranks(run, Path(__file__).resolve(), "victim", ["h1", "h2"], STORE_PORT + 77,
                            ["--calls", str(args.calls), "--go", str(go)], {})
        ranks = wait_for([Path(f"{out}.rank{r}") for r in range(2)], procs, READY_SECONDS)
        (run.run.path / "targets.json").write_text(json.dumps(targets(topo, ranks)))
        forger = start_rank(run, "h3", [str(Path(__file__).resolve()), "--forge", str(run.run.path / "targets.json"),
                                        "--stop", str(stop), "--iface", run.net.get("h3").defaultIntf().name],
                            {}, "forger")
        time.sleep(1.0)          # the forger's frames are flowing before the first call
        go.touch()
        result = finish_job(procs, out, READY_SECONDS + 300)
        stop.touch()
        forged = json.loads(forger.communicate(timeout=60)[0].strip().splitlines()[-1])
        print(json.dumps({**result, "ports": [r["port"] for r in ranks], "forged": forged,
                          "guard_drops": guard_drops(run)}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=150, help="allreduces of the job")
    p.add_argument("--go", help=argparse.SUPPRESS)
    p.add_argument("--forge", help=argparse.SUPPRESS)
    p.add_argument("--stop", help=argparse.SUPPRESS)
    p.add_argument("--iface", help=argparse.SUPPRESS)
    add_rank_arguments(p)
    args = p.parse_args(argv)
    if args.forge:
        return forge_main(args)
    return rank_main(args) if args.rank_of else launch(args)


if __name__ == "__main__":
    sys.exit(main())
