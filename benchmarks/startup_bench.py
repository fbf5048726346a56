"""Start-up of a process group on one host, inagg against gloo: ``init_process_group`` and the
first allreduce, then a re-init (destroy, init again, one allreduce), each rank a process of
its own (env:// rendezvous), the two backends interleaved so both see the same load.

    .venv/bin/python benchmarks/startup_bench.py [--ranks 2] [--repeats 5] [--reinits 1]

The ranks meet on a store of their own before the clock starts (a process that finished importing
torch later would otherwise count in every figure). Prints, per backend, the median over the repetitions of the slowest rank's time for each
phase (``init``: ``init_process_group``; ``first``: init + the first 4-byte allreduce;
``reinit``: after a destroy (not timed), init under a prefix of its own on the ranks' meeting store + one allreduce,
``--reinits`` times in a row, the median of them (each the slowest rank's);
``first_cpu``, ``reinit_cpu``: the CPU time of ``first`` and ``reinit``, all the rank's threads), each repetition's figures
(in ms, to 0.1 ms: a re-init takes a few) and the load average (``uptime``) before and after. Exits 1 if a rank failed.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

# the wall-clock phases, then the CPU time (all the rank's threads) of init + first and of the re-init:
# CPU time barely moves with the machine's load, where wall time does
PHASES = ("init", "first", "reinit", "first_cpu", "reinit_cpu")


def rank_main(backend: str, reinits: int) -> None:
    """One rank: time init, the first allreduce, and ``reinits`` re-inits with one allreduce
    each; print JSON."""
    import torch
    import torch.distributed as dist

    x = torch.ones(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # every rank here before the clock starts: the figures are the backend's, not how much
    # later one process finished importing torch than another
    sync = dist.TCPStore("127.0.0.1", int(os.environ["SYNC_PORT"]), world_size, is_master=rank == 0)
    sync.set(str(rank), "")
    sync.wait([str(r) for r in range(world_size)])
    started, cpu = time.perf_counter(), time.process_time()
    dist.init_process_group(backend)
    init = time.perf_counter() - started
    dist.all_reduce(x)
    first, first_cpu = time.perf_counter() - started, time.process_time() - cpu
    dist.destroy_process_group()
    again: list[tuple[float, float]] = []
    for i in range(reinits):
        began, cpu = time.perf_counter(), time.process_time()
        # keys of its own on a store already connected: on the first one, a rank that re-inits before
        # rank 0 has destroyed its group would read that group's keys (torch names the new group as
        # the old one); a new TCP store would time its clients' connection retries, not the backend
        dist.init_process_group(backend, store=dist.PrefixStore(f"reinit{i}", sync), rank=rank, world_size=world_size)
        dist.all_reduce(x)
        again.append((time.perf_counter() - began, time.process_time() - cpu))
        dist.destroy_process_group()
    print(json.dumps({"init": init, "first": first, "reinit": [t for t, _ in again], "first_cpu": first_cpu,
                      "reinit_cpu": [c for _, c in again]}), flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_run(backend: str, ranks: int, reinits: int) -> dict[str, float]:
    """Every rank's figures for one job of ``ranks`` processes; the slowest rank's per phase (a
    re-init's: the median over the re-inits of the slowest rank's)."""
    port, sync_port = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INAGG_")}
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", backend, "--reinits", str(reinits)],
                              stdout=subprocess.PIPE, text=True,
                              env=env | {"RANK": str(r), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(r),
                                         "LOCAL_WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1",
                                         "MASTER_PORT": str(port), "SYNC_PORT": str(sync_port)})
             for r in range(ranks)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit(f"{backend}: a rank failed: {outs}")
    figures = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    slowest = {phase: max(f[phase] for f in figures) for phase in ("init", "first", "first_cpu")}
    for phase in ("reinit", "reinit_cpu"):
        slowest[phase] = statistics.median(max(f[phase][i] for f in figures) for i in range(reinits))
    return slowest


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--reinits", type=int, default=1, help="re-inits per run (their median is the run's)")
    parser.add_argument("--rank", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank_main(args.rank, args.reinits)
        return 0
    print("load before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    runs: dict[str, list[dict[str, float]]] = {"gloo": [], "inagg": []}
    for i in range(args.repeats):
        for backend in runs:   # interleaved: both see the same load
            runs[backend].append(one_run(backend, args.ranks, args.reinits))
            print(f"run {i} {backend}: " + " ".join(f"{p} {runs[backend][-1][p] * 1e3:.1f}" for p in PHASES) + " ms",
                  flush=True)
    print("load after:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    for backend, figures in runs.items():
        print(f"median {backend} ({args.ranks} ranks, {args.repeats} runs, {args.reinits} re-inits each): "
              + " ".join(f"{p} {statistics.median(f[p] for f in figures) * 1e3:.1f}" for p in PHASES) + " ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
