"""One rank of a job on a torch.distributed backend, for tests that time its start, kill its
ranks or interrupt it: started by torchrun or by a test (env:// rendezvous).

``python tests/backend_rank.py BACKEND startup``: prints ``init SECONDS`` (``init_process_group``'s
time), then leaves.

``python tests/backend_rank.py BACKEND loop ELEMENTS``: prints ``init`` once ``init_process_group``
returned, then allreduces a float32 tensor of ELEMENTS (on the path ``INAGG_ALLREDUCE_PATH``
names), printing ``ready`` after the first call, until one fails;
then prints ``error TIME TYPE: MESSAGE`` (TIME: time.time() when it was raised), times
``destroy_process_group`` and prints ``destroyed SECONDS``.

``python tests/backend_rank.py BACKEND train``: DDP steps of a small model until interrupted;
rank 0 prints ``step N`` every 10 steps.
"""

import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def startup(backend: str) -> None:
    started = time.perf_counter()
    dist.init_process_group(backend)
    print(f"init {time.perf_counter() - started:.3f}", flush=True)
    dist.destroy_process_group()


def loop(backend: str, elements: int) -> int:
    dist.init_process_group(backend)
    print("init", flush=True)
    x = torch.ones(elements)
    try:
        dist.all_reduce(x)
        print("ready", flush=True)
        while True:
            x.fill_(1.0)
            dist.all_reduce(x)
    except Exception as e:  # noqa: BLE001 - reported to the test
        print(f"error {time.time():.3f} {type(e).__name__}: {e}", flush=True)
    started = time.perf_counter()
    dist.destroy_process_group()
    print(f"destroyed {time.perf_counter() - started:.3f}", flush=True)
    return 1


def train(backend: str) -> None:
    dist.init_process_group(backend)
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                                        torch.nn.Linear(1024, 256)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while True:
        loss = model(torch.randn(64, 256)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if dist.get_rank() == 0 and step % 10 == 0:
            print(f"step {step}", flush=True)


def main() -> int:
    backend, mode = sys.argv[1:3]
    if mode == "startup":
        startup(backend)
    elif mode == "loop":
        return loop(backend, int(sys.argv[3]))
    elif mode == "train":
        train(backend)
    else:
        raise SystemExit(f"unknown mode {mode!r}: startup, loop or train")
    return 0


if __name__ == "__main__":
    sys.exit(main())
