"""Training integration: the communicator, the DDP hooks and grant switch-over, on the embedded
default deployment (software data plane over loopback, controller, host aggregator)."""

import tempfile
import threading
import time

import numpy as np
import pytest
import torch
import torch.distributed as dist

from inagg.bmv2_env.emulation.loopback import LoopbackDeployment
from inagg.controller.config import default_program
from inagg.hostlib.jobservice.client import ControllerClient, ControllerError
from inagg.hostlib.worker.communicator import Communicator, ReduceOp
from inagg.bmv2_env.demos.train_demo import TrainConfig, train


@pytest.fixture(scope="module")
def gloo_run():
    return train(TrainConfig(workers=2, epochs=2, hook="gloo"))


def test_ddp_hook_gives_gloo_parameters(gloo_run):
    with LoopbackDeployment(2) as dep:
        run = train(TrainConfig(workers=2, epochs=2, hook="inagg"), dep.controller, bind_ips=dep.worker_ips)
    assert all(s["mode"] == "switch" for s in run.stats)
    for a, b in zip(run.params, gloo_run.params):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
    np.testing.assert_allclose(run.epochs, gloo_run.epochs, atol=1e-4)


def test_grant_switch_over_mid_training_loses_nothing(gloo_run):
    with LoopbackDeployment(2) as dep:
        run = train(TrainConfig(workers=2, epochs=2, hook="inagg", drain_at_step=20), dep.controller, bind_ips=dep.worker_ips,
                    admin=(dep.controller, dep.admin_token))
    assert [s["mode"] for s in run.stats] == ["host", "host"]
    assert all(s["grant_changes"] >= 1 and s["host_results"] > 0 for s in run.stats)   # drained to host
    for a, b in zip(run.params, gloo_run.params):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)


def on_ranks(fn, n, timeout=60, *, return_errors=False):
    """Run ``fn(rank)`` for every rank at once (ranks block on each other); their results. A
    rank's exception fails the test, or with ``return_errors`` stands in for its result."""
    out, errors = [None] * n, []

    def run(r):
        try:
            out[r] = fn(r)
        except Exception as e:  # noqa: BLE001 - reported below
            out[r] = e
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert return_errors or not errors, errors
    return out


def make_comms(dep, n, **kw):
    d = tempfile.mkdtemp()
    store = dist.FileStore(f"{d}/store", n)
    return on_ranks(lambda r: Communicator(store, r, n, dep.controller, bind_ip=dep.worker_ip(r), **kw), n)


def test_many_async_allreduces_in_flight():
    with LoopbackDeployment(3) as dep:
        comms = make_comms(dep, 3)
        try:
            # around both K (the software switch's 4096, BMv2's 64) and one call of many packets
            # at either, whose transfer time pins beta
            sizes = [1, 63, 64, 65, 1000, 4097, 20000, 300000]
            futures = []
            for r, c in enumerate(comms):
                for i, n in enumerate(sizes):
                    t = torch.full((n,), float(r + 1 + i), dtype=torch.float32)
                    futures.append((i, c.allreduce_async(t, ReduceOp.AVG if i % 2 else ReduceOp.SUM)))
                futures.append((-1, c.allreduce_async(torch.arange(10, dtype=torch.int32) * (r + 1))))
            for i, f in futures:
                out = f.wait()
                if i < 0:
                    assert out.tolist() == [6 * v for v in range(10)]
                else:
                    expect = sum(r + 1 + i for r in range(3)) / (3 if i % 2 else 1)
                    assert torch.allclose(out, torch.full_like(out, expect), rtol=1e-6)
            assert all(c.stats()["allreduces"] == len(sizes) + 1 for c in comms)
            # every call fed the link estimator: alpha and beta are measured, not configured (their
            # values are the machine's: under load a fit may put all of a call's time in one)
            assert all(c.link.samples == 2 * (len(sizes) + 1) for c in comms)   # a call and its control round
            assert all((c.link.alpha, c.link.beta) != (1e-4, 1e-8) for c in comms)
        finally:
            for c in comms:
                c.close()


def test_bad_input_gives_clear_errors():
    with LoopbackDeployment(2) as dep:
        comms = make_comms(dep, 2)
        try:
            futs = [comms[0].allreduce_async(torch.zeros(100)), comms[1].allreduce_async(torch.zeros(101))]
            for f in futs:
                with pytest.raises(ValueError, match=r"differ across ranks \(rank 0: 100 x float, rank 1: 101"):
                    f.wait()
            futs = [c.allreduce_async(torch.ones(50)) for c in comms]   # still usable afterwards
            assert all(f.wait().tolist() == [2.0] * 50 for f in futs)
        finally:
            for c in comms:
                c.close()
    with pytest.raises(ControllerError, match="unreachable"):
        ControllerClient("127.0.0.1:1", timeout=2, insecure=True).create_job(2)
    with pytest.raises(ControllerError, match="TCP needs TLS"):
        ControllerClient("127.0.0.1:1")
    with pytest.raises(ValueError, match="transport must be one of udp, roce, got 'rdma'"):
        Communicator(None, 0, 2, "127.0.0.1:1", transport="rdma")   # before any job exists


def test_artopk_hook_trains_with_far_fewer_bytes():
    """Bytes at a hardware switch's K (BMv2's 64): at the software target's 4096 this model's
    whole gradient is three packets, so a sparse one cannot be ten times fewer bytes."""
    bmv2_p4info = default_program("bmv2").p4info_path
    with LoopbackDeployment(2, p4info=bmv2_p4info) as dep:
        dense = train(TrainConfig(workers=2, epochs=2, hook="inagg"), dep.controller, bind_ips=dep.worker_ips)
    with LoopbackDeployment(2, p4info=bmv2_p4info) as dep:
        sparse = train(TrainConfig(workers=2, epochs=2, hook="artopk", cr=0.01), dep.controller, bind_ips=dep.worker_ips)
    sent = [sum(s["wire_bytes_sent"] for s in r.stats) for r in (dense, sparse)]
    assert sent[0] > 10 * sent[1]
    assert sparse.epochs[-1][1] > 0.5          # it learns (2 epochs of a 1 % sparsified gradient)


def test_adaptive_artopk_hook_uses_the_measured_cost_model():
    with LoopbackDeployment(2) as dep:
        run = train(TrainConfig(workers=2, epochs=1, hook="artopk", cr=0.01, adaptive=True), dep.controller, bind_ips=dep.worker_ips)
    assert run.epochs and all(s["allreduces"] > 0 for s in run.stats)


def test_adaptive_choice_follows_the_measured_link_and_is_the_same_on_every_rank():
    from inagg.hostlib.worker.cost_model import LinkEstimator
    from inagg.hostlib.pytorch.hooks import ARTopkHookState, _choose_dense

    with LoopbackDeployment(2) as dep:
        comms = make_comms(dep, 2)
        try:
            for alpha, beta, dense in ((1.0, 1e-12, True), (1e-9, 1e-3, False)):
                for c in comms:   # only rank 0's estimator decides; give both the same link
                    c.link = LinkEstimator(alpha, beta)
                states = [ARTopkHookState(c, cr=0.01, adaptive=True) for c in comms]
                out = on_ranks(lambda r: _choose_dense(states[r], 10_000), 2, timeout=30)
                assert out == [dense, dense], (alpha, beta, out)
                assert states[1].last_choice == ("dense_ina" if dense else "artopk_ina")
        finally:
            for c in comms:
                c.close()


def test_controller_restart_keeps_jobs_running_and_grants_followed():
    with LoopbackDeployment(2) as dep:
        comms = make_comms(dep, 2)
        try:
            before = [c.grant for c in comms]
            dep.restart_controller()
            futs = [c.allreduce_async(torch.ones(500)) for c in comms]
            assert all(f.wait().tolist() == [2.0] * 500 for f in futs)   # data plane kept its state
            deadline = time.monotonic() + 10.0   # the ranks reopen their grant streams (every 0.5 s)
            while not all(c.stream_reopened >= 1 for c in comms) and time.monotonic() < deadline:
                time.sleep(0.05)
            admin = ControllerClient(dep.controller)
            admin.drain(dep.admin_token, comms[0].job_id)                 # a grant change after the restart
            admin.close()
            while time.monotonic() < deadline:
                futs = [c.allreduce_async(torch.ones(500)) for c in comms]
                assert all(f.wait().tolist() == [2.0] * 500 for f in futs)
                if all(c.grant.mode == "host" for c in comms):
                    break
            assert [c.grant.mode for c in comms] == ["host", "host"] and before[0].mode == "switch"
            assert all(c.stream_reopened >= 1 for c in comms)
        finally:
            for c in comms:
                c.close()
