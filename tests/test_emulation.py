"""The Mininet emulation end to end (needs root and Debian's mininet): bring up, train, check,
tear down leaving nothing behind. Runs on the software data plane, and on BMv2 when installed."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from bmv2_env.testbed import bmv2_missing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mininet_missing():
    if os.geteuid() != 0:
        return "Mininet needs root"
    if shutil.which("mnexec") is None or not os.path.isdir("/usr/lib/python3/dist-packages/mininet"):
        return "Mininet not installed (apt-get install mininet)"
    return None


def snapshot():
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    names = sorted(l.split(":")[1].strip().split("@")[0] for l in links.splitlines())
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    procs = subprocess.run(["pgrep", "-f", "soft_switch|simple_switch_grpc|hostlib.aggregator|train_demo --worker"],
                           capture_output=True, text=True).stdout.split()
    return names, netns, procs


def run_topology(tmp_path, topo, dataplane, epochs=None, transport=None):
    out = tmp_path / "summary.json"
    cmd = [sys.executable, "-m", "bmv2_env.mininet_run", "--topo", f"bmv2_env/topologies/{topo}",
           "--dataplane", dataplane, "--json", str(out)] + (["--epochs", str(epochs)] if epochs else []) \
        + (["--transport", transport] if transport else [])
    before = snapshot()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert snapshot() == before, "the run left interfaces, namespaces or processes behind"
    return {r["name"]: r for r in json.loads(out.read_text())}, proc.stdout


@pytest.mark.parametrize("dataplane", ["soft", "bmv2"])
def test_single_switch_training(tmp_path, dataplane):
    reason = mininet_missing() or (bmv2_missing() if dataplane == "bmv2" else None)
    if reason:
        pytest.skip(reason)
    rows, stdout = run_topology(tmp_path, "single_switch.json", dataplane, epochs=3)
    job = rows["mlp"]
    assert job["ok"] and job["mode"] == "switch" and job["transport"] == "udp"
    assert job["accuracy"] >= 0.75, stdout            # 3 epochs of the demo reach 75.8 %
    assert job["switch_results"] > 0 and job["host_results"] == 0
    assert "contributions aggregated" in stdout


@pytest.mark.parametrize("dataplane", ["soft", "bmv2"])
def test_single_switch_training_over_roce(tmp_path, dataplane):
    """The same job with its switch traffic carried as RoCEv2 (raw sockets in the hosts): the
    data plane parses it, aggregates, and sends results the workers' ICRC check accepts."""
    reason = mininet_missing() or (bmv2_missing() if dataplane == "bmv2" else None)
    if reason:
        pytest.skip(reason)
    rows, stdout = run_topology(tmp_path, "single_switch.json", dataplane, epochs=1, transport="roce")
    job = rows["mlp"]
    assert job["ok"] and job["mode"] == "switch" and job["transport"] == "roce", stdout
    assert job["accuracy"] >= 0.6, stdout             # 1 epoch: 64.2 %, as over UDP
    assert job["switch_results"] > 0 and job["host_results"] == 0


def test_two_jobs_fallback_and_upgrade(tmp_path):
    reason = mininet_missing()
    if reason:
        pytest.skip(reason)
    rows, stdout = run_topology(tmp_path, "two_jobs.json", "soft")
    first, second = rows["first"], rows["second"]
    assert first["ok"] and second["ok"], stdout
    assert first["mode"] == "switch" and first["host_results"] == 0
    assert second["host_results"] > 0, "the second job should start on the host aggregator"
    assert second["mode"] == "switch" and second["grant_changes"] >= 1 and second["switch_results"] > 0
    assert first["accuracy"] > 0.9 and second["accuracy"] > 0.9, stdout
