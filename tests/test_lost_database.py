"""A controller whose database was emptied or deleted under a running job, on real processes
(soft switch, controller, rank processes on loopback): the restarted controller reads the jobs
the switch holds over P4Runtime, never hands out their ids again (nor any id the database's
mark file remembers), says loudly which jobs it lost, and the old job's ranks fail at once
with that reason instead of stalling; a new job runs exact on the switch beside them."""

import os

import pytest

from inagg.bmv2_env.emulation.loopback import LoopbackDeployment
from inagg.hostlib.jobservice.client import ControllerClient, ControllerError
from test_controller import controller_env, new_job
from test_liveness import start_job


def job_ids(dep) -> list[int]:
    admin = ControllerClient(dep.controller)
    try:
        return sorted(j.job_id for j in admin.list_jobs(dep.admin_token).jobs)
    finally:
        admin.close()


def lose(database: str, how: str) -> None:
    """Empty the database file (truncated to nothing), or delete it, or delete it and its mark."""
    if how == "emptied":
        open(database, "w").close()
    else:
        os.unlink(database)
        if how == "deleted with its mark":
            os.unlink(database + ".ids")


@pytest.mark.parametrize("how", ["emptied", "deleted", "deleted with its mark"])
def test_a_lost_database_reuses_no_id_and_the_old_job_fails_with_the_reason(how):
    with LoopbackDeployment(4, rank_lease_seconds=4.0) as dep:
        old = start_job(dep, 2, [0, 1])
        new = []
        try:
            for r in old:
                r.wait_for("ok 10", 60)
            [old_id] = job_ids(dep)
            dep.stop_controller()
            lose(str(dep.dir / "controller.sqlite"), how)
            dep.start_controller()
            assert f"holds no record of job(s) {old_id} that switch(es) s1 hold" in dep.log("controller")
            for r in old:   # told at once (grant stream or heartbeat), not after a stall
                _, _, kind, message = r.wait_for("error", 60).split(" ", 3)
                assert kind == "JobFailed:", message
                assert f"job {old_id} is gone: the controller's database" in message, message
            new = start_job(dep, 2, [2, 3], calls=50)
            for r in new:
                assert r.wait_for(("done", "error"), 120) == "done", r.lines   # every call exact
            assert all(i > old_id for i in job_ids(dep))
        finally:
            for r in old + new:
                r.stop()


def test_job_ids_continue_above_the_mark_and_the_switch_in_process(tmp_path):
    """The same against an in-process controller: ids continue above an ended job's (the mark
    file, then the mark the switch keeps) and above a running job's (its job_table row), and
    the lost job's calls are refused with the reason; a controller with its database intact
    restores its jobs and loses none."""
    env = controller_env(tmp_path)
    e = next(env)
    try:
        client, database = e["client"], str(tmp_path / "ctl.sqlite")
        running, token = new_job(client, [1, 2], "running")
        ended, ended_token = new_job(client, [3, 4], "ended")
        for rank in (0, 1):
            client.leave(ended, ended_token, rank)
        e["stop"]()
        e["start"]()                                   # intact: nothing lost
        assert not e["ctl"]().lost
        e["stop"]()
        os.unlink(database)
        e["start"]()
        assert e["ctl"]().lost.keys() == {running}
        with pytest.raises(ControllerError, match=f"PERMISSION_DENIED: job {running} is gone: the controller's "
                                                  f"database {database} had no record of it"):
            client.heartbeat(running, token, 0)
        assert client.create_job(2)[0] == ended + 1    # the mark file: above the ended job
        e["stop"]()
        lose(database, "deleted with its mark")
        e["start"]()
        # the switch's mark: above every job that reached it (the ended one too), though the
        # database and its mark file are gone
        assert client.create_job(2)[0] > ended > running
    finally:
        next(env, None)
