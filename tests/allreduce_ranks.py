"""One rank of a torchrun job on the backend string that allreduces seeded tensors of every
eligible float dtype: ``torchrun --nproc_per_node=2 tests/allreduce_ranks.py --out OUT``.

Each case (dtype, size, op) allreduces this rank's tensor as it is, then the same values as
float32 (the reference), on whatever path ``INAGG_ALLREDUCE_PATH`` pins. Rank 0 writes OUT
(JSON): per case the result's and the reference's bits, and the backend's stats. Sizes cover a
call that rides in the control round and one of several packets (K = 4096 locally)."""

import json
import os
import sys

import torch
import torch.distributed as dist

SIZES = (5, 300, 9000)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG}


def values(rank: int, size: int, dtype: torch.dtype) -> torch.Tensor:
    """This rank's seeded values: a spread of magnitudes, as gradients have, in ``dtype``."""
    g = torch.Generator().manual_seed(1000 * rank + size)
    x = torch.randn(size, generator=g) * torch.exp2(torch.randint(-12, 4, (size,), generator=g).float())
    return x.to(dtype)


def bits(t: torch.Tensor) -> list[int]:
    """The tensor's bit patterns (exact comparisons, NaN and -0 included)."""
    view = {2: torch.int16, 4: torch.int32}[t.element_size()]
    return t.view(view).tolist()


def cases(rank: int) -> list[dict]:
    out = []
    for name, dtype in DTYPES.items():
        for size in SIZES:
            for op_name, op in OPS.items():
                x = values(rank, size, dtype)
                reference = x.float()
                dist.all_reduce(x, op)
                dist.all_reduce(reference, op)
                out.append({"dtype": name, "size": size, "op": op_name, "result": bits(x),
                            "reference": bits(reference.to(dtype))})
    return out


def main() -> None:
    dist.init_process_group("inagg")
    results = cases(dist.get_rank())
    if dist.get_rank() == 0:
        with open(sys.argv[sys.argv.index("--out") + 1], "w") as f:
            json.dump({"cases": results, "stats": dist.group.WORLD.stats()}, f)
    dist.destroy_process_group()   # rank 0 waits there for every rank to leave the job


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)   # as examples/train_ddp.py: no interpreter teardown under gloo's threads
