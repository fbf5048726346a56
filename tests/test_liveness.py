"""Per-rank liveness and switch restarts, against the real processes on loopback: ranks run as
their own processes (tests/rank_process.py), one is SIGKILLed, the soft switch is restarted, or
the controller is stopped (restarted on its database, or SIGSTOPped and continued) under a running job."""

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import torch
import torch.distributed as dist

from inagg.bmv2_env.emulation.loopback import LoopbackDeployment
from inagg.hostlib.jobservice.client import ControllerClient, ControllerError
from inagg.hostlib.worker.communicator import Communicator, JobFailed
from inagg.hostlib.errors import InaggError
from rank_fork import RankProcess
from test_training import on_ranks

RANK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_process.py")


class Rank:
    """A rank process and the lines it printed (read by a thread); forked (tests/rank_fork.py):
    what these tests assert starts after the rank's imports."""

    def __init__(self, store: str, rank: int, n: int, dep: LoopbackDeployment, host: int, calls: int = 0,
                 launch: str = "", value: float = 1.0, declared: int = 0):
        """``launch``: its launch id (``$INAGG_LAUNCH_ID``); ``value``: what it contributes;
        ``declared``: the bytes per iteration its job declares."""
        env = {**os.environ, "INAGG_LAUNCH_ID": launch} if launch else None
        self.proc = RankProcess([sys.executable, RANK, store, str(rank), str(n), dep.controller,
                                 dep.worker_ip(host), str(calls), str(value), str(declared)],
                                stdout=subprocess.PIPE, text=True, env=env)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.strip())

    def wait_for(self, prefix: str | tuple[str, ...], timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.lines:
                if line.startswith(prefix):
                    return line
            if self.proc.poll() is not None and not self.reader.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"rank never printed {prefix!r}: {self.lines}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def start_job(dep, n, hosts, calls=0, declared=0):
    store = os.path.join(tempfile.mkdtemp(), "store")
    return [Rank(store, r, n, dep, hosts[r], calls, declared=declared) for r in range(n)]


def in_process_job(dep, hosts):
    """One communicator per rank in this process, rank r on host ``hosts[r]``."""
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), len(hosts))
    return on_ranks(lambda r: Communicator(store, r, len(hosts), dep.controller,
                                           bind_ip=dep.worker_ip(hosts[r])), len(hosts))


def allreduce_all(comms, n=500):
    futs = [c.allreduce_async(torch.ones(n)) for c in comms]
    return [f.wait().tolist() for f in futs]


def test_killed_rank_is_named_to_its_peers_and_its_slots_are_reused():
    # min_window 1024: the whole slot pool is one job's, so the other job waits on host
    with LoopbackDeployment(5, min_window=1024, rank_lease_seconds=4.0) as dep:
        ranks = start_job(dep, 3, [0, 1, 2])
        other = None
        try:
            for r in ranks:
                r.wait_for("ok 10", 60)
            other = in_process_job(dep, [3, 4])
            assert [c.grant.mode for c in other] == ["host", "host"]   # the switch is full
            victim = ranks[2]
            victim.proc.kill()
            killed_at = time.time()
            errors = [r.wait_for("error", 40) for r in ranks[:2]]
            for line in errors:
                _, when, kind, message = line.split(" ", 3)
                assert kind == "JobFailed:", line
                assert f"rank 2 ({dep.worker_ip(2)}:" in message and "stopped" in message, line
                # named within the rank lease and the lease check, far below the 120 s stall timeout
                assert float(when) - killed_at < 4.0 + 6.0, line
            # the other job is untouched, and gets the freed slots at its next boundaries
            for _ in range(100):
                assert allreduce_all(other) == [[2.0] * 500] * 2
                if all(c.grant.mode == "switch" for c in other):
                    break
            assert [c.grant.mode for c in other] == ["switch", "switch"]
            assert other[0].grant.slot_count == 1024
            admin = ControllerClient(dep.controller)
            jobs = {j.job_id: j for j in admin.list_jobs(dep.admin_token).jobs}
            admin.close()
            failed = [j for j in jobs.values() if j.failure]
            assert len(failed) == 1 and "rank 2" in failed[0].failure
            assert not jobs[other[0].job_id].failure
        finally:
            for r in ranks:
                r.stop()
            for c in other or ():
                c.close()


def test_restarted_switch_is_reprogrammed_and_the_job_finishes_exact():
    with LoopbackDeployment(2, rank_lease_seconds=6.0) as dep:
        ranks = start_job(dep, 2, [0, 1], calls=400)
        try:
            for r in ranks:
                r.wait_for("ok 30", 60)
            dep.restart_switch()               # no pipeline, no entries, no slot state
            for r in ranks:
                r.wait_for("done", 120)
            assert not any(line.startswith("error") for r in ranks for line in r.lines)
            assert "switch s1 re-programmed (1 job(s))" in dep.log("controller")
        finally:
            for r in ranks:
                r.stop()


def test_close_fails_the_call_in_flight_and_ends_every_thread():
    """close() on a rank whose call waits for a peer that never joins it: by the time close()
    returns the call has failed as closed (not after the stall timeout), and none of the
    communicators' threads is left (one still inside a native call when the interpreter exits
    aborts the process)."""
    before = set(threading.enumerate())
    with LoopbackDeployment(2) as dep:
        comms = in_process_job(dep, [0, 1])
        assert allreduce_all(comms) == [[2.0] * 500] * 2
        pending = comms[0].allreduce_async(torch.ones(500))   # rank 1 never makes this call
        for c in comms:
            c.close()
        assert pending.done()
        with pytest.raises(InaggError, match="rank 0: the communicator was closed before this call ended"):
            pending.wait()
        with pytest.raises(InaggError, match="closed"):
            comms[1].allreduce(torch.ones(10))
    assert not [t.name for t in set(threading.enumerate()) - before if t.name.startswith("inagg-")]


def went_on_exact(dep: LoopbackDeployment, ranks: list, seconds: float) -> None:
    """After ``seconds`` more, no rank said an error, rank 0 made more calls (each one exact),
    and the controller failed no job."""
    calls_before = len(ranks[0].lines)
    time.sleep(seconds)
    assert not [line for r in ranks for line in r.lines if line.startswith("error")]
    assert len(ranks[0].lines) > calls_before
    admin = ControllerClient(dep.controller)
    jobs = admin.list_jobs(dep.admin_token).jobs
    admin.close()
    assert [j.failure for j in jobs] == [""]


def test_a_controller_down_longer_than_a_rank_lease_fails_no_healthy_job():
    """The controller is stopped for 15 s (far over the 4 s rank lease and over a heartbeat's
    10 s deadline) under a running job and restarted on its SQLite: the restored controller
    hears every rank again before their leases run out, and the job goes on exact."""
    with LoopbackDeployment(2, rank_lease_seconds=4.0) as dep:
        ranks = start_job(dep, 2, [0, 1])
        try:
            for r in ranks:
                r.wait_for("ok 10", 60)
            dep.stop_controller()
            time.sleep(15.0)
            dep.start_controller()
            went_on_exact(dep, ranks, 4.0 + 10.0 + 3.0)   # rank lease + heartbeat deadline + the lease check
        finally:
            for r in ranks:
                r.stop()


def test_only_the_admin_or_every_rank_ends_a_job_and_its_ranks_are_told_who():
    """A rank-less LeaveJob carrying the job's token is refused (the job runs on); the
    operator's ReleaseJob ends it and every rank's next call fails at once with JobFailed
    saying so (not after the stall timeout)."""
    with LoopbackDeployment(2) as dep:
        comms = in_process_job(dep, [0, 1])
        client = ControllerClient(dep.controller)
        try:
            with pytest.raises(ControllerError, match="PERMISSION_DENIED: ending job .* needs the admin token"):
                client.leave(comms[0].job_id, comms[0].token)
            assert allreduce_all(comms) == [[2.0] * 500] * 2
            client.release(dep.admin_token, comms[0].job_id)
            started = time.monotonic()
            for c in comms:
                with pytest.raises(JobFailed, match=f"job {c.job_id} failed: ended by the operator"):
                    c.allreduce(torch.ones(500))
            assert time.monotonic() - started < 5.0
        finally:
            client.close()
            for c in comms:
                c.close()


def test_a_controller_stalled_longer_than_a_rank_lease_fails_no_healthy_rank():
    """The controller process is SIGSTOPped for 9 s (over the 4 s rank lease) under a running
    job of rank processes, then continued: its own stall is not the ranks' silence (the beats
    queued meanwhile arrive after its lease thread first looks), so no rank is failed and the
    calls go on exact. Counted, not timed: the job's failures and the ranks' errors are 0."""
    with LoopbackDeployment(2, rank_lease_seconds=4.0) as dep:
        ranks = start_job(dep, 2, [0, 1])
        try:
            for r in ranks:
                r.wait_for("ok 10", 60)
            os.kill(dep.controller_proc.pid, signal.SIGSTOP)
            try:
                time.sleep(9.0)
            finally:
                os.kill(dep.controller_proc.pid, signal.SIGCONT)
            went_on_exact(dep, ranks, 4.0 + 3.0)   # a rank lease and a few lease checks after the stall
        finally:
            for r in ranks:
                r.stop()
