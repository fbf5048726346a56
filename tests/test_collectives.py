"""Every collective torch's c10d calls on a process group works on the inagg backend: the
reduce-scatters as allreduces on the backend's paths, the rest on its inner gloo group; FSDP1
and FSDP2 train on ``init_process_group("inagg")`` as on gloo."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist

from test_backend import ROOT, groups_on, torchrun
from test_training import on_ranks


def fsdp_run(tmp_path, backend: str, fsdp: int, path: str | None = None, reproducible: bool = True,
             host_reduce: str = "off") -> dict:
    """examples/train_fsdp.py under torchrun on 2 ranks: rank 0's full parameters and stats;
    every rank a worker of the switch, or with ``host_reduce`` auto the ranks reducing on their
    host (shared memory)."""
    env = {"INAGG_HOST_REDUCE": host_reduce} | ({"INAGG_ALLREDUCE_PATH": path} if path else {})
    if not reproducible:
        env["INAGG_REPRODUCIBLE"] = "0"
    return torchrun(tmp_path, f"{backend}-{path}-{reproducible}-{host_reduce}-fsdp{fsdp}", "--backend", backend,
                    "--fsdp", str(fsdp), script=ROOT / "examples" / "train_fsdp.py", env=env)


@pytest.mark.parametrize("fsdp", [1, 2])
def test_fsdp_trains_on_inagg_as_on_gloo(tmp_path, fsdp):
    """Bit for bit gloo's where the reduce-scatters take gloo's own float sum; by default every
    path sums inagg's fixed point, so the switch, the gloo path and shared memory give the same
    bits, within the fixed point's rounding of gloo's, every gradient reduce-scatter on the switch
    (the other rank's blocks coming as headers alone); in shared memory each rank takes only its half of each result (the
    calibration's allreduces take all of theirs)."""
    gloo = fsdp_run(tmp_path, "gloo", fsdp)
    plain = fsdp_run(tmp_path, "inagg", fsdp, path="gloo", reproducible=False)
    assert plain["params"] == gloo["params"] and plain["losses"] == gloo["losses"]
    via_gloo = fsdp_run(tmp_path, "inagg", fsdp, path="gloo")
    switch = fsdp_run(tmp_path, "inagg", fsdp, path="inagg")
    assert switch["params"] == via_gloo["params"] and switch["losses"] == via_gloo["losses"]
    for a, b in zip(switch["params"], gloo["params"]):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    stats = switch["stats"]
    scatters = sum(stats["via_allreduce"].values())
    assert scatters >= 5 and stats["allreduce_paths"] == {"inagg": scatters}
    assert stats["inagg"]["mode"] == "switch" and stats["inagg"]["packets_received"] > 0
    assert stats["inagg"]["elided_results"] > 0   # the other rank's blocks came as headers alone
    assert not any(key.startswith("reduce_scatter") for key in stats["fallbacks"])
    local = fsdp_run(tmp_path, "inagg", fsdp, path="inagg", host_reduce="auto")
    assert local["params"] == switch["params"] and local["losses"] == switch["losses"]
    host, scattered = local["stats"]["inagg"]["host_reduce"], local["stats"]["carriers"]["shared memory"]
    assert scattered["calls"] == sum(local["stats"]["via_allreduce"].values()) >= 5
    assert host["local_bytes"] - host["result_bytes"] == scattered["bytes"] // 2


@pytest.fixture(scope="module")
def groups():
    with groups_on("inagg") as pair:
        yield pair


def _scatter_opts(op: dist.ReduceOp) -> dist.ReduceScatterOptions:
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = op
    return opts


@pytest.mark.parametrize("dtype, op", [(torch.float32, dist.ReduceOp.SUM), (torch.float32, dist.ReduceOp.AVG),
                                       (torch.int32, dist.ReduceOp.SUM)])
@pytest.mark.parametrize("name", ["reduce_scatter_single", "_reduce_scatter_base"])
def test_a_reduce_scatter_is_an_allreduce_each_rank_keeps_its_shard_of(groups, name, dtype, op):
    def scatter(r: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
        full = (torch.arange(8) * (r + 1)).to(dtype)
        out = torch.zeros(4, dtype=dtype)
        before = dict(groups[r].reduce_scatters.via_allreduce)
        getattr(groups[r], name)(out, full.clone(), _scatter_opts(op)).wait()
        return out, full, before

    results = on_ranks(scatter, 2)
    whole = torch.arange(8) * 3 / (2 if op == dist.ReduceOp.AVG else 1)
    for r, (out, _, before) in enumerate(results):
        assert out.tolist() == whole[4 * r:4 * r + 4].to(dtype).tolist()
        assert groups[r].reduce_scatters.via_allreduce[name] == before.get(name, 0) + 1


def test_a_reduce_scatter_leaves_its_input_and_its_future_gives_the_outputs(groups):
    """The two ranks share a host: the host-local reduce hands each only its shard (half the
    result's bytes out of shared memory, ``result_bytes``), straight into its output."""
    def scatter(r: int) -> tuple[list[float], list[float], int]:
        full = torch.ones(64 << 10)   # queued on the communicator's thread
        out = torch.zeros(32 << 10)
        moved = groups[r].stats()["inagg"]["host_reduce"]["result_bytes"]
        work = groups[r].reduce_scatter_single(out, full, _scatter_opts(dist.ReduceOp.SUM))
        (got,) = work.get_future().wait()
        moved = groups[r].stats()["inagg"]["host_reduce"]["result_bytes"] - moved
        return got.unique().tolist(), full.unique().tolist(), moved

    assert on_ranks(scatter, 2) == [([2.0], [1.0], (32 << 10) * 4)] * 2


def test_coalesced_reduce_scatters_and_all_gathers(groups):
    def calls(r: int) -> tuple[list, list]:
        fulls = [torch.full((4,), r + 1.0), torch.full((6,), 10.0 * (r + 1))]
        outs = [torch.zeros(2), torch.zeros(3)]
        groups[r].reduce_scatter_tensor_coalesced(outs, fulls, _scatter_opts(dist.ReduceOp.SUM)).wait()
        gathered = [torch.zeros(4), torch.zeros(6)]
        groups[r].allgather_into_tensor_coalesced(gathered, outs).wait()
        return [o.tolist() for o in outs], [g.tolist() for g in gathered]

    for outs, gathered in on_ranks(calls, 2):
        assert outs == [[3.0, 3.0], [30.0] * 3] and gathered == [[3.0] * 4, [30.0] * 6]
    assert groups[0].reduce_scatters.via_allreduce["reduce_scatter_tensor_coalesced"] >= 1


def test_calls_inagg_cannot_run_go_to_gloo_counted_by_their_ops_name(groups):
    def scatter(r: int) -> list[float]:
        out = torch.zeros(2)
        groups[r].reduce_scatter_single(out, torch.tensor([r, 5.0, 1.0, r]), _scatter_opts(dist.ReduceOp.MAX)).wait()
        return out.tolist()

    def maximum(r: int) -> list[float]:
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MAX
        out = torch.tensor([float(r)])
        groups[r].allreduce([out], opts).wait()
        return out.tolist()

    assert on_ranks(scatter, 2) == [[1.0, 5.0], [1.0, 1.0]]
    assert on_ranks(maximum, 2) == on_ranks(maximum, 2) == [[1.0], [1.0]]
    # one key per kind of call (before: the op printed as an object address, one key per call)
    assert groups[0].gloo.fallbacks["reduce_scatter_single: op MAX"] >= 1
    assert groups[0].gloo.fallbacks["allreduce: op MAX"] == 2
    assert not any("object at" in key for key in groups[0].gloo.fallbacks)


def test_all_gather_and_all_to_all_single_on_the_inner_gloo_group(groups):
    def calls(r: int) -> tuple[list[float], list[float]]:
        gathered = torch.zeros(4)
        groups[r].all_gather_single(gathered, torch.full((2,), float(r))).wait()
        swapped = torch.zeros(4)
        groups[r].all_to_all_single(swapped, torch.arange(4.0) + 10 * r, [2, 2], [2, 2]).wait()
        return gathered.tolist(), swapped.tolist()

    (g0, s0), (g1, s1) = on_ranks(calls, 2)
    assert g0 == g1 == [0.0, 0.0, 1.0, 1.0]
    assert s0 == [0.0, 1.0, 10.0, 11.0] and s1 == [2.0, 3.0, 12.0, 13.0]
    assert groups[0].gloo.fallbacks["all_gather_single: inagg runs allreduce and reduce-scatter only"] >= 1


def test_a_barrier_keeps_its_timeout():
    def barrier(timeout_s: float):
        opts = dist.BarrierOptions()
        opts.timeout = timedelta(seconds=timeout_s)
        return lambda r: groups[r].barrier(opts).wait()

    with groups_on("gloo") as groups:   # a gloo timeout ends its connections: a group of its own
        on_ranks(barrier(10), 2)
        with pytest.raises(RuntimeError, match="[Tt]imed out"):
            barrier(0.5)(0)   # rank 1 never comes


def test_monitored_barrier_names_the_rank_that_did_not_come():
    from inagg.hostlib.pytorch.backend import monitored_barrier

    with groups_on("gloo") as groups:
        on_ranks(lambda r: monitored_barrier(groups[r], timedelta(seconds=10)), 2)
        with pytest.raises(RuntimeError, match="Rank 1 failed to pass monitoredBarrier"):
            monitored_barrier(groups[0], timedelta(seconds=0.5))
