"""A deployment's unix sockets under a long $TMPDIR (a CI's nested temporary directories, or
pytest-xdist's ``popen-gwN``): sockaddr_un holds 107 bytes of path, so the loopback deployment
puts its sockets where they fit (bmv2_env/emulation/testbed.py:socket_dir) and starts, instead of
failing gRPC's bind. Real services throughout: soft switch, controller, host aggregator."""

import shutil
import tempfile
from pathlib import Path

from inagg.bmv2_env.emulation.loopback import LoopbackDeployment
from inagg.bmv2_env.emulation.testbed import SUN_PATH_MAX, socket_dir
from inagg.hostlib.jobservice.client import ControllerClient


def _tmpdir(path, monkeypatch):
    path.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("TMPDIR", str(path))
    monkeypatch.setattr(tempfile, "tempdir", None)   # tempfile caches $TMPDIR on first use
    return path


def _long_tmpdir(tmp_path, monkeypatch):
    return _tmpdir(tmp_path / ("d" * 60) / ("e" * 40), monkeypatch)


def test_a_short_tmpdir_keeps_the_sockets_and_a_long_one_moves_them_to_tmp(tmp_path, monkeypatch):
    base = _tmpdir(Path(tempfile.mkdtemp(prefix="s", dir="/tmp")), monkeypatch)
    try:
        assert socket_dir("inagg-t-", "controller.sock").parent == base
    finally:
        shutil.rmtree(base)
    deep = _long_tmpdir(tmp_path, monkeypatch)
    moved = socket_dir("inagg-t-", "controller.sock")
    try:
        assert deep not in moved.parents and str(moved).startswith("/tmp/inagg-t-")
        assert len(str(moved / "controller.sock").encode()) <= SUN_PATH_MAX
        assert list(deep.iterdir()) == []   # the too-long directory was not left behind
    finally:
        moved.rmdir()


def test_a_deployment_starts_and_serves_under_a_long_tmpdir(tmp_path, monkeypatch):
    _long_tmpdir(tmp_path, monkeypatch)
    with LoopbackDeployment(2) as dep:
        client = ControllerClient(dep.controller)
        try:
            job_id, _ = client.create_job(2)
            assert job_id > 0
        finally:
            client.close()
