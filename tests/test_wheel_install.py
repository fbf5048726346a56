"""A regular, non-editable install runs the control plane: the sdist carries p4/ whole, the wheel
built from it carries the compiled P4 programs (controller/artifacts.py finds them there), and
from a working directory outside the checkout the default programs load from the wheel,
``inagg up``/``status``/``down`` work, and a 2-rank ``init_process_group("inagg")`` with nothing
started by hand allreduces through the software switch of the deployment rank 0 starts.

Frugal with time and the network: one sdist, one wheel built from it with this venv's build tools
(no build isolation, nothing downloaded; the C++ compile is most of the ~25 s), installed
``--no-deps`` into a fresh venv that then sees this venv's site-packages (torch, p4runtime-shell,
...) but not the checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from test_worker_install import pip

ROOT = Path(__file__).resolve().parents[1]

RANK_SCRIPT = """
import json, sys
import torch, torch.distributed as dist
import inagg.hostlib

dist.init_process_group("inagg")            # no INAGG_CONTROLLER: rank 0 starts the services
t = torch.ones(1000)
dist.all_reduce(t)
assert t.tolist() == [2.0] * 1000, t[:4]
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"inagg": inagg.hostlib.__file__, "stats": dist.group.WORLD.stats()}, f)
dist.barrier()
dist.destroy_process_group()
"""


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what would point a command at the checkout or a deployment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INAGG_") and k != "PYTHONPATH"}
    return {**env, **extra}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from the checkout's sdist, as pip builds one from PyPI's sdist."""
    out = tmp_path_factory.mktemp("dist")
    build = f"from scikit_build_core.build import build_sdist; print(build_sdist({str(out)!r}))"
    sdist = subprocess.run([sys.executable, "-c", build], cwd=ROOT, capture_output=True, text=True,
                           timeout=300, check=True).stdout.split()[-1]   # after the builder's banner
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                           "--wheel-dir", str(out), str(out / sdist)], cwd=out, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return next(out.glob("inagg-*.whl"))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed (its bin/); this venv's packages are added after
    the install, so pip never sees the checkout's editable inagg there."""
    fresh = tmp_path_factory.mktemp("wheel-venv")
    venv.create(fresh, with_pip=False)
    pip(fresh, "install", "--no-deps", "--quiet", str(wheel))
    site = subprocess.run([str(fresh / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    (Path(site) / "inagg-test-dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")
    return fresh / "bin"


def test_the_default_programs_load_from_the_wheel(installed, tmp_path):
    code = ("from inagg.controller.artifacts import p4_dir; from inagg.controller.config import DEFAULT_ARTIFACTS, "
            "default_program; [default_program(t).device_config() for t in DEFAULT_ARTIFACTS]; print(p4_dir())")
    proc = subprocess.run([str(installed / "python"), "-c", code], cwd=tmp_path, env=clean_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).is_relative_to(installed.parent), proc.stdout   # not the checkout's p4/


def test_inagg_up_status_down_from_the_wheel(installed, tmp_path):
    env = clean_env(INAGG_STATE_DIR=str(tmp_path / "state"))

    def inagg(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(installed / "inagg"), *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)

    up = inagg("up", "--workers", "2")
    assert up.returncode == 0, up.stderr + (tmp_path / "state" / "services.log").read_text()
    try:
        status = inagg("status")
        assert status.returncode == 0 and "0 job(s)" in status.stdout, status.stdout + status.stderr
    finally:
        down = inagg("down")
    assert down.returncode == 0, down.stderr
    assert inagg("status").returncode == 1


def test_a_two_rank_job_runs_on_the_wheel_with_nothing_started_by_hand(installed, tmp_path):
    script, out = tmp_path / "job.py", tmp_path / "rank0.json"
    script.write_text(RANK_SCRIPT)
    proc = subprocess.run([str(installed / "python"), "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node=2", str(script), str(out)], cwd=tmp_path,
                          # every rank a switch worker: ranks on one host would otherwise start no
                          # deployment, and this test is the wheel's control plane serving a job
                          env=clean_env(INAGG_ALLREDUCE_PATH="inagg", INAGG_HOST_REDUCE="off"), capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads(out.read_text())
    assert Path(result["inagg"]).is_relative_to(installed.parent)
    assert result["stats"]["allreduce_paths"] == {"inagg": 1}
    assert result["stats"]["inagg"]["mode"] == "switch"
