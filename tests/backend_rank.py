"""One rank of a job on a torch.distributed backend, for tests that time its start, kill its
ranks or interrupt it: started by torchrun or by a test (env:// rendezvous).

``python tests/backend_rank.py BACKEND startup``: prints ``init SECONDS`` (``init_process_group``'s
time), allreduces one float32, prints ``loaded [NAMES]`` (the modules of ``LAZY`` it imported by
then, comma-separated), then leaves.

``python tests/backend_rank.py BACKEND loop ELEMENTS``: prints ``init`` once ``init_process_group``
returned, then allreduces a float32 tensor of ELEMENTS (on the path ``INAGG_ALLREDUCE_PATH``
names), printing ``ready`` after the first call, until one fails;
then prints ``error TIME TYPE: MESSAGE`` (TIME: time.time() when it was raised), times
``destroy_process_group`` and prints ``destroyed SECONDS``.

``python tests/backend_rank.py BACKEND after COLLECTIVE``: prints ``init`` once
``init_process_group`` returned, waits for a line on stdin (the test ends a rank meanwhile), then
runs COLLECTIVE (``broadcast`` of 4 float32, or ``allreduce`` of 64 KiB: a gloo group's first
call) until one fails; reports as ``loop`` does.

``python tests/backend_rank.py BACKEND ddp VICTIM STEP [kill|stop]``: DDP steps of a model whose
gradients fill several buckets; rank VICTIM SIGKILLs (``stop``: SIGSTOPs) itself inside its
backward pass of step STEP (a hook on its first layer's gradient: the buckets of the later
layers are in flight by then). Every
other rank prints ``error TIME TYPE: MESSAGE`` for the error it raised, then ``destroyed``.

``python tests/backend_rank.py BACKEND train``: DDP steps of a small model until interrupted;
rank 0 prints ``step N`` every 10 steps.

``python tests/backend_rank.py BACKEND report``: with inagg's loggers at INFO on stderr
(``NAME LEVEL MESSAGE``), 64 float32 allreduces of 4 B to 64 KiB (rank 1 late by 0.3 s before
every 16th: the agreements wait for it), 16 int32 ones and, each twice, an int64, a MAX, a
float64 allreduce and a broadcast; then prints ``stats JSON`` (the group's ``stats()``, with
``sent``: the bytes this rank allreduced, and ``children``: this process's child processes).
"""

import json
import logging
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

# what a job whose ranks all share one host never needs: the switch's communicator (its streams
# and transports), the controller's gRPC client and stubs (``startup`` reports which were loaded)
LAZY = ("inagg.hostlib.worker.communicator", "inagg.hostlib.jobservice", "grpc")

def startup(backend: str) -> None:
    started = time.perf_counter()
    dist.init_process_group(backend)
    print(f"init {time.perf_counter() - started:.3f}", flush=True)
    dist.all_reduce(torch.ones(1))
    loaded = ",".join(m for m in LAZY if m in sys.modules)
    os.write(sys.stdout.fileno(), f"loaded [{loaded}]\n".encode())   # one write: the ranks' lines may interleave
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


def after(backend: str, collective: str) -> int:
    dist.init_process_group(backend)
    print("init", flush=True)
    sys.stdin.readline()
    x = torch.ones(4 if collective == "broadcast" else 16384)
    call = (lambda: dist.broadcast(x, 0)) if collective == "broadcast" else (lambda: dist.all_reduce(x))
    try:
        while True:
            call()
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


def report(backend: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    logging.getLogger("inagg").addHandler(handler)
    logging.getLogger("inagg").setLevel(logging.INFO)
    dist.init_process_group(backend)
    sent = 0
    for i in range(64):
        if dist.get_rank() == 1 and i % 16 == 15:
            time.sleep(0.3)
        x = torch.ones(4 ** (i % 8))
        dist.all_reduce(x)
        sent += x.nbytes
    for i in range(16):
        x = torch.ones(256, dtype=torch.int32)
        dist.all_reduce(x)
        sent += x.nbytes
    for _ in range(2):
        for x, op in ((torch.ones(8, dtype=torch.int64), dist.ReduceOp.SUM), (torch.ones(8), dist.ReduceOp.MAX),
                      (torch.ones(8, dtype=torch.float64), dist.ReduceOp.SUM)):
            dist.all_reduce(x, op)
            sent += x.nbytes
        dist.broadcast(torch.ones(8), 0)
    children = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()
    stats = dist.group.WORLD.stats()
    print("stats " + json.dumps({"sent": sent, "children": children, "controller": stats["controller"],
                                 "carriers": stats["carriers"], "inagg": stats["inagg"]}), flush=True)
    dist.destroy_process_group()


def main() -> int:
    backend, mode = sys.argv[1:3]
    if mode == "startup":
        startup(backend)
    elif mode == "loop":
        return loop(backend, int(sys.argv[3]))
    elif mode == "after":
        return after(backend, sys.argv[3])
    elif mode == "ddp":
        return ddp_killed_in_backward(backend, int(sys.argv[3]), int(sys.argv[4]), *sys.argv[5:6])
    elif mode == "train":
        train(backend)
    elif mode == "report":
        report(backend)
    else:
        raise SystemExit(f"unknown mode {mode!r}: startup, loop, after, ddp, train or report")
    return 0


if __name__ == "__main__":
    sys.exit(main())
