"""Sharded data-parallel training on the inagg backend: a plain FSDP script whose only
inagg-specific part is the backend string. Run it as any FSDP script::

    torchrun --nproc_per_node=2 examples/train_fsdp.py --fsdp 2                 # fully_shard
    torchrun --nproc_per_node=2 examples/train_fsdp.py --fsdp 1 --backend gloo  # FullyShardedDataParallel

FSDP's all-gathers of parameters go to gloo through the backend; its reduce-scatters of
gradients are allreduces on whichever path the backend chooses (``inagg.hostlib.pytorch.backend``).
``--out FILE`` (rank 0) saves the final full parameters, the losses and the backend's
statistics (tests compare inagg and gloo runs with it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard


def sharded_model(fsdp: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same seeded model on every rank, wrapped by FSDP1 or FSDP2: (wrapped, original)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 4))
    if fsdp == 1:
        return FullyShardedDataParallel(model, use_orig_params=True, device_id=torch.device("cpu")), model
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    return fully_shard(model), model


def full_parameters(model: torch.nn.Module, fsdp: int) -> list[list[float]]:
    """Every parameter in full on every rank (FSDP1: summoned; FSDP2: its shards gathered)."""
    if fsdp == 1:
        with FullyShardedDataParallel.summon_full_params(model):
            return [p.detach().view(-1).tolist() for p in model.parameters()]
    return [p.full_tensor().detach().view(-1).tolist() for p in model.parameters()]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="inagg")
    p.add_argument("--fsdp", type=int, choices=(1, 2), default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--out", help="rank 0 writes parameters and stats here (JSON)")
    args = p.parse_args()

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    wrapped, model = sharded_model(args.fsdp)
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(1 + rank)   # each rank its own shard of the data
    losses = []
    for _ in range(args.steps):
        x = torch.randn(16, 32, generator=data)
        loss = torch.nn.functional.mse_loss(wrapped(x), x[:, :4] * 2.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = full_parameters(wrapped if args.fsdp == 1 else model, args.fsdp)
    if args.out and rank == 0:
        stats = dist.group.WORLD.stats() if args.backend == "inagg" else {}
        with open(args.out, "w") as f:
            json.dump({"params": params, "losses": losses, "stats": stats, "world": world}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # as examples/train_ddp.py: leave without the interpreter's teardown once every group is gone
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
