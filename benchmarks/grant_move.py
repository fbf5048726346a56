"""How many calls a size class runs on gloo after the controller moves its job's grant from the
host aggregator to the switch (issue 36), on the Mininet emulation with every host link shaped.

Two jobs of N ranks on hosts h1..hN (``wire_bench``'s topology and groups): the default group,
forced to the switch, holds the switch's slots; the ``inagg`` backend's auto group, a second job
told the links' rate (``INAGG_LINK_RATE``), is placed on the host aggregator, where every
worker's frames share the aggregator's link, so its calls of ``--size-mib`` take gloo. After
``--warmup`` auto calls (its class calibrated and settled there), one call of the forced job
activates the half of its slots it was asked to give up, and the controller offers the auto job
the switch. Then ``--calls`` auto calls, each after the ranks agree whether every one of them has
seen that offer: the paths those calls took, how many of them ran on gloo once every rank had
seen it (``gloo_after_offer``; the bound, issue 36: 8), and whether the gloo calls' news of the
offer brought the agreement that found it (``news``, ``inagg.hostlib.pytorch.path.news``) or a
scheduled one came first (dear calls: one every ``agree_seconds``).

    sudo .venv/bin/python benchmarks/grant_move.py [--workers 4] [--rate 100mbit] [--size-mib 4]
        [--warmup 12] [--calls 24] [--results DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

from emulation_ranks import (READY_SECONDS, RESULTS, STORE_PORT, add_machine_arguments,  # noqa: E402
                             add_output_arguments, add_rank_arguments, finish_job, join_job, run_benchmark,
                             shaped_network, start_ranks, write_deployment)
from wire_bench import AUTO, MIB, auto_group, taken, timed_call, topology  # noqa: E402

FIELDS = ("workers", "rate", "bytes", "warmup", "calls", "offer_seen_at", "gloo_after_offer", "news", "paths", "load1")


# -- rank side --------------------------------------------------------------------------------

def offer_seen(auto, barrier) -> bool:
    """Whether every rank's auto job has seen the switch's grant, offered or taken."""
    import torch
    import torch.distributed as dist

    comm = auto.lifecycle.comm
    offered = comm.pending_grant
    seen = torch.tensor([float(comm.grant.mode == "switch" or (offered is not None and offered.mode == "switch"))])
    dist.all_reduce(seen, op=dist.ReduceOp.MIN, group=barrier)
    return bool(seen.item())


def rank_main(args: argparse.Namespace) -> int:
    """One rank: the auto group's warm-up, the forced job's one call, the counted auto calls;
    rank 0 writes their paths and the index of the first made after every rank saw the offer."""
    import torch
    import torch.distributed as dist

    pg, barrier = join_job(args)
    auto = auto_group()
    x = torch.empty(args.bytes // 4, dtype=torch.float32)
    for _ in range(args.warmup):
        timed_call(x, auto, barrier)
    timed_call(x, pg, barrier)   # its job takes its smaller window: the switch is offered to the auto job
    paths, seen_at = [], None
    for i in range(args.calls):
        if seen_at is None and offer_seen(auto, barrier):
            seen_at = i
        timed_call(x, auto, barrier)
        paths.append(taken(auto, AUTO))
    if args.rank == 0:
        Path(args.out).write_text(json.dumps({"paths": paths, "offer_seen_at": seen_at,
                                              "news": auto.stats()["path_model"]["news"],
                                              "grants": auto.stats()["inagg"].get("grants")}, default=str))
    dist.barrier(group=barrier)
    dist.destroy_process_group()
    return 0


# -- launcher side ----------------------------------------------------------------------------

def launch(args: argparse.Namespace) -> list[dict]:
    """Bring up the shaped network, run the job, tear down: one row."""
    from inagg.bmv2_env.emulation.topology import host_ip
    from inagg.hostlib.pytorch.path.links import LINK_RATE_ENV

    n = args.workers
    topo = topology(n, 1500)
    with shaped_network(topo, args.rate, f"grant move: {n} worker hosts at {args.rate}", args.switch_nice,
                        args.cpu_load, args.rank_lease_seconds) as run:
        write_deployment(run, [host_ip(h) for name, h in topo.hosts.items() if name != "agg"])
        extra = ["--size-mib", str(args.size_mib), "--warmup", str(args.warmup), "--calls", str(args.calls)]
        procs = start_ranks(run, Path(__file__).resolve(), "move", [f"h{r + 1}" for r in range(n)], STORE_PORT + n,
                            extra, {LINK_RATE_ENV: args.rate})
        result = finish_job(procs, run.run.path / "move.json", READY_SECONDS + 600)
    seen, paths = result["offer_seen_at"], result["paths"]
    after = paths[seen:] if seen is not None else []
    return [{"workers": n, "rate": args.rate, "bytes": args.bytes, "warmup": args.warmup, "calls": args.calls,
             "offer_seen_at": seen, "gloo_after_offer": after.count("gloo") if seen is not None else None,
             "news": result["news"],
             "paths": "".join(p[0] for p in paths), "load1": round(os.getloadavg()[0], 2)}]


def report(rows: list[dict]) -> None:
    """The counted calls' paths (g: gloo, i: inagg), where every rank had seen the offer, and the count."""
    for r in rows:
        print(f"N = {r['workers']}, {r['bytes'] / MIB:g} MiB at {r['rate']}: paths {r['paths']}; every rank saw the "
              f"offer before call {r['offer_seen_at']}; {r['gloo_after_offer']} calls on gloo from there; "
              f"{r['news']} agreement(s) brought by the gloo calls' news of it; load {r['load1']}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4, help="ranks of each of the two jobs")
    p.add_argument("--rate", default="100mbit", help="every host link's rate (tc tbf)")
    p.add_argument("--size-mib", type=float, default=4.0, help="the auto job's tensor (MiB)")
    p.add_argument("--warmup", type=int, default=12, help="auto calls before the move")
    p.add_argument("--calls", type=int, default=24, help="auto calls counted after the forced job's call")
    add_machine_arguments(p)
    add_output_arguments(p, "grant_move", RESULTS)
    add_rank_arguments(p)
    args = p.parse_args(argv)
    args.bytes = int(args.size_mib * MIB) // 4 * 4
    return args


def main(argv: list[str] | None = None) -> int:
    return run_benchmark("grant_move", parse_args(argv), rank_main, launch, FIELDS, report, lambda rows, path: False)


if __name__ == "__main__":
    sys.exit(main())
