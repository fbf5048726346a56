"""Two launches of a 2-rank job given one rendezvous store, in many launch orders, skewed ones
included (one rank of each launch first, the other ranks seconds later: the order that mixed
jobs before launches had an identity): whatever the order, one launch runs and every call of it
is exact, every rank of the other is refused with ``SharedStore`` naming both launches, and no
call ever mixes them. Each launch contributes its own value, so a mixed call is a wrong result.

Real parts throughout: a loopback deployment (soft switch, controller, host aggregator), real
communicators, a TCPStore as ``MASTER_PORT`` gives one; the launch id is what a launcher sets
(``$INAGG_LAUNCH_ID``, torchrun's run id: inagg.hostlib.worker.launch_identity)."""

import os
from datetime import timedelta
import random
import re
import tempfile
import threading
import time

import numpy as np
import pytest
import torch.distributed as dist

from inagg.bmv2_env.emulation.loopback import LoopbackDeployment
from inagg.hostlib.jobservice.client import ControllerClient, ControllerError
from inagg.hostlib.worker.communicator import Communicator
from inagg.hostlib.pytorch.backend import LAUNCH_PREFIX, InaggProcessGroup
from inagg.hostlib.worker.launch_identity import SharedStore, claim_store, launch_id
from test_liveness import Rank

N = 2                     # ranks per launch
VALUE = {"A": 1.0, "B": 3.0}
CALLS = 5


def run_rank(dep, port: int, launch: str, rank: int, delay: float, out: dict) -> None:
    """One rank of launch ``launch`` (hosts: A on 0-1, B on 2-3) arriving after ``delay`` s; its
    outcome goes to ``out[(launch, rank)]``: "refused: MESSAGE", the results of its calls, or
    the error."""
    time.sleep(delay)
    host = rank + (0 if launch == "A" else N)
    try:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
        comm = Communicator(store, rank, N, dep.controller, bind_ip=dep.worker_ip(host), launch=launch,
                            timeout=60.0)
    except SharedStore as e:
        out[(launch, rank)] = f"refused: {e}"
        return
    except Exception as e:  # noqa: BLE001 - reported to the test
        out[(launch, rank)] = f"error: {type(e).__name__}: {e}"
        return
    try:
        out[(launch, rank)] = [comm.allreduce(np.full(256, VALUE[launch], np.float32))[0] for _ in range(CALLS)]
    except Exception as e:  # noqa: BLE001 - reported to the test
        out[(launch, rank)] = f"error: {type(e).__name__}: {e}"
    finally:
        comm.close()


def one_trial(dep, arrivals: list[tuple[str, int, float]]) -> tuple[int, int]:
    """Launch the ranks of ``arrivals`` ((launch, rank, delay)) on one fresh store; returns
    (calls checked, wrong calls) and asserts one launch ran and the other was refused."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    out: dict = {}
    threads = [threading.Thread(target=run_rank, args=(dep, server.port, launch, rank, delay, out))
               for launch, rank, delay in arrivals]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(out) == 2 * N, out
    refused = {launch for (launch, _), o in out.items() if isinstance(o, str) and o.startswith("refused")}
    assert len(refused) == 1, out                       # exactly one launch is refused ...
    loser = refused.pop()
    winner = "B" if loser == "A" else "A"
    for rank in range(N):                               # ... on every rank, naming the clash
        message = out[(loser, rank)]
        assert "two launches share one rendezvous store" in message, message
        assert re.search(rf"launch '{loser}' rank {rank} found this rendezvous store held by launch '{winner}'",
                         message), message
    wrong = checked = 0
    for rank in range(N):
        results = out[(winner, rank)]
        assert isinstance(results, list), out           # the other runs every call
        checked += len(results)
        wrong += sum(r != N * VALUE[winner] for r in results)
    return checked, wrong


ORDERS = [   # (launch, rank, delay s): the first rank of each launch, then the others
    [("A", 0, 0.0), ("A", 1, 0.1), ("B", 0, 0.2), ("B", 1, 0.3)],          # one after the other
    [("A", 0, 0.0), ("B", 1, 0.1), ("A", 1, 0.2), ("B", 0, 0.3)],          # interleaved
    [("A", 0, 0.0), ("B", 1, 0.0), ("A", 1, 2.0), ("B", 0, 2.0)],          # skewed: a mixed pair first
    [("B", 1, 0.0), ("A", 0, 0.3), ("B", 0, 2.5), ("A", 1, 2.5)],          # skewed, the other way
    [("A", 1, 0.0), ("B", 0, 0.0), ("B", 1, 0.0), ("A", 0, 0.0)],          # all at once
]


def test_two_launches_on_one_store_never_share_a_call_in_any_order():
    rng = random.Random(37)
    trials = ORDERS + [[(launch, rank, rng.uniform(0.0, 1.5)) for launch in "AB" for rank in range(N)]
                       for _ in range(15)]
    with LoopbackDeployment(2 * N) as dep:
        totals = [one_trial(dep, arrivals) for arrivals in trials]
    checked = sum(c for c, _ in totals)
    assert sum(w for _, w in totals) == 0
    assert checked == len(trials) * N * CALLS        # 20 trials, every call of the winner checked


def test_rank_processes_of_two_launches_skewed_on_one_file_store():
    """As the held-out case: rank processes on one FileStore, each launch's id in its
    environment (``$INAGG_LAUNCH_ID``), rank 0 of one launch and rank 1 of the other first."""
    with LoopbackDeployment(2 * N) as dep:
        store = os.path.join(tempfile.mkdtemp(), "store")
        first = [Rank(store, 0, N, dep, host=0, calls=30, launch="A", value=1.0),
                 Rank(store, 1, N, dep, host=3, calls=30, launch="B", value=3.0)]
        time.sleep(3.0)
        late = [Rank(store, 1, N, dep, host=1, calls=30, launch="A", value=1.0),
                Rank(store, 0, N, dep, host=2, calls=30, launch="B", value=3.0)]
        ranks = {("A", 0): first[0], ("B", 1): first[1], ("A", 1): late[0], ("B", 0): late[1]}
        try:
            outcome = {key: r.wait_for(("done", "error"), 120) for key, r in ranks.items()}
            done = {launch for (launch, _), line in outcome.items() if line == "done"}
            assert len(done) == 1, outcome
            loser = "B" if done == {"A"} else "A"
            for (launch, _), line in outcome.items():
                if launch == loser:
                    assert "SharedStore" in line and "two launches share one rendezvous store" in line, line
                else:
                    assert line == "done", line       # every call checked exact (rank_process.py)
        finally:
            for r in ranks.values():
                r.stop()


def test_the_controller_refuses_a_rank_of_another_launch_and_every_grant_carries_the_nonce():
    with LoopbackDeployment(2) as dep:
        client = ControllerClient(dep.controller)
        try:
            job_id, token = client.create_job(2, nonce="a" * 32)
            with pytest.raises(ControllerError, match=r"FAILED_PRECONDITION: job \d+: rank 1 joins with launch "
                                                      r"nonce bbbbbbbb\.\.\., the job's is aaaaaaaa"):
                client.join(job_id, token, 1, f"{dep.worker_ip(1)}:47001", nonce="b" * 32)
            with pytest.raises(ControllerError, match="joins with launch nonce none"):
                client.join(job_id, token, 1, f"{dep.worker_ip(1)}:47001")
            client.join(job_id, token, 0, f"{dep.worker_ip(0)}:47000", nonce="a" * 32)
            client.join(job_id, token, 1, f"{dep.worker_ip(1)}:47001", nonce="a" * 32)
            stream = client.watch(job_id, token)
            assert next(stream).nonce == "a" * 32
            stream.cancel()
        finally:
            client.close()


@pytest.mark.parametrize("env, expected", [
    ({}, ""),
    ({"INAGG_LAUNCH_ID": "x", "TORCHELASTIC_RUN_ID": "r"}, "x"),
    ({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "7", "SLURM_STEP_ID": "2"}, "slurm:7.2"),
    ({"TORCHELASTIC_RUN_ID": "r1", "TORCHELASTIC_RESTART_COUNT": "3"}, "torchrun:r1/3"),
])
def test_the_launch_id_comes_from_the_launcher(env, expected):
    assert launch_id(None, env) == expected
    assert launch_id("given", env) == "given"


def test_the_backend_claims_the_store_before_anything_else(monkeypatch):
    """``init_process_group("inagg")`` on a store another launch holds is refused before it
    starts a deployment, a gloo group or a job: nothing else is written to the store."""
    store = dist.HashStore()
    claim_store(dist.PrefixStore(LAUNCH_PREFIX, store), 0, "A")
    monkeypatch.setenv("INAGG_LAUNCH_ID", "B")
    with pytest.raises(SharedStore, match="launch 'B' rank 1 found this rendezvous store held by launch 'A'"):
        InaggProcessGroup(store, 1, 2, timedelta(seconds=5))
    assert store.num_keys() == 1
