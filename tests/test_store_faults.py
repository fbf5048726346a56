"""The controller's database failing under it, on real processes: a full filesystem (a small
tmpfs) and a read-only one. Mounting needs root (CAP_SYS_ADMIN); elsewhere these are skipped."""

import json
import os
import subprocess
import sys
import time

import pytest

from inagg.bmv2_env.emulation.loopback import LoopbackDeployment
from inagg.hostlib.jobservice.client import ControllerClient, ControllerError
from test_liveness import start_job


@pytest.fixture
def tmpfs(tmp_path):
    """A 1 MiB tmpfs at a fresh folder (unmounted afterwards)."""
    where = tmp_path / "fs"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=True)


def fill(where) -> None:
    """Write into ``where`` until its filesystem is full."""
    fd = os.open(where / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def test_a_full_disk_refuses_new_jobs_clearly_and_still_declares_a_dead_rank(tmpfs):
    database = tmpfs / "controller.sqlite"
    with LoopbackDeployment(3, rank_lease_seconds=4.0, database=database) as dep:
        ranks = start_job(dep, 3, [0, 1, 2])
        try:
            for r in ranks:
                r.wait_for("ok 10", 60)
            fill(tmpfs)
            client = ControllerClient(dep.controller)
            with pytest.raises(ControllerError, match=f"RESOURCE_EXHAUSTED: controller database {database}: "
                                                      f".*full.*free space on its filesystem"):
                client.create_job(2)
            client.close()
            ranks[2].proc.kill()
            killed_at = time.time()
            for r in ranks[:2]:
                _, when, kind, message = r.wait_for("error", 30).split(" ", 3)
                assert kind == "JobFailed:" and "rank 2 (" in message and "stopped" in message, message
                assert float(when) - killed_at < 10.0, message
        finally:
            for r in ranks:
                r.stop()


def test_a_read_only_database_is_one_line_at_start(tmpfs, tmp_path):
    config = {"listen": f"unix:{tmp_path}/ctl.sock", "admin_token": "x", "host_aggregator": "127.0.0.1:42666",
              "database": str(tmpfs / "controller.sqlite"), "switches": []}
    (tmp_path / "ctl.json").write_text(json.dumps(config))
    start = [sys.executable, "-m", "inagg.controller", "--config", str(tmp_path / "ctl.json")]
    first = subprocess.Popen(start, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert "serving" in first.stdout.readline()     # the database now exists
    first.terminate()
    first.wait()
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    done = subprocess.run(start, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"inagg-controller: controller database {tmpfs}/controller.sqlite: cannot open it for writing: "
        f"attempt to write a readonly database; make the file and its folder writable by the controller's user"]
