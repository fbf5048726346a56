"""One rank of a job on the ``inagg`` backend, for the host-local reduce's tests: started by
torchrun or by a test (env:// rendezvous: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

``python tests/host_reduce_rank.py OUT_DIR exact [LARGEST]``: a fixed series of allreduces (float32 from
one-round sizes to several MiB, blocks of very different magnitudes and all-zero blocks, AVG,
bfloat16 and float16 (their bits saved as int16 and float16), int32 that wraps; float32 calls of at most LARGEST values), each rank's inputs seeded by its
rank (``inputs``); writes the results to
OUT_DIR/rank<R>.npz and the process group's stats (and its grant's K) to OUT_DIR/rank<R>.json.

``python tests/host_reduce_rank.py OUT_DIR loop [VALUES]``: allreduces of VALUES float32 zeros (65536
by default; a few: the tiny calls C++ runs) until an error, then prints ``error TIME TYPE: MESSAGE``
(TIME: time.time()) on stdout; prints ``ready`` once the group is up.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from inagg.hostlib.wire import codec  # noqa: E402

SIZES = (3, 5, 100, 4099, 65536 + 7, 3 << 20)


def inputs(rank: int, largest: int) -> list[tuple[str, torch.Tensor, dist.ReduceOp]]:
    rng = np.random.default_rng(rank)
    calls = []
    for n in (n for n in SIZES if n <= largest):
        x = rng.standard_normal(n).astype(np.float32)
        x *= np.float32(2.0) ** rng.integers(-30, 30, size=n).astype(np.float32)   # magnitudes apart
        x[n // 2: n // 2 + min(n // 4, 200)] = 0                                    # zero blocks
        calls.append((f"float{n}", torch.from_numpy(x), dist.ReduceOp.SUM))
    calls.append(("avg", torch.from_numpy(rng.standard_normal(5000).astype(np.float32)), dist.ReduceOp.AVG))
    for name in ("bfloat16", "float16"):   # quantized from their own format
        for n in (7, 70000):   # rides in the control round; blocks
            calls.append((f"{name}{n}", half(rng.standard_normal(n).astype(np.float32), name), dist.ReduceOp.SUM))
        calls.append((f"{name}avg", half(rng.standard_normal(n).astype(np.float32), name), dist.ReduceOp.AVG))
    ints = rng.integers(-2**31, 2**31, size=70000, dtype=np.int64).astype(np.int32)   # sums wrap
    calls.append(("int", torch.from_numpy(ints), dist.ReduceOp.SUM))
    return calls


def half(x: np.ndarray, name: str) -> torch.Tensor:
    """float32 ``x`` rounded to a bfloat16 or float16 tensor by numpy: no torch kernel runs, so a
    test may still fork rank processes after building the inputs (OpenMP's pool does not survive
    a fork)."""
    if name == "float16":
        return torch.from_numpy(x.astype(np.float16))
    bits = codec.narrow(x, np.empty(x.size, codec.BFLOAT16)).view(np.int16)
    return torch.from_numpy(bits).view(torch.bfloat16)


def saved(tensor: torch.Tensor) -> np.ndarray:
    """A result as numpy keeps it: a bfloat16 tensor's bits as int16 (numpy has no bfloat16)."""
    return tensor.view(torch.int16).numpy() if tensor.dtype == torch.bfloat16 else tensor.numpy()


def exact(out_dir: str, rank: int, largest: int) -> None:
    results = {}
    for name, tensor, op in inputs(rank, largest):
        dist.all_reduce(tensor, op=op)
        results[name] = saved(tensor)
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **results)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        comm = dist.group.WORLD.lifecycle.comm   # a job on one host has no grant: its K is its own
        k = comm.grant.values_per_packet if comm.grant is not None else comm.k
        json.dump(dist.group.WORLD.stats() | {"k": k}, f, default=str)


def loop(values: int) -> None:
    print("ready", flush=True)
    x = torch.zeros(values)
    while True:
        try:
            dist.all_reduce(x)
        except Exception as e:  # noqa: BLE001 - reported to the test
            print(f"error {time.time():.3f} {type(e).__name__}: {e}", flush=True)
            os._exit(1)   # the group cannot be shut down cleanly with a rank gone
        time.sleep(0.01)


def main() -> int:
    out_dir, what = sys.argv[1:3]
    dist.init_process_group("inagg")
    rank = dist.get_rank()
    if what == "exact":
        exact(out_dir, rank, int(sys.argv[3]) if len(sys.argv) > 3 else max(SIZES))
    else:
        loop(int(sys.argv[3]) if len(sys.argv) > 3 else 1 << 16)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
