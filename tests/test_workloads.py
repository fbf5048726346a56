"""The emulation's workloads (bmv2_env/demos/workloads.py, train_demo): every model of the zoo
and a synthetic profile train through the real software switch on loopback for a number of
iterations or a duration, every rank taking the same steps, and report their gradient bytes
per step (what the summary's throughput and fairness are computed from)."""

import pytest
import torch

from inagg.bmv2_env.demos import workloads
from inagg.bmv2_env.demos.train_demo import TrainConfig, train
from inagg.bmv2_env.emulation.loopback import LoopbackDeployment
from inagg.bmv2_env.emulation.summary import jain
from inagg.bmv2_env.emulation.topology_schema import MODELS

PARAMETERS = {"mlp": 9610, "cnn": 38282, "transformer": 72096}   # as workloads.py's docstring says


def test_the_zoo_is_the_one_the_schema_checks():
    assert workloads.MODELS == MODELS == tuple(PARAMETERS)


@pytest.mark.parametrize("model", MODELS)
def test_each_model_trains_its_iterations_through_the_switch(model):
    torch.manual_seed(0)
    assert sum(p.numel() for p in workloads.build_model(model).parameters()) == PARAMETERS[model]
    with LoopbackDeployment(2) as dep:
        run = train(TrainConfig(workers=2, model=model, iterations=5, hook="inagg", job_name=model),
                    dep.controller, bind_ips=dep.worker_ips)
    assert run.steps == 5 and [s["mode"] for s in run.stats] == ["switch", "switch"]
    assert len(run.epochs) == 1 and 0 <= run.epochs[0][1] <= 1      # the partial epoch is reported
    assert [w["grad_bytes"] for w in run.workload] == [4 * PARAMETERS[model]] * 2


def test_a_profile_runs_for_its_duration_on_every_rank_alike():
    """A 1 s profile of two buckets: both ranks stop at the step rank 0's clock chose, and every
    bucket summed to the number of workers (the profile's own check)."""
    profile = {"bucket_bytes": [65536, 4096], "compute_ms": 5}
    with LoopbackDeployment(2) as dep:
        run = train(TrainConfig(workers=2, profile=profile, duration=1.0, job_name="synthetic"),
                    dep.controller, bind_ips=dep.worker_ips)
    assert run.steps >= 1 and run.stats[0]["allreduces"] == run.stats[1]["allreduces"] == 2 * run.steps
    assert [w["grad_bytes"] for w in run.workload] == [69632, 69632]
    assert run.workload[0]["finished"] - run.workload[0]["started"] >= 1.0


def test_a_reduce_scatter_profile_sums_each_workers_shard():
    """A profile whose collective is reduce_scatter: every shard summed to the number of
    workers (the profile's own check), through inagg (the other worker's blocks came as headers
    alone) and through gloo (no communicator)."""
    profile = {"bucket_bytes": [65536], "collective": "reduce_scatter"}
    with LoopbackDeployment(2) as dep:
        runs = [train(TrainConfig(workers=2, profile=profile, iterations=3, hook=hook, job_name=f"rs-{hook}"),
                      dep.controller, bind_ips=dep.worker_ips) for hook in ("inagg", "gloo")]
    assert [r.steps for r in runs] == [3, 3]
    assert all(s["elided_results"] > 0 for s in runs[0].stats)


def test_jains_index():
    assert jain([5.0, 5.0, 5.0]) == 1.0
    assert jain([1.0, 0.0, 0.0, 0.0]) == 0.25
    assert jain([]) is None and jain([0.0]) is None
