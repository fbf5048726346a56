"""Data-parallel training on the inagg backend: a plain DDP script whose only inagg-specific part
is the backend string. Run it as any DDP script::

    torchrun --nproc_per_node=4 examples/train_ddp.py                 # inagg (one host: shared memory)
    torchrun --nproc_per_node=4 examples/train_ddp.py --backend gloo  # the same with gloo

With no ``INAGG_CONTROLLER`` set and every rank on this host, the ranks reduce through shared
memory and start nothing; with ``INAGG_HOST_REDUCE=off`` (every rank a switch worker) the job
brings up its own software switch, controller and host aggregator on loopback and stops them at
the end. ``--hook powersgd|fp16`` registers one of
PyTorch's own comm hooks, ``--hook artopk`` inagg's AR-Topk hook (``artopk-adaptive``: dense
or AR-Topk per step, whichever the measured model prices lower); ``--out FILE`` (rank 0) saves the final parameters and the backend's
statistics (tests compare inagg and gloo runs with it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel as DDP


def register_hook(ddp: DDP, hook: str):
    """One of PyTorch's comm hooks, or none; returns its state (checkpointable for PowerSGD)."""
    if hook == "powersgd":
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                       start_powerSGD_iter=3, use_error_feedback=True, warm_start=True)
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)
        return state
    if hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    if hook.startswith("artopk"):   # inagg's own: lossy (top-k with error feedback), only when asked
        from inagg.hostlib.pytorch.hooks import ARTopkHookState, artopk_hook

        state = ARTopkHookState(process_group=None, cr=0.1, adaptive=hook == "artopk-adaptive")
        ddp.register_comm_hook(state, artopk_hook)
        return state
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="inagg")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--hook", choices=("none", "powersgd", "fp16", "artopk", "artopk-adaptive"), default="none")
    p.add_argument("--compile", choices=("none", "model", "ddp"), default="none",
                   help="model: DDP(torch.compile(model)); ddp: torch.compile(DDP(model))")
    p.add_argument("--compile-backend", default="inductor", help="torch.compile's backend")
    p.add_argument("--out", help="rank 0 writes parameters and stats here (JSON)")
    args = p.parse_args()

    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    ddp = DDP(torch.compile(model, backend=args.compile_backend) if args.compile == "model" else model)
    hook_state = register_hook(ddp, args.hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    if args.compile == "ddp":
        ddp = torch.compile(ddp, backend=args.compile_backend)
    data = torch.Generator().manual_seed(1 + rank)   # each rank its own shard
    losses = []
    for _ in range(args.steps):
        x = torch.randn(16, 32, generator=data)
        y = x[:, :4] * 2.0
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total)                      # a metric, summed over ranks
        losses.append(total.item() / world)
    if rank == 0:
        print(f"{args.backend}: loss {losses[0]:.4f} -> {losses[-1]:.4f} over {args.steps} steps", flush=True)
    if args.out and rank == 0:
        stats = dist.group.WORLD.stats() if args.backend == "inagg" else {}
        with open(args.out, "w") as f:
            json.dump({"params": [t.detach().view(-1).tolist() for t in model.parameters()],
                       "losses": losses, "stats": stats,
                       "hook_choice": getattr(hook_state, "last_choice", None)}, f)
    # no rank tears its group down while another is still in a collective (and see the end)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Everything is written and every group is destroyed: leave without the interpreter's own
    # teardown, during which gloo's workers may still let go of a tensor Python owns and abort
    # the process (docs/results/torch_edges.md); an error above still exits non-zero.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
