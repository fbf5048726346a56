"""``inagg-demo``: data-parallel training of a small MLP on scikit-learn's bundled digits data,
4 processes, gradients averaged through inagg by the DDP comm hook, on the embedded default
deployment (software data plane + controller + host aggregator on loopback). Then the same
training with plain gloo DDP, for comparison of the final accuracy.

``train(...)`` is also the harness of the training tests and of the AR-Topk benchmark.

In the emulation (``worker_main``, one process per rank) a job may train another model of the
zoo (``TrainConfig.model``: workloads.py) or replay a synthetic gradient profile
(``TrainConfig.profile``), for ``epochs`` over its data, a number of ``iterations`` or a
``duration`` in seconds (rank 0's clock decides, broadcast every step so that every rank stops
at the same step); its final report says its gradient bytes per step and the wall-clock times
of its first and last step, from which the launcher's summary computes completion time and
throughput.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, NoReturn

import numpy as np

from inagg.bmv2_env.demos import workloads
from inagg.bmv2_env.emulation.forked import exit_now
from inagg.hostlib import add_version_flag
from inagg.hostlib.errors import InaggSetupError


@dataclass
class TrainConfig:
    workers: int = 4
    epochs: int = 12
    batch: int = 16          # per worker
    lr: float = 0.1
    hidden: int = 128
    hook: str = "inagg"      # "inagg", "artopk" or "gloo" (no hook)
    cr: float = 0.01         # AR-Topk compression ratio
    selection: str = "star"
    adaptive: bool = False   # AR-Topk hook: pick dense or AR-Topk per step by the cost model
    drain_at_step: int = -1  # ask the controller to move the job to host mode at this step
    transport: str = "udp"   # "roce": RoCEv2 to the switch (raw sockets: root, emulation only)
    job_name: str = ""       # the job's name at the controller (default: the hook's name)
    seed: int = 0
    model: str = "mlp"       # workloads.MODELS
    profile: dict | None = None   # a synthetic gradient profile instead of a model (workloads.py)
    iterations: int = 0      # steps to take instead of epochs over the data (0: epochs)
    duration: float = 0.0    # seconds to train instead (0: epochs or iterations)


@dataclass
class TrainResult:
    epochs: list[tuple[float, float]] = field(default_factory=list)  # (train loss, test accuracy)
    params: list[np.ndarray] = field(default_factory=list)
    stats: list[dict] = field(default_factory=list)                   # per rank (inagg hooks)
    seconds: float = 0.0
    steps: int = 0
    workload: list[dict] = field(default_factory=list)   # per rank: grad_bytes, started, finished


def steps_per_epoch(samples: int, workers: int, batch: int) -> int:
    """Steps every rank takes per epoch: the same on all ranks (each allreduce needs every rank),
    from the smallest rank's share of ``samples`` (rank r gets samples r, r + workers, ...)."""
    return (samples // workers) // batch


def run_worker(rank: int, cfg: TrainConfig, dist_file: str, rdv_file: str, controller: str | None,
               admin: tuple[str, str] | None, report, bind_ip: str | None = None,
               before_join=None, before_training=None) -> None:
    """One training process. ``report(message)`` receives ("epoch", epoch, loss, accuracy) from
    rank 0 and ("done", rank, params or None, inagg stats or None, seconds, steps, workload)
    from all (workload: gradient bytes per step, wall-clock start and end of training);
    ``before_join()`` and ``before_training()``, when given, run (and may wait) just before the
    job joins the controller and once it holds its grant, before the first step."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    torch.manual_seed(cfg.seed)
    dist.init_process_group("gloo", init_method=f"file://{dist_file}", rank=rank, world_size=cfg.workers)
    model = None if cfg.profile else workloads.build_model(cfg.model, cfg.hidden)
    ddp = DDP(model, bucket_cap_mb=64) if model is not None else None
    comm = None
    if before_join is not None:
        before_join()
    if cfg.hook != "gloo":
        comm = _hook_to_inagg(ddp, model, rank, cfg, rdv_file, controller, bind_ip)
    if before_training is not None:
        before_training()
    started = time.time()
    if cfg.profile:
        seconds, steps = _profile_steps(comm, rank, cfg, report)
        params, grad_bytes = [], sum(cfg.profile["bucket_bytes"])
    else:
        drain = (lambda: _drain(admin, comm.job_id)) if rank == 0 and admin is not None else None
        seconds, steps = _train(ddp, model, rank, cfg, workloads.load_data(cfg.model, cfg.seed), report, drain)
        params = [p.detach().numpy().copy() for p in model.parameters()]
        grad_bytes = 4 * sum(p.size for p in params)
    workload = {"grad_bytes": grad_bytes, "started": started, "finished": time.time()}
    report(("done", rank, params if rank == 0 else None, comm.stats() if comm else None, seconds, steps, workload))
    if comm is not None:
        dist.barrier()
        _close(comm)
    dist.destroy_process_group()


def _close(comm) -> None:
    """Close a communicator, and its host group when its host reduces first (the group is the
    opener's to close)."""
    from inagg.hostlib.worker.host_communicator import HostCommunicator

    comm.close()
    if isinstance(comm, HostCommunicator):
        comm.group.close()


def _communicator(rank: int, cfg: TrainConfig, rdv_file: str, controller: str | None,
                  bind_ip: str | None, nbytes: int):
    """This rank's communicator of the job (its demand: ``nbytes`` every 50 ms): every rank a
    worker, or, where ``INAGG_HOST_REDUCE=auto`` and a host runs several ranks, each host's
    ranks reducing in shared memory first and its leader the host's worker
    (``inagg.hostlib.worker.host_communicator``). Unlike the backend, the demo reduces on its hosts only
    when ``INAGG_HOST_REDUCE=auto`` is set (the emulation's ``host_reduce`` jobs)."""
    from datetime import timedelta

    import torch.distributed as dist
    from inagg.hostlib.worker.communicator import Communicator
    from inagg.hostlib.worker.host_communicator import (HOST_REDUCE_ENV, HostCommunicator, host_reduce_setting,
                                                open_host_group)

    store, _, _ = next(dist.rendezvous(f"file://{rdv_file}?rank={rank}&world_size={cfg.workers}"))
    group = None   # every rank a worker, so the demo shows the switch's sums, unless asked
    if host_reduce_setting(default="off") == "auto":
        if cfg.hook == "artopk":
            raise InaggSetupError(f"{HOST_REDUCE_ENV}=auto: the artopk hook needs every rank a worker of the job; "
                                  f"set it to off or use the inagg hook")
        group = open_host_group(dist.PrefixStore("host", store), rank, cfg.workers, timedelta(seconds=120))

    def join(worker: int, size: int) -> Communicator:
        return Communicator(dist.PrefixStore("job", store), worker, size, controller,
                            bind_ip=bind_ip or "127.0.0.1", bytes_per_iteration=nbytes, iteration_seconds=0.05,
                            name=cfg.job_name or cfg.hook, transport=cfg.transport)
    return join(rank, cfg.workers) if group is None else HostCommunicator(group, join)


def _hook_to_inagg(ddp, model, rank: int, cfg: TrainConfig, rdv_file: str, controller: str | None,
                   bind_ip: str | None):
    """Join the job and average DDP's gradient buckets through it with the config's hook (no
    hook for a profile, ``model`` None); returns the communicator (``_communicator``)."""
    from inagg.hostlib.pytorch.hooks import ARTopkHookState, InaggHookState, artopk_hook, inagg_hook

    if model is None:   # a synthetic profile: its buckets, allreduced by _profile_steps
        return _communicator(rank, cfg, rdv_file, controller, bind_ip, sum(cfg.profile["bucket_bytes"]))
    nbytes = 4 * sum(p.numel() for p in model.parameters())
    comm = _communicator(rank, cfg, rdv_file, controller, bind_ip, nbytes)
    if cfg.hook == "inagg":
        ddp.register_comm_hook(InaggHookState(comm), inagg_hook)
    else:
        ddp.register_comm_hook(ARTopkHookState(comm, cr=cfg.cr, selection=cfg.selection,
                                               adaptive=cfg.adaptive), artopk_hook)
    return comm


def _drain(admin: tuple[str, str], job_id: int) -> None:
    """Ask the controller at ``admin[0]`` (admin token ``admin[1]``) to move the job to host mode."""
    from inagg.hostlib.jobservice.client import ControllerClient
    c = ControllerClient(admin[0])
    c.drain(admin[1], job_id)
    c.close()


def _stopper(cfg: TrainConfig, per_epoch: int) -> Callable[[int], bool]:
    """Whether to take step ``steps`` (0, 1, ...): ``iterations`` steps, ``duration`` seconds
    (rank 0's clock, broadcast over gloo at every step, so every rank stops at the same step),
    else ``epochs`` over the data."""
    if cfg.duration:
        import torch
        import torch.distributed as dist

        t0 = time.perf_counter()

        def before_deadline(steps: int) -> bool:
            flag = torch.tensor([int(time.perf_counter() - t0 < cfg.duration)])
            dist.broadcast(flag, 0)
            return bool(flag.item())
        return before_deadline
    limit = cfg.iterations or cfg.epochs * per_epoch
    return lambda steps: steps < limit


def _train(ddp, model, rank: int, cfg: TrainConfig, data: tuple, report,
           drain: Callable[[], None] | None) -> tuple[float, int]:
    """SGD over this rank's share of the training set (every ``cfg.workers``-th sample, shuffled
    per epoch by the seed) until ``_stopper`` says, ``drain()`` at step ``cfg.drain_at_step``;
    rank 0 reports each epoch's loss and test accuracy (and the last, partial epoch's). Returns
    (seconds, steps)."""
    import torch

    xtr, ytr, xte, yte = data
    opt = torch.optim.SGD(ddp.parameters(), lr=cfg.lr)
    mine = np.arange(rank, len(ytr), cfg.workers)
    xt, yt = torch.from_numpy(xtr), torch.from_numpy(ytr)
    steps, t0, losses = 0, time.perf_counter(), []
    per_epoch = steps_per_epoch(len(ytr), cfg.workers, cfg.batch)
    go = _stopper(cfg, per_epoch)
    while go(steps):
        epoch, b = divmod(steps, per_epoch)
        if b == 0:
            order = mine[np.random.default_rng([cfg.seed, epoch]).permutation(len(mine))]
        idx = torch.from_numpy(order[b * cfg.batch:(b + 1) * cfg.batch])
        loss = workloads.loss(ddp(xt[idx]), yt[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        steps += 1
        if steps == cfg.drain_at_step and drain is not None:
            drain()
        if steps % per_epoch == 0:
            _report_epoch(model, rank, epoch, losses, xte, yte, report)
            losses = []
    if losses:
        _report_epoch(model, rank, steps // per_epoch, losses, xte, yte, report)
    return time.perf_counter() - t0, steps


def _report_epoch(model, rank: int, epoch: int, losses: list[float], xte, yte, report) -> None:
    """Rank 0 reports an epoch's mean loss and the model's test accuracy."""
    import torch

    with torch.no_grad():
        acc = workloads.accuracy(model(torch.from_numpy(xte)), torch.from_numpy(yte))
    if rank == 0:
        report(("epoch", epoch, float(np.mean(losses)), acc))


def _profile_steps(comm, rank: int, cfg: TrainConfig, report) -> tuple[float, int]:
    """A synthetic profile's steps until ``_stopper`` says: each waits ``compute_ms`` (the
    model's arithmetic), then runs the profile's collective on one float32 tensor of ones per
    bucket through the job's communicator (gloo without one); a sum that is not the number of
    workers is an error. Rank 0 reports one epoch (no loss, no accuracy). Returns (seconds, steps)."""
    tensors = workloads.profile_tensors(cfg.profile)
    scatter = cfg.profile.get("collective") == "reduce_scatter"
    go = _stopper(cfg, 1)
    steps, t0 = 0, time.perf_counter()
    while go(steps):
        time.sleep(cfg.profile.get("compute_ms", 0) / 1000)
        for t in tensors:
            t.fill_(1.0)
            out = _profile_call(comm, t, cfg.workers, scatter)
            if out.numel() and not bool((out == cfg.workers).all()):
                raise RuntimeError(f"profile step {steps}: the sum of ones over {cfg.workers} workers is not "
                                   f"{cfg.workers} everywhere (e.g. {float(out[0])})")
        steps += 1
    if rank == 0:
        report(("epoch", 0, 0.0, 0.0))
    return time.perf_counter() - t0, steps


def _profile_call(comm, tensor, workers: int, scatter: bool):
    """One bucket's collective: the allreduce of ``tensor`` in place (returned), or with
    ``scatter`` its reduce-scatter: this rank's shard of the sum (a new tensor), whose other
    blocks' values the aggregator keeps from it (docs/protocol.md, "Reduce-scatter")."""
    import torch
    import torch.distributed as dist

    if not scatter:
        comm.allreduce(tensor) if comm is not None else dist.all_reduce(tensor)
        return tensor
    out = torch.empty(tensor.numel() // workers, dtype=tensor.dtype)
    if comm is not None:
        comm.reduce_scatter_async(tensor, out).wait()
    else:
        dist.reduce_scatter_tensor(out, tensor)
    return out


def train(cfg: TrainConfig, controller: str | None = None, admin: tuple[str, str] | None = None,
          on_epoch=None, timeout: float = 600.0, bind_ips: list[str] | None = None) -> TrainResult:
    """Run one training job with ``cfg.workers`` processes; ``on_epoch(epoch, loss, acc)``;
    rank r binds ``bind_ips[r]`` (a loopback deployment's worker addresses). The ranks are
    spawned, not forked from a fork server: that server is one per process, and its imports are
    whichever caller set them last (the torch suite's, in a test process)."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    result = TrainResult()
    with tempfile.TemporaryDirectory() as d:
        procs = [ctx.Process(target=run_worker, args=(r, cfg, f"{d}/dist", f"{d}/rdv", controller, admin, q.put,
                                                       bind_ips[r] if bind_ips else None),
                             daemon=True) for r in range(cfg.workers)]
        for p in procs:
            p.start()
        done = 0
        result.stats = [None] * cfg.workers
        result.workload = [{}] * cfg.workers
        deadline = time.time() + timeout
        while done < cfg.workers:
            try:
                msg = q.get(timeout=1.0)
            except queue.Empty:
                failed = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode not in (None, 0)}
                if failed or time.time() > deadline:
                    for p in procs:
                        p.kill()
                    raise RuntimeError(f"training did not finish: worker exit codes {failed or 'none'}"
                                       f"{'' if failed else f', timeout {timeout}s'}") from None
                continue
            if msg[0] == "epoch":
                result.epochs.append(msg[2:])
                if on_epoch:
                    on_epoch(msg[1], msg[2], msg[3])
            else:
                _, rank, params, stats, seconds, steps, workload = msg
                result.stats[rank], result.workload[rank] = stats, workload
                if params is not None:
                    result.params, result.seconds, result.steps = params, seconds, steps
                done += 1
        for p in procs:
            p.join(30)
    return result


def params_digest(params: list[np.ndarray]) -> str:
    """SHA-256 of the parameters' float32 bytes in order: two runs trained to the same bits
    have the same digest."""
    import hashlib

    h = hashlib.sha256()
    for p in params:
        h.update(np.ascontiguousarray(p, np.float32).tobytes())
    return h.hexdigest()


def _bar(epoch: int, total: int, loss: float, acc: float, width: int = 24) -> str:
    filled = int(width * (epoch + 1) / total)
    return f"  epoch {epoch + 1:>2}/{total} [{'#' * filled}{'.' * (width - filled)}] loss {loss:.4f}  test acc {100 * acc:5.1f}%"


def worker_main(argv: list[str]) -> NoReturn:
    """One training process started by the Mininet launcher inside a host's namespace;
    reports are JSON lines on stdout. Once it has reported and closed its communicator and
    groups it ends at once (``exit_now``): the launcher waits for every rank's exit before its
    summary. Its stores' files (``jobs/<job>/dist``, ``rdv``), which the last rank's store
    would delete at the interpreter's teardown, stay in the run directory beside its logs."""
    import json

    p = argparse.ArgumentParser(prog="inagg-train-worker")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--dist-file", required=True)
    p.add_argument("--rdv-file", required=True)
    p.add_argument("--controller", required=True)
    p.add_argument("--bind-ip", required=True)
    p.add_argument("--config", required=True, help="TrainConfig as JSON")
    p.add_argument("--join-after", metavar="FILE",
                   help="start up, then wait for FILE to exist before joining the controller")
    p.add_argument("--train-after", metavar="FILE",
                   help="once the job holds its grant, wait for FILE to exist before training")
    args = p.parse_args(argv)
    cfg = TrainConfig(**json.loads(args.config))

    def report(msg) -> None:
        if msg[0] == "done":   # rank 0's parameters as their digest (the launcher compares runs by it)
            msg = msg[:2] + (params_digest(msg[2]) if msg[2] is not None else None,) + msg[3:]
        print(json.dumps(msg), flush=True)

    def gate(path: str | None):
        """A function waiting for ``path`` to exist (None: no gate)."""
        def wait() -> None:
            while not os.path.exists(path):
                time.sleep(0.05)
        return wait if path else None

    run_worker(args.rank, cfg, args.dist_file, args.rdv_file, args.controller, None, report, args.bind_ip,
               gate(args.join_after), gate(args.train_after))
    exit_now(0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker_main(argv[1:])
    p = argparse.ArgumentParser(prog="inagg-demo", description=__doc__.split("\n\n")[0])
    add_version_flag(p)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--hook", choices=["inagg", "artopk"], default="inagg")
    p.add_argument("--cr", type=float, default=0.01, help="AR-Topk compression ratio")
    p.add_argument("--no-switch", action="store_true", help="host aggregation only")
    args = p.parse_args(argv)
    from inagg.bmv2_env.emulation.loopback import LoopbackDeployment   # the control plane (inagg[control]), after --help

    cfg = TrainConfig(workers=args.workers, epochs=args.epochs, hook=args.hook, cr=args.cr)
    print(f"inagg demo: MLP on digits, {cfg.workers} workers, DDP + {cfg.hook} hook, through the "
          f"{'host aggregator' if args.no_switch else 'software data plane'} on loopback")
    with LoopbackDeployment(cfg.workers, with_switch=not args.no_switch) as dep:
        run = train(cfg, dep.controller, on_epoch=lambda e, l, a: print(_bar(e, cfg.epochs, l, a), flush=True),
                    bind_ips=dep.worker_ips)
    print("baseline: the same training with plain gloo DDP")
    base = train(TrainConfig(**{**cfg.__dict__, "hook": "gloo"}),
                 on_epoch=lambda e, l, a: print(_bar(e, cfg.epochs, l, a), flush=True))
    acc, base_acc = run.epochs[-1][1], base.epochs[-1][1]
    tensor_bytes = 4 * sum(p.size for p in run.params) * run.steps
    print(f"final test accuracy: inagg {100 * acc:.2f}%  gloo {100 * base_acc:.2f}%  "
          f"(difference {100 * abs(acc - base_acc):.2f} points)")
    print("the paths of the calls (every rank a worker of the job: the DDP hook's own Communicator, not the "
          "backend's host-local reduce):")
    for r, s in enumerate(run.stats):
        path = "the switch" if s["mode"] == "switch" else "the host aggregator"
        where = (f"all on {path}" if not s["grant_changes"] else
                 f"on the switch and the host aggregator ({s['grant_changes']} grant change(s), the last to {path})")
        print(f"  rank {r}: {s['allreduces']} allreduce calls, {where}")
        print(f"  rank {r}: {s['mode']} mode (epoch {s['epoch']}, {s['grant_changes']} grant change(s)), "
              f"{s['wire_bytes_sent'] / 1e6:.2f} MB sent = {s['wire_bytes_sent'] / tensor_bytes:.3f} x gradient "
              f"bytes, {s['retransmissions']} retransmissions, {run.seconds / run.steps * 1e3:.1f} ms/step")
    return 0 if abs(acc - base_acc) <= 0.005 or cfg.hook == "artopk" else 1


if __name__ == "__main__":
    sys.exit(main())
