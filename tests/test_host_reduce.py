"""The host-local reduce (inagg.hostlib.worker.host_reduce) with real rank processes on the embedded
default deployment: bit-identical to the switch path, a job larger than the switch's worker
bitmap on a few hosts, and a killed rank named on every rank."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch

from inagg.hostlib.wire import codec
from inagg.hostlib.wire.protocol import MAX_WORKERS
from inagg.hostlib.worker.call_protocol import one_round_capacity

ROOT = Path(__file__).resolve().parents[1]
RANK = ROOT / "tests" / "host_reduce_rank.py"
sys.path.insert(0, str(ROOT / "tests"))
from host_reduce_rank import inputs, saved  # noqa: E402
from rank_fork import RankProcess  # noqa: E402


def _clean_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INAGG_")}
    return env | {"INAGG_ALLREDUCE_PATH": "inagg"} | extra


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(out: Path, ranks: int, **env: str) -> list[dict]:
    """tests/host_reduce_rank.py's exact series on ``ranks`` local ranks; every rank's results."""
    out.mkdir()
    proc = subprocess.run([str(Path(sys.executable).parent / "torchrun"), "--standalone", f"--nproc_per_node={ranks}",
                           str(RANK), str(out), "exact"], cwd=ROOT, env=_clean_env(**env), capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return [_results(out, r) for r in range(ranks)]


def _results(out: Path, rank: int) -> dict:
    """A rank's results and, under "stats", its stats and grant's K (its JSON)."""
    with np.load(out / f"rank{rank}.npz") as z:
        arrays = {name: z[name] for name in z.files}
    return arrays | {"stats": json.loads((out / f"rank{rank}.json").read_text())}


def _spawn(out: Path, what: str, hosts: list[int], *args: str, path: str = "inagg") -> list[RankProcess]:
    """One rank process per entry of ``hosts`` (its host: INAGG_HOST_ID), env:// rendezvous, every
    eligible allreduce on ``path`` (INAGG_ALLREDUCE_PATH); forked (tests/rank_fork.py)."""
    port, world = _free_port(), len(hosts)
    procs = []
    for rank, host in enumerate(hosts):
        env = _clean_env(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(hosts[:rank].count(host)),
                         MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), INAGG_HOST_ID=f"test-host-{host}",
                         INAGG_ALLREDUCE_PATH=path)
        procs.append(RankProcess([sys.executable, str(RANK), str(out), what, *args], cwd=ROOT, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def host_communicator(rank: int, hosts: list[int], info: dict, store_path: str, host_id: str, **kwargs):
    """Rank ``rank``'s ``HostCommunicator`` (what the backend's ranks use) on a FileStore job of
    ``len(hosts)`` ranks, its host ``<host_id>-<hosts[rank]>`` (INAGG_HOST_ID), each host's
    leader a worker of the deployment ``info`` describes; ``kwargs`` go to its Communicator."""
    import torch.distributed as dist

    from inagg.hostlib.worker.communicator import Communicator
    from inagg.hostlib.worker.host_communicator import HostCommunicator, open_host_group

    os.environ["INAGG_HOST_ID"] = f"{host_id}-{hosts[rank]}"
    os.environ["INAGG_HOST_REDUCE"] = "auto"
    store = dist.FileStore(store_path, len(hosts))
    group = open_host_group(dist.PrefixStore("host", store), rank, len(hosts), timedelta(seconds=300))

    def join(host: int, n_hosts: int) -> Communicator:
        return Communicator(dist.PrefixStore("comm", store), host, n_hosts, info["controller"],
                            bind_ip=info["worker_ips"][host], timeout=300, **kwargs)

    return HostCommunicator(group, join)


def forked_ranks(target, args: list[tuple], services) -> None:
    """``target(*args[r])`` in a process forked from this one per rank (no import each), every
    one exiting 0 within 240 s; what is left alive is killed and ``services`` closed after."""
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=target, args=a) for a in args]
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(240)
        assert [p.exitcode for p in procs] == [0] * len(procs)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        services.close()


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def switch_sum(xs: list[np.ndarray], k: int, average: bool) -> np.ndarray:
    """What the switch path computes when each of ``xs`` is one worker's input (the stream's
    specification, inagg.hostlib.worker.stream_reference, with inagg.hostlib.wire.codec): wrapping int32 sums; exact
    fixed-point limbs for the calls that ride in the control round; else per block of K the
    largest worker exponent, each worker's values quantized, summed, dequantized once."""
    n = len(xs)
    if xs[0].dtype == np.int32:
        return np.sum(xs, axis=0, dtype=np.int64).astype(np.int32)
    out = np.empty_like(xs[0])
    if xs[0].size <= one_round_capacity(k, n, True):
        limbs = np.zeros(xs[0].size * codec.fixed_limbs(n), np.int32)
        for x in xs:
            mine = np.zeros_like(limbs)
            codec.fixed_encode(x, n, mine)
            limbs += mine
        codec.fixed_decode(limbs, n, out)
    else:
        shift = codec.shift_for(n)
        exps = np.max([codec.block_exponents(x, k)[0] for x in xs], axis=0)
        for b, e in enumerate(exps.tolist()):
            block = slice(b * k, (b + 1) * k)
            total = sum(codec.quantize(x[block], e, shift).astype(np.int64) for x in xs)
            codec.dequantize(total.astype(np.int32), e, shift, out=out[block])
    return np.divide(out, np.float32(n), out=out) if average else out


def test_four_local_ranks_give_the_switch_paths_bits_with_no_packet_between_them(tmp_path):
    """4 ranks under torchrun on one host (the default: they reduce on the host): every result,
    bfloat16 and float16 included, bit-identical to the same calls with every rank a switch
    worker (INAGG_HOST_REDUCE=off) and to the gloo path's fixed point; the host's leader sent no
    packet."""
    local = _torchrun(tmp_path / "local", 4, INAGG_HOST_REDUCE="auto")
    switch = _torchrun(tmp_path / "switch", 4, INAGG_HOST_REDUCE="off")
    gloo = _torchrun(tmp_path / "gloo", 4, INAGG_ALLREDUCE_PATH="gloo")
    names = [name for name, _, _ in inputs(0, 1 << 30)]
    for rank in range(4):
        for name in names:
            assert _same_bits(local[rank][name], switch[rank][name]), (rank, name)
            assert _same_bits(local[rank][name], gloo[rank][name]), (rank, name)
    assert all(r["stats"]["inagg"]["hosts"] == 1 and r["stats"]["inagg"]["host_reduce"]["calls"] >= len(names)
               for r in local)
    assert "packets_sent" not in local[0]["stats"]["inagg"]   # no job at a controller: nothing to send with
    assert all(r["stats"]["inagg"]["packets_sent"] > 0 and "host_reduce" not in r["stats"]["inagg"] for r in switch)


def _scattered(rank: int, world: int) -> dict[str, np.ndarray]:
    """Rank ``rank``'s inputs of reduce-scatters in a job of ``world`` ranks: float32 in blocks
    and wrapping int32."""
    rng = np.random.default_rng(1000 + rank)
    return {"rs_float": rng.standard_normal(world * 1000).astype(np.float32),
            "rs_int": rng.integers(-2**31, 2**31, world * 100, dtype=np.int64).astype(np.int32)}


def _rank_on_host(rank: int, hosts: list[int], info: dict, store_path: str, out: Path, largest: int) -> None:
    """One rank of a job of ``len(hosts)`` through ``HostCommunicator`` (what the backend's
    ranks use), its host set by INAGG_HOST_ID: the exact series, then reduce-scatters
    (``_scattered``: the rank's shard), results to OUT/rank<R>.npz."""
    comm = host_communicator(rank, hosts, info, store_path, "test-host")
    results = {name: saved(comm.allreduce(tensor, op)) for name, tensor, op in inputs(rank, largest)}
    for name, x in _scattered(rank, len(hosts)).items():
        results[name] = comm.reduce_scatter_async(x, np.zeros(x.size // len(hosts), x.dtype)).wait()
    np.savez(out / f"rank{rank}.npz", **results)
    (out / f"rank{rank}.json").write_text(json.dumps({"inagg": comm.stats(), "k": comm.grant.values_per_packet}))
    comm.close()
    comm.group.close()


def test_a_job_of_more_ranks_than_the_switch_bitmap_runs_on_few_hosts(tmp_path):
    """MAX_WORKERS + 2 ranks on 2 hosts (processes forked from this one: no import each):
    the switch sees 2 workers (the hosts' leaders), and every rank gets the switch path's sums
    of all the ranks (its specification, ``switch_sum``), or in a reduce-scatter its shard of them."""
    from inagg.hostlib.worker.local import LocalServices

    hosts = [0] * (MAX_WORKERS // 2 + 1) + [1] * (MAX_WORKERS // 2 + 1)
    largest = 65536 + 7
    services = LocalServices(2, 120)
    forked_ranks(_rank_on_host, [(r, hosts, services.info, str(tmp_path / "store"), tmp_path, largest)
                                 for r in range(len(hosts))], services)
    calls = [inputs(r, largest) for r in range(len(hosts))]
    stats = _results(tmp_path, 0)["stats"]
    leader = stats["inagg"]
    assert leader["hosts"] == 2 and leader["packets_sent"] > 0 and leader["mode"] == "switch"
    for i, (name, tensor, _) in enumerate(calls[0]):
        wide = [c[i][1].float().numpy() if tensor.is_floating_point() else c[i][1].numpy() for c in calls]
        want = saved(torch.from_numpy(switch_sum(wide, stats["k"], average=name.endswith("avg"))).to(tensor.dtype))
        for rank in (0, 1, len(hosts) // 2, len(hosts) - 1):
            assert _same_bits(_results(tmp_path, rank)[name], want), (rank, name)
    scattered = [_scattered(r, len(hosts)) for r in range(len(hosts))]
    for name in scattered[0]:
        want = switch_sum([s[name] for s in scattered], stats["k"], average=False)
        for rank in range(len(hosts)):
            n = want.size // len(hosts)
            assert _same_bits(_results(tmp_path, rank)[name], want[rank * n:(rank + 1) * n]), (rank, name)


def _shm_names() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


# a rank, the host's leader; on 2 ranks with calls of one value and no path pinned, the tiny
# calls in C++ (inagg.hostlib.worker.host_tiny) on the other rank's side, then on the leader's
@pytest.mark.parametrize(("victim", "ranks", "values"), [(2, 4, 1 << 16), (0, 4, 1 << 16), (1, 2, 1), (0, 2, 1)])
def test_a_killed_local_rank_is_named_on_every_rank_within_10_s(tmp_path, victim, ranks, values):
    shm_before = _shm_names()
    procs = _spawn(tmp_path, "loop", [0] * ranks, str(values), path="auto" if values == 1 else "inagg")
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()[-4000:] if p.poll() is not None else ""
        time.sleep(0.5)
        procs[victim].send_signal(signal.SIGKILL)
        killed = time.time()
        for rank, p in enumerate(procs):
            if rank == victim:
                continue
            line = p.stdout.readline().split(" ", 2)
            assert line[0] == "error", (rank, line, p.stderr.read()[-3000:])
            assert float(line[1]) - killed < 10.0 and f"rank {victim} " in line[2], (rank, line)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    assert not {n for n in _shm_names() - shm_before if "inagg" in n}


def test_a_refused_or_mismatched_call_fails_on_every_rank_and_the_next_is_exact(monkeypatch):
    """Three ranks of one host (threads of this process) with their own deployment: sizes that
    differ, a float64 tensor and an inf fail the call on every rank with the same error naming
    the ranks (the inf's block keeps each rank's values, the others are summed, as on the switch
    path); the next call is exact."""
    import torch
    import torch.distributed as dist

    from inagg.bmv2_env.emulation.loopback import LoopbackDeployment
    from inagg.hostlib.worker.communicator import Communicator
    from inagg.hostlib.worker.host_communicator import HostCommunicator, open_host_group
    from inagg.hostlib.worker.call_protocol import CallRefused
    from test_training import on_ranks

    monkeypatch.setenv("INAGG_HOST_REDUCE", "auto")
    store = dist.HashStore()
    with LoopbackDeployment(1) as dep:
        def make(rank: int) -> HostCommunicator:
            group = open_host_group(dist.PrefixStore("host", store), rank, 3, timedelta(seconds=60))
            return HostCommunicator(group, lambda h, n: Communicator(dist.PrefixStore("comm", store), h, n,
                                                                     dep.controller, bind_ip=dep.worker_ips[h]))

        comms = on_ranks(make, 3, 120)
        try:
            k = comms[0].grant.values_per_packet
            sizes = on_ranks(lambda r: comms[r].allreduce(torch.ones(10 + (r == 2))), 3, 60, return_errors=True)
            assert all(isinstance(e, CallRefused) and "rank 2: 11 x float" in str(e) for e in sizes), sizes
            dtype = on_ranks(lambda r: comms[r].allreduce(torch.ones(10, dtype=torch.float64 if r == 1 else None)),
                             3, 60, return_errors=True)
            assert all(isinstance(e, CallRefused) and "rank 1 passed a float64 tensor" in str(e) for e in dtype), dtype
            xs = [torch.full((3 * k,), r + 1.0) for r in range(3)]
            xs[1][k + 5] = float("inf")
            inf = on_ranks(lambda r: comms[r].allreduce(xs[r]), 3, 60, return_errors=True)
            assert all(isinstance(e, FloatingPointError) and f"first at element {k}" in str(e) for e in inf), inf
            for r, x in enumerate(xs):
                assert x[:k].eq(6).all() and x[2 * k:].eq(6).all()
                assert x[k:2 * k].eq(r + 1.0).sum() == k - (r == 1)
            exact = on_ranks(lambda r: comms[r].allreduce(torch.full((5000,), r + 1.0)), 3, 60)
            assert all(x.eq(6.0).all() for x in exact)
        finally:
            on_ranks(lambda r: (comms[r].close(), comms[r].group.close()), 3, 60)


# -- how long a wait for a rank of the host lasts ---------------------------------------------------

def _silent_links(n: int):
    """``n`` links (local indexes 1..n) whose peers are alive and say nothing, and those peers."""
    from inagg.hostlib.worker.host_group import Link

    pairs = [socket.socketpair() for _ in range(n)]
    return {i + 1: Link(mine, i + 1, 1000 + i, False) for i, (mine, _) in enumerate(pairs)}, [p for _, p in pairs]


def test_a_wait_for_a_silent_rank_ends_with_the_groups_failure_or_its_timeout():
    """A rank that stops keeps its socket open: the leader's wait (``receive_all``) and a
    follower's (``Link.wait_readable``) end with the job's failure once it is known, and by the
    group's timeout at the latest, naming the ranks waited for."""
    from inagg.hostlib.worker.communicator import JobFailed
    from inagg.hostlib.worker.host_group import Message, RankDied, receive_all

    links, peers = _silent_links(2)
    try:
        started = time.monotonic()
        with pytest.raises(JobFailed, match=r"rank 1 \(pid 1000\), rank 2 \(pid 1001\).*timeout"):
            receive_all(links, timeout=0.5)
        assert 0.5 <= time.monotonic() - started < 30
        failure = RankDied(2, "rank 2 (pid 1001) stopped responding")
        with pytest.raises(RankDied, match="rank 2 "):
            receive_all(links, stop=lambda: failure)
        with pytest.raises(RankDied, match="rank 2 "):
            links[1].wait_readable(stop=lambda: failure)
        with pytest.raises(JobFailed, match=r"rank 1 \(pid 1000\)"):
            links[1].wait_readable(timeout=0.3)
        from inagg.hostlib.worker.host_group import Link
        Link(peers[0], 0, 1, True).send(Message(0, 7))
        links[1].wait_readable(timeout=30)   # a message ends the wait at once
        assert links[1].recv().call == 7
    finally:
        for sock in peers:
            sock.close()
        for link in links.values():
            link.close()


# -- reduce-scatter: each rank gets its shard only -------------------------------------------------

def _scatter_inputs(rank: int, k: int) -> list[tuple[torch.Tensor, object]]:
    """Calls of 3 ranks: float32 in one round and in blocks (a parallel call: over
    ``SERIAL_VALUES`` in all), AVG, bfloat16, float16 and wrapping int32; a bad block (inf) whose
    shard keeps the input's values and fails the call."""
    from host_reduce_rank import half

    from inagg.hostlib.worker.communicator import ReduceOp

    rng = np.random.default_rng(rank)
    floats = rng.standard_normal(3 * 40000).astype(np.float32) * np.float32(2.0) ** rng.integers(-20, 20, 3 * 40000)
    inf = np.full(3 * k, rank + 1.0, np.float32)
    if rank == 1:
        inf[k + 5] = np.inf
    return [(torch.from_numpy(rng.standard_normal(6).astype(np.float32)), ReduceOp.SUM),
            (torch.from_numpy(floats.astype(np.float32)), ReduceOp.SUM),
            (torch.from_numpy(rng.standard_normal(6000).astype(np.float32)), ReduceOp.AVG),
            (half(rng.standard_normal(60000).astype(np.float32), "bfloat16"), ReduceOp.SUM),
            (half(rng.standard_normal(15).astype(np.float32), "float16"), ReduceOp.SUM),
            (torch.from_numpy(rng.integers(-2**31, 2**31, 60000, dtype=np.int64).astype(np.int32)), ReduceOp.SUM),
            (torch.from_numpy(inf), ReduceOp.SUM)]


def test_a_reduce_scatter_on_one_host_hands_each_rank_only_its_shard(monkeypatch):
    """Three ranks of one host (threads; no job, the host reduce alone): each rank's output is
    bit for bit its shard of the same call's allreduce, every dtype and op; its input is left
    as it was; a third of the result leaves shared memory for each rank (``result_bytes``); an
    inf fails the call on every rank with the blocks' shard values kept, as an allreduce does."""
    import torch.distributed as dist

    from inagg.hostlib.worker.host_communicator import ONE_HOST_VALUES_PER_PACKET, HostCommunicator, open_host_group
    from test_training import on_ranks

    monkeypatch.setenv("INAGG_HOST_REDUCE", "auto")
    store, k = dist.HashStore(), ONE_HOST_VALUES_PER_PACKET
    comms = on_ranks(lambda r: HostCommunicator(
        open_host_group(dist.PrefixStore("host", store), r, 3, timedelta(seconds=60)), None), 3, 120)

    def calls(r: int) -> list:
        got, reduce = [], comms[r].group.reduce
        for x, op in _scatter_inputs(r, k):
            before, out = x.clone(), torch.zeros(x.numel() // 3, dtype=x.dtype)
            moved = reduce.stats["result_bytes"]
            try:
                comms[r].reduce_scatter_async(x, out, op).wait()
                error = None
            except FloatingPointError as e:
                error = e
            moved = reduce.stats["result_bytes"] - moved
            whole = x.clone()
            try:
                comms[r].allreduce(whole, op)
            except FloatingPointError:
                pass
            got.append((out, whole, before, x, moved, error))
        return got

    try:
        for r, results in enumerate(on_ranks(calls, 3, 120)):
            for out, whole, before, x, moved, error in results:
                n = out.numel()
                assert _same_bits(saved(out), saved(whole[r * n:(r + 1) * n])) and _same_bits(saved(x), saved(before))
                assert moved == (out.nbytes if error is None else 0)
            inf_out, _, inf_in, _, _, inf_error = results[-1]
            assert isinstance(inf_error, FloatingPointError) and f"first at element {k}" in str(inf_error)
            shard = slice(r * k, (r + 1) * k)
            assert inf_out.equal(inf_in[shard] if r == 1 else torch.full((k,), 6.0))
        with pytest.raises(ValueError, match="not 3 outputs of 2 end to end"):
            comms[0].reduce_scatter_async(torch.zeros(7), torch.zeros(2))
        with pytest.raises(ValueError, match=r"input's dtype \(float32\); got int32"):
            comms[0].reduce_scatter_async(torch.zeros(6), torch.zeros(2, dtype=torch.int32))
    finally:
        on_ranks(lambda r: comms[r].group.close(), 3, 60)
