"""A reduce-scatter between hosts' leaders (inagg.hostlib.worker.host_reduce, "Between hosts"):
4 ranks on 2 hosts (processes forked from this one, each host named by INAGG_HOST_ID) on the
embedded default deployment (the software switch and host aggregator on loopback), and 6 ranks
on 2 hosts placed cyclically. Each leader marks as its own the blocks wholly in its host's part
(its ranks' shards: one range per run of consecutive ranks) and receives the sum less the other
hosts' parts; every rank's output is its shard of the switch path's sum, bit for bit; FSDP2
through it trains as on gloo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from inagg.hostlib.wire.protocol import ENCAP_BYTES, HEADER_BYTES
from rank_fork import RankProcess
from test_host_reduce import ROOT, _free_port, _results, _same_bits, forked_ranks, host_communicator, switch_sum

VALUES_PER_RANK = 100_000   # each call streams its blocks (4 ranks x 100,000 values)


def _scattered(rank: int, world: int) -> dict[str, np.ndarray]:
    """Rank ``rank``'s inputs: float32 in blocks (magnitudes apart) and wrapping int32."""
    rng = np.random.default_rng(2000 + rank)
    floats = rng.standard_normal(world * VALUES_PER_RANK).astype(np.float32)
    floats *= np.float32(2.0) ** rng.integers(-20, 20, floats.size).astype(np.float32)
    return {"float": floats, "int": rng.integers(-2**31, 2**31, world * VALUES_PER_RANK, dtype=np.int64).astype(np.int32)}


def _received(comm) -> tuple[int, int, int]:
    """The leader's communicator's (bytes received on the wire, results received without values,
    contributions resent: each may bring a result twice); zeros on the host's other ranks."""
    if comm.comm is None:
        return 0, 0, 0
    stats = comm.comm.stats()
    return stats["wire_bytes_received"], stats["elided_results"], stats["retransmissions"]


def _rank(rank: int, hosts: list[int], info: dict, store_path: str, out: Path, host_only: bool) -> None:
    """One rank of a job on the switch (``host_only``: on the host aggregator): ``_calls``,
    their outputs to OUT/rank<R>.npz, what the leader received in each to OUT/rank<R>.json."""
    comm = host_communicator(rank, hosts, info, store_path, "rs-host", host_only=host_only)
    group = comm.group
    results, summary = _calls(comm, rank, len(hosts))
    np.savez(out / f"rank{rank}.npz", **results)
    (out / f"rank{rank}.json").write_text(json.dumps(summary | {
        "k": comm.grant.values_per_packet, "mode": comm.grant.mode, "leader": group.layout.leader,
        "host": group.layout.host}))
    comm.close()
    group.close()


def _calls(comm, rank: int, world: int) -> tuple[dict[str, np.ndarray], dict]:
    """Each input allreduced (a copy), then reduce-scattered, what the leader received in each;
    then a reduce-scatter the last rank passes another size (refused on every rank) and the
    next, exact."""
    from inagg.hostlib.worker.call_protocol import CallRefused

    results, received = {}, {}
    for name, x in _scattered(rank, world).items():
        for call in ("allreduce", "reduce_scatter"):
            before = _received(comm)
            if call == "allreduce":
                results[f"{name}_all"] = comm.allreduce(x.copy())
            else:
                results[name] = comm.reduce_scatter_async(x, np.zeros(x.size // world, x.dtype)).wait()
            received[f"{name}_{call}"] = [a - b for a, b in zip(_received(comm), before)]
    n = 30_000 + (rank == world - 1)
    try:
        comm.reduce_scatter_async(np.ones(world * n, np.int32), np.zeros(n, np.int32)).wait()
        refused = ""
    except CallRefused as e:
        refused = str(e)
    results["after"] = comm.reduce_scatter_async(np.full(world * 30_000, rank + 1, np.int32),
                                                 np.zeros(30_000, np.int32)).wait()
    return results, {"received": received, "refused": refused}


def _run(tmp_path: Path, hosts: list[int], host_only: bool = False) -> list[dict]:
    """The job of ``hosts`` (each rank's host), on a deployment of one worker per host."""
    from inagg.hostlib.worker.local import LocalServices

    services = LocalServices(max(hosts) + 1, 120)
    forked_ranks(_rank, [(r, hosts, services.info, str(tmp_path / "store"), tmp_path, host_only)
                         for r in range(len(hosts))], services)
    return [_results(tmp_path, r) for r in range(len(hosts))]


def _parts(hosts: list[int], n: int) -> list[list[tuple[int, int]]]:
    """Each host's part of a sum of ``n`` values: its ranks' shards, one range per run of
    consecutive ranks."""
    per, parts = n // len(hosts), []
    for h in range(max(hosts) + 1):
        ranks = [r for r, host in enumerate(hosts) if host == h]
        runs = [(r, next(e for e in range(r, len(hosts) + 1) if e not in ranks)) for r in ranks if r - 1 not in ranks]
        parts.append([(first * per, end * per) for first, end in runs])
    return parts


def _elided_blocks(n: int, k: int, parts: list[list[tuple[int, int]]], host: int) -> int:
    """Blocks of the int32 call between hosts (the hosts' words, then ``n`` sums; ``k`` per
    packet) wholly inside a range of another host's part of the sums: their values go to that
    host alone."""
    head = 2 * len(parts)
    others = [(head + lo, head + hi) for h, part in enumerate(parts) if h != host for lo, hi in part]
    blocks = [(b * k, min(head + n, (b + 1) * k)) for b in range(-(-(head + n) // k))]
    return sum(any(lo <= a and b <= hi for lo, hi in others) for a, b in blocks)


@pytest.mark.parametrize("hosts, host, part", [
    (((0, 1), (2, 3)), 1, ((20, 40),)), (((0, 1, 2), (3,)), 0, ((0, 30),)), (((0, 2), (1, 3)), 0, ((0, 10), (20, 30))),
    (((0, 2), (1, 3)), 1, ((10, 20), (30, 40))), (((0, 2, 3, 5), (1, 4)), 0, ((0, 10), (20, 40), (50, 60))),
    (((0, 1, 3, 4), (2,)), 0, ((0, 20), (30, 50)))])
def test_a_hosts_part_is_its_ranks_shards_one_range_per_run(hosts, host, part):
    """The ranges a leader marks its own (shards of 10 values): its host's ranks' shards, one
    range per run of consecutive ranks; an allreduce has no part."""
    from inagg.hostlib.worker.call_protocol import Shard
    from inagg.hostlib.worker.host_group import HostLayout
    from inagg.hostlib.worker.host_reduce import _host_part

    layout = HostLayout(hosts[host][0], hosts)
    assert _host_part(layout, Shard(0, np.zeros(10, np.float32))) == part
    assert _host_part(layout, None) is None


def _check_outputs(ranks: list[dict], hosts: list[int]) -> None:
    """Every rank's output: its shard of the switch path's sum of all the ranks' inputs, and of
    the same call's allreduce, bit for bit; the refused call refused on every rank, the next
    one exact."""
    world, k = len(hosts), ranks[0]["stats"]["k"]
    inputs = [_scattered(r, world) for r in range(world)]
    for name in inputs[0]:
        want = switch_sum([x[name] for x in inputs], k, average=False)
        n = want.size // world
        for r, got in enumerate(ranks):
            assert _same_bits(got[name], want[r * n:(r + 1) * n]), (r, name)
            assert _same_bits(got[name], got[f"{name}_all"][r * n:(r + 1) * n]), (r, name)
    everyone = sum(range(1, world + 1))
    for r, got in enumerate(ranks):
        assert "differ" in got["stats"]["refused"], (r, got["stats"])   # the ranks' sizes, or their host's
        assert (got["after"] == everyone).all(), r


@pytest.mark.parametrize("hosts, host_only", [([0, 0, 1, 1], False), ([0, 0, 0, 1], False), ([0, 0, 1, 1], True),
                                             ([0, 1, 0, 1], False), ([0, 0, 1, 0], False),
                                             ([0, 1, 0, 1, 0, 1], False)])
def test_each_leader_receives_its_hosts_part_alone(tmp_path, hosts, host_only):
    """Hosts of consecutive ranks (2 + 2, 3 + 1; the job on the switch, or on the host
    aggregator: ``host_only``) and of ranks not consecutive (0, 2 + 1, 3; 0, 1, 3 + 2; 0, 2, 4 +
    1, 3, 5: Slurm's cyclic placement), whose part is their ranks' shards in several ranges
    (``_parts``): each leader's reduce-scatter receives about what its allreduce of the same
    input received less the other hosts' parts (plus a header per block of theirs, the blocks
    across the parts' edges, the block exponents), and exactly the blocks wholly in the other
    hosts' parts come without their values."""
    ranks = _run(tmp_path, hosts, host_only)
    _check_outputs(ranks, hosts)
    assert ranks[0]["stats"]["mode"] == ("host" if host_only else "switch")
    n = len(hosts) * VALUES_PER_RANK
    parts = _parts(hosts, n)
    for host in range(len(parts)):
        stats = ranks[hosts.index(host)]["stats"]
        assert stats["leader"] and stats["host"] == host
        share = sum(hi - lo for lo, hi in parts[host]) / n
        for name in ("float", "int"):
            (all_bytes, all_elided, _), (rs_bytes, rs_elided, resent) = (
                stats["received"][f"{name}_{call}"] for call in ("allreduce", "reduce_scatter"))
            assert all_elided == 0 and rs_elided == _elided_blocks(n, stats["k"], parts, host) > 0, (host, name, stats)
            # a resend's result may come twice (a machine under load): one whole packet each at most
            first_answers = rs_bytes - resent * (ENCAP_BYTES + HEADER_BYTES + 4 * stats["k"])
            assert share - 0.02 < rs_bytes / all_bytes and first_answers / all_bytes < share + 0.12, (host, name, stats)


def _fsdp(tmp_path: Path, backend: str, hosts: list[int]) -> dict:
    """examples/train_fsdp.py (FSDP2) with one process per entry of ``hosts`` (its host), the
    inagg backend's calls on its own path (the leaders on the job's local deployment's switch):
    rank 0's full parameters, losses and stats. Its ranks are forked (tests/rank_fork.py)."""
    out, port = tmp_path / f"{backend}.json", _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("INAGG_")} | {
        "INAGG_ALLREDUCE_PATH": "inagg", "WORLD_SIZE": str(len(hosts)), "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port)}
    procs = [RankProcess([sys.executable, str(ROOT / "examples" / "train_fsdp.py"), "--backend", backend,
                          "--fsdp", "2", "--out", str(out)], cwd=ROOT,
                         env=env | {"RANK": str(r), "LOCAL_RANK": str(hosts[:r].count(host)),
                                    "INAGG_HOST_ID": f"fsdp-host-{host}"},
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r, host in enumerate(hosts)]
    try:
        logs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0] * len(hosts), "\n".join(log[-3000:] for log in logs)
    return json.loads(out.read_text())


def test_fsdp_reduce_scatters_between_hosts_give_gloos_result(tmp_path):
    """FSDP2 on 2 hosts of 2 ranks: every gradient reduce-scatter through the host reduce and
    the leaders' switch, some of the other host's blocks coming to rank 0's leader as headers
    alone; the trained parameters are gloo's within inagg's fixed point."""
    hosts = [0, 0, 1, 1]
    gloo, inagg = _fsdp(tmp_path, "gloo", hosts), _fsdp(tmp_path, "inagg", hosts)
    for a, b in zip(inagg["params"], gloo["params"]):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    np.testing.assert_allclose(inagg["losses"], gloo["losses"], rtol=0, atol=1e-5)
    stats = inagg["stats"]
    scatters = sum(stats["via_allreduce"].values())
    assert scatters >= 5 and stats["allreduce_paths"] == {"inagg": scatters}
    assert stats["carriers"]["shared memory + switch"]["calls"] == scatters
    leader = stats["inagg"]
    assert leader["hosts"] == 2 and leader["leader"] and leader["mode"] == "switch"
    assert leader["elided_results"] > 0
