"""One rank of a job on a torch.distributed backend, for tests that time its start, kill its
ranks or interrupt it: started by torchrun or by a test (env:// rendezvous).

``python tests/backend_rank.py BACKEND startup``: prints ``init SECONDS`` (``init_process_group``'s
time), then leaves.

``python tests/backend_rank.py BACKEND loop ELEMENTS``: prints ``init`` once ``init_process_group``
returned, then allreduces a float32 tensor of ELEMENTS (on the path ``INAGG_ALLREDUCE_PATH``
names), printing ``ready`` after the first call, until one fails;
then prints ``error TIME TYPE: MESSAGE`` (TIME: time.time() when it was raised), times
``destroy_process_group`` and prints ``destroyed SECONDS``.

``python tests/backend_rank.py BACKEND ddp VICTIM STEP [kill|stop]``: DDP steps of a model whose
gradients fill several buckets; rank VICTIM SIGKILLs (``stop``: SIGSTOPs) itself inside its
backward pass of step STEP (a hook on its first layer's gradient: the buckets of the later
layers are in flight by then). Every
other rank prints ``error TIME TYPE: MESSAGE`` for the error it raised, then ``destroyed``.

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
        return report_and_destroy(e)


def report_and_destroy(error: Exception) -> int:
    """Tell the test when and how the loop ended, then how long destroying the group took."""
    print(f"error {time.time():.3f} {type(error).__name__}: {error}", flush=True)
    started = time.perf_counter()
    dist.destroy_process_group()
    print(f"destroyed {time.perf_counter() - started:.3f}", flush=True)
    return 1


def ddp_killed_in_backward(backend: str, victim: int, kill_step: int, how: str = "kill") -> int:
    import faulthandler
    import os
    import signal

    faulthandler.enable()
    dist.init_process_group(backend)
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers = [torch.nn.Linear(256, 256) for _ in range(8)]
    model = DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=0.25)
    step = 0

    def kill_self(grad: torch.Tensor) -> torch.Tensor:
        if rank == victim and step == kill_step:
            os.kill(os.getpid(), signal.SIGSTOP if how == "stop" else signal.SIGKILL)
        return grad

    layers[0].weight.register_hook(kill_self)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    print("init", flush=True)
    try:
        while True:
            step += 1
            loss = model(torch.randn(32, 256)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    except Exception as e:  # noqa: BLE001 - reported to the test
        return report_and_destroy(e)


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
    elif mode == "ddp":
        return ddp_killed_in_backward(backend, int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:6])
    elif mode == "train":
        train(backend)
    else:
        raise SystemExit(f"unknown mode {mode!r}: startup, loop or train")
    return 0


if __name__ == "__main__":
    sys.exit(main())
