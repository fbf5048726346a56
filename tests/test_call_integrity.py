"""Call integrity on the embedded default deployment (software switch, controller and host
aggregator as processes; ranks are Communicators): a bad call on one rank fails that call on
every rank and the next call is exact; reduce ops; forged results from another local process
change nothing and are counted."""

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.distributed as dist

from inagg.bmv2_env.emulation.loopback import ROOT, LoopbackDeployment
from inagg.hostlib.worker.communicator import ReduceOp
from inagg.hostlib.worker.call_protocol import CallRefused
from test_training import make_comms, on_ranks


@pytest.fixture(scope="module")
def comms():
    with LoopbackDeployment(2) as dep:
        comms = make_comms(dep, 2)
        try:
            yield comms
        finally:
            for c in comms:
                c.close()


def fail_alike(futures, message: str) -> str:
    """Every future fails with the same CallRefused matching ``message``; its text."""
    texts = []
    for f in futures:
        with pytest.raises(CallRefused, match=message) as e:
            f.wait()
        texts.append(str(e.value))
    assert len(set(texts)) == 1, texts
    return texts[0]


def assert_next_call_exact(comms, n=100):
    futs = [c.allreduce_async(torch.full((n,), r + 1.0)) for r, c in enumerate(comms)]
    assert all(f.wait().tolist() == [3.0] * n for f in futs)


@pytest.mark.parametrize("bad, message", [
    (torch.zeros(100, dtype=torch.float64), r"call \d+ refused: rank 1 passed a float64 tensor"),
    (torch.zeros(10, 10).t(), "rank 1 passed a tensor that is not contiguous"),
    (np.zeros(100), "rank 1 passed a float64 tensor"),
    (torch.zeros(100, dtype=torch.int64), "rank 1 passed a int64 tensor"),
    (torch.zeros(0), r"differ across ranks \(rank 0: 100 x float, rank 1: 0 x float\)"),
    (torch.zeros(101), r"differ across ranks \(rank 0: 100 x float, rank 1: 101 x float\)"),
])
def test_a_bad_input_on_one_rank_fails_that_call_on_every_rank(comms, bad, message):
    fail_alike([comms[0].allreduce_async(torch.ones(100)), comms[1].allreduce_async(bad)], message)
    assert_next_call_exact(comms)
    assert comms[0].stats()["calls"] == comms[1].stats()["calls"]


@pytest.mark.parametrize("op, expect", [
    (dist.ReduceOp.SUM, 3.0), (dist.ReduceOp.AVG, 1.5), (ReduceOp.SUM, 3.0), (ReduceOp.AVG, 1.5),
])
def test_sum_and_avg_are_honoured(comms, op, expect):
    futs = [c.allreduce_async(torch.full((70,), r + 1.0), op) for r, c in enumerate(comms)]
    assert all(f.wait().tolist() == [expect] * 70 for f in futs)


@pytest.mark.parametrize("op, message", [
    (dist.ReduceOp.MAX, "rank 0 passed reduce op MAX.*; rank 1 passed reduce op MAX"),
    (dist.ReduceOp.PRODUCT, "rank 0 passed reduce op PRODUCT"),
    (dist.ReduceOp.BXOR, "reduce op BXOR"),
])
def test_other_reduce_ops_are_refused_on_every_rank(comms, op, message):
    fail_alike([c.allreduce_async(torch.ones(70), op) for c in comms], message)
    assert_next_call_exact(comms)


def test_avg_of_int32_and_mixed_ops_are_refused(comms):
    fail_alike([c.allreduce_async(torch.ones(8, dtype=torch.int32), ReduceOp.AVG) for c in comms],
               "rank 0 passed AVG of an int32 tensor")
    fail_alike([comms[0].allreduce_async(torch.ones(8), ReduceOp.SUM),
                comms[1].allreduce_async(torch.ones(8), dist.ReduceOp.AVG)],
               r"rank 0: 8 x float, rank 1: 8 x float avg")
    assert_next_call_exact(comms)


def test_blocking_calls_keep_submission_order_behind_queued_ones(comms):
    """A blocking call runs on its caller's thread only when nothing queued before it is
    unfinished; otherwise it waits its turn (sizes differ call to call: any reordering would
    fail as a size mismatch)."""
    def rank(r):
        futs = [comms[r].allreduce_async(torch.full((100 + i,), 1.0)) for i in range(5)]
        blocking = [comms[r].allreduce(torch.full((7 + i,), r + 1.0)).tolist() for i in range(3)]
        return [f.wait().tolist() for f in futs], blocking

    for queued, blocking in on_ranks(rank, 2):
        assert queued == [[2.0] * (100 + i) for i in range(5)]
        assert blocking == [[3.0] * (7 + i) for i in range(3)]


# Another local process: sends RESULT datagrams for the job (right job id and epoch, slots,
# sets, offsets and counts a worker may be waiting for) to every worker, from its own socket on
# the aggregator's own IP, as fast as it can without starving the machine.
FORGER = r"""
import random, socket, sys, time
from inagg.hostlib.wire.protocol import HEADER_STRUCT, MSG_RESULT, VERSION
targets = [(h, int(p)) for h, p in (a.rsplit(":", 1) for a in sys.argv[1].split(","))]
job, epoch, k, slots = map(int, sys.argv[2:6])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[6], 0))
payload = (1 << 20).to_bytes(4, "big") * k
rng = random.Random(7)
print("forging", flush=True)
sent = 0
while True:
    for t in targets:
        ss = rng.randrange(2) << 15 | rng.randrange(slots)
        count = rng.choice((k, 0, 4))
        s.sendto(HEADER_STRUCT.pack(VERSION << 4 | MSG_RESULT, 0, job, 0, 0, epoch, ss, count,
                                    rng.randrange(8) * k) + (payload if count else b""), t)
        sent += 1
    if sent % 16 == 0:
        time.sleep(0.001)
"""


@pytest.mark.parametrize("with_switch", [True, False], ids=["switch", "host"])
def test_forged_results_from_another_process_change_nothing(with_switch):
    with LoopbackDeployment(2, with_switch=with_switch) as dep:
        comms = make_comms(dep, 2)
        forger = None
        try:
            g = comms[0].grant
            assert g.mode == ("switch" if with_switch else "host")
            targets = ",".join("%s:%d" % c.transport.address for c in comms)
            forger = subprocess.Popen(
                [sys.executable, "-c", FORGER, targets, str(g.job_id), str(g.epoch),
                 str(g.values_per_packet), str(g.slot_count), g.aggregator[0]],
                cwd=ROOT, stdout=subprocess.PIPE, text=True)
            assert forger.stdout.readline().strip() == "forging"
            for i in range(60):
                n = 50 + 97 * i   # 1 to 90 blocks
                futs = [c.allreduce_async(torch.full((n,), float(r + i))) for r, c in enumerate(comms)]
                for f in futs:
                    assert f.wait().tolist() == [float(2 * i + 1)] * n, i
            for c in comms:
                stats = c.stats()
                assert stats["result_drops"].get("foreign_source", 0) > 0, stats
                assert stats["allreduces"] == stats["calls"] == 60
        finally:
            if forger is not None:
                forger.kill()
                forger.wait()
            for c in comms:
                c.close()
