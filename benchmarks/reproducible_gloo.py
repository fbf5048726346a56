"""What bit-reproducible results cost on the gloo path: plain gloo's float allreduce against
inagg's fixed point over gloo (``inagg.hostlib.pytorch.reproducible.FixedPointGloo``: exponents agreed
by a MAX allreduce, int32 sums) at a few sizes and dtypes, 2 ranks on this machine.

Calls alternate A B B A (plain, fixed, fixed, plain), each after a barrier on a third gloo group,
so the machine's load moves both alike; a call's time is rank 0's. Prints per size each median
and their ratio, and the load average before and after (``python benchmarks/reproducible_gloo.py``)."""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from inagg.hostlib.pytorch.reproducible import FixedPointGloo
from inagg.hostlib.wire.grant import HOST_VALUES_PER_PACKET
from inagg.hostlib.worker.stream_base import Reduction

SIZES = (1 << 10, 64 << 10, 1 << 20, 16 << 20)   # bytes
DTYPES = (torch.float32, torch.bfloat16)


def timed(call, barrier: dist.ProcessGroup) -> float:
    barrier.barrier().wait()
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def measure(rank: int, store_path: str, rounds: int, out: dict) -> None:
    store = dist.FileStore(store_path, 2)
    timeout = timedelta(seconds=120)
    plain = dist.ProcessGroupGloo(dist.PrefixStore("plain", store), rank, 2, timeout)
    barrier = dist.ProcessGroupGloo(dist.PrefixStore("barrier", store), rank, 2, timeout)
    # the local deployment's K on both paths; 2 ranks ride up to (K - 4) / 10 values
    fixed_gloo = dist.ProcessGroupGloo(dist.PrefixStore("fixed", store), rank, 2, timeout)
    fixed = FixedPointGloo(lambda: fixed_gloo, 2, Reduction(HOST_VALUES_PER_PACKET, (HOST_VALUES_PER_PACKET - 4) // 10))
    for dtype in DTYPES:
        for nbytes in SIZES:
            x = torch.randn(nbytes // torch.tensor([], dtype=dtype).element_size()).to(dtype)
            systems = {"gloo": lambda: plain.allreduce([x.clone()]).wait(),
                       "fixed": lambda: fixed.allreduce(x.clone(), 1, inline_if_idle=True).wait()}
            times = {name: [] for name in systems}
            for _ in range(rounds):
                for name in ("gloo", "fixed", "fixed", "gloo"):
                    times[name].append(timed(systems[name], barrier))
            out[(str(dtype), nbytes)] = {name: statistics.median(t) for name, t in times.items()}
    fixed.close()


def worker(rank: int, store_path: str, rounds: int, results) -> None:
    out: dict = {}
    measure(rank, store_path, rounds, out)
    if rank == 0:
        results.update(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=10, help="A B B A rotations per size")
    args = p.parse_args()
    print(f"load average before: {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(worker, args=(f"{tmp}/store", args.rounds, results), nprocs=2)
        print(f"load average after: {os.getloadavg()}")
        print(f"{'dtype':16} {'bytes':>10} {'gloo ms':>9} {'fixed ms':>9} {'fixed/gloo':>10}")
        for (dtype, nbytes), t in sorted(results.items()):
            print(f"{dtype:16} {nbytes:>10} {1e3 * t['gloo']:>9.3f} {1e3 * t['fixed']:>9.3f} "
                  f"{t['fixed'] / t['gloo']:>10.2f}")


if __name__ == "__main__":
    main()
