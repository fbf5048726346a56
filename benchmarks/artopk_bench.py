"""AR-Topk vs dense on the digits demo (4 workers, the embedded default deployment): final
accuracy, bytes each worker put on the wire, time per step; and the cost of AR-Topk's top-k
selection vs torch.topk alone on a gradient of the same size."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from inagg.bmv2_env.emulation.loopback import LoopbackDeployment  # noqa: E402
from inagg.hostlib.worker.artopk import k_for, topk_indices  # noqa: E402
from inagg.bmv2_env.demos.train_demo import TrainConfig, train  # noqa: E402


def topk_overhead(numel: int, cr: float, reps: int = 50) -> tuple[float, float]:
    import torch
    x = np.random.default_rng(0).standard_normal(numel).astype(np.float32)
    k = k_for(cr, numel)
    t = torch.from_numpy(x)
    t0 = time.perf_counter()
    for _ in range(reps):
        topk_indices(x, k)
    ours = (time.perf_counter() - t0) / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.topk(t.abs(), k, sorted=False)
    return ours, (time.perf_counter() - t0) / reps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--cr", type=float, default=0.01)
    args = p.parse_args()
    runs = {}
    for hook in ("inagg", "artopk"):
        with LoopbackDeployment(4) as dep:
            runs[hook] = train(TrainConfig(workers=4, epochs=args.epochs, hook=hook, cr=args.cr), dep.controller, bind_ips=dep.worker_ips)
    dense, sparse = runs["inagg"], runs["artopk"]
    sent = {h: np.mean([s["wire_bytes_sent"] for s in r.stats]) for h, r in runs.items()}
    print(f"digits MLP, 4 workers, {args.epochs} epochs, software data plane on loopback")
    for h, r in runs.items():
        print(f"  {h:>6}: accuracy {100 * r.epochs[-1][1]:.2f}%  {sent[h] / 1e6:7.2f} MB sent per worker  "
              f"{r.seconds / r.steps * 1e3:6.1f} ms/step")
    print(f"  AR-Topk CR={args.cr}: accuracy difference {100 * (dense.epochs[-1][1] - sparse.epochs[-1][1]):+.2f} "
          f"points, {sent['inagg'] / sent['artopk']:.1f}x fewer bytes, time per step "
          f"{sparse.seconds / sparse.steps / (dense.seconds / dense.steps):.2f}x dense")
    numel = sum(p.size for p in dense.params)
    for n in (numel, 25_000_000):
        ours, torch_only = topk_overhead(n, args.cr, reps=50 if n < 1e6 else 3)
        print(f"  top-k of {n} values at CR={args.cr}: AR-Topk selection {ours * 1e3:.2f} ms, "
              f"torch.topk alone {torch_only * 1e3:.2f} ms ({ours / torch_only:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
