"""``make run`` with workloads and link loss where the kernel has no netem, end to end in
Mininet on the software data plane (root; skipped without Mininet).

Two jobs: the MLP for 60 iterations from time zero over a link losing 2 % and delaying 5 ms
(applied by the soft switch's port, both ways), and a synthetic profile arriving 2 s later
for 2 s. The summary
gives each job's arrival, completion time and throughput, Jain's fairness across them, and
the drops each port counted, which its captures confirm frame by frame; the MLP's parameters are the bits of the same job on clean
links; BMv2 is refused the loss before anything is built. The same job through a port that
also jitters, duplicates and reorders, beside a link whose rate follows a schedule: the bits
again, the port's counts confirmed by its captures, each rate change reported as tc shows it."""

import json
import shutil
import subprocess
import sys

import pytest

from tests.test_emulation import ROOT, mininet_missing, run_topology
from tests.test_emulation_config import topo
from tests.test_soft_switch_udp import pcap_frames


def write_topology(tmp_path, loss: float, profile: bool, h1: dict | None = None, h2: dict | None = None):
    """Jobs a (and with ``profile`` b) on one switch, h1's link losing ``loss`` % and delaying
    5 ms, with ``h1``'s and ``h2``'s link options besides."""
    h1 = {**({"loss": loss, "delay": "5ms"} if loss else {}), **(h1 or {})}
    links = [["h1", "s1-p1", h1] if h1 else ["h1", "s1-p1"], ["h2", "s1-p2", h2] if h2 else ["h2", "s1-p2"],
             ["h3", "s1-p3"], ["h4", "s1-p4"], ["agg", "s1-p5"]]
    jobs = [{"name": "a", "workers": ["h1", "h2"], "iterations": 60}]
    if profile:
        jobs.append({"name": "b", "workers": ["h3", "h4"], "start": 2, "duration": 2,
                     "profile": {"bucket_bytes": [16384], "compute_ms": 10}})
    data = topo(links, jobs)
    del data["switches"]["s2"]
    path = tmp_path / f"topo-{loss}-{profile}-{len(h1)}.json"
    path.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """Job a's row on clean links (the bits the impaired runs must reproduce)."""
    if reason := mininet_missing():
        pytest.skip(reason)
    tmp_path = tmp_path_factory.mktemp("clean")
    rows, _, _ = run_topology(tmp_path, str(write_topology(tmp_path, 0, False)), "soft")
    return rows["a"]


@pytest.fixture
def mininet():
    if reason := mininet_missing():
        pytest.skip(reason)


def test_jobs_arrive_and_link_loss_is_applied_counted_and_exact(tmp_path, clean):
    rows, stdout, run = run_topology(tmp_path, str(write_topology(tmp_path, 2, True)), "soft")
    a, b = rows["a"], rows["b"]
    assert a["train_steps"] == 60 and a["arrival_s"] == 0 and a["jct_s"] > 0 and a["steps_per_s"] > 0
    assert b["workload"] == "profile" and b["arrival_s"] >= 2 and b["jct_s"] >= 2 and b["accuracy"] is None
    assert b["grad_bytes_per_step"] == 16384 and b["grad_bytes_per_s"] > 0
    saved = json.loads((run.path / "summary.json").read_text())
    assert saved["fairness"]["jobs"] == 2 and 0.5 <= saved["fairness"]["jain_grad_bytes_per_s"] <= 1
    assert "Jain's fairness index over 2 job(s)" in stdout
    ports = json.loads((run.path / "logs" / "s1-port-loss.json").read_text())
    assert [(e["port"], e["direction"]) for e in ports] == [(1, "in"), (1, "out")]
    assert all(e["seen"] > 0 and e["dropped"] > 0 for e in ports), ports
    for e in ports:   # on the wire: the port's capture holds what it neither lost nor kept from the link
        capture = run.path / "pcaps" / f"{run.run_id}s1-eth1_{e['direction']}.pcap"
        assert len(pcap_frames(capture)) == e["seen"] - e["dropped"] == e["delayed"], e
    # every allreduce waits for h1's contribution (5 ms in) and its result (5 ms out): a lower
    # bound, which a loaded machine only raises
    assert a["link_delay_ms"] == 5 and a["call_ms_median"] >= 10, a
    assert a["link_loss_pct"] == 2 and 0 < a["link_loss_measured_pct"] < 10 and a["retransmissions"] > 0
    assert "  p1 in " in stdout and "delayed 5 ms" in stdout and "NOT applied" not in stdout
    assert clean["params_sha256"] == a["params_sha256"] and clean["link_loss_measured_pct"] is None


def test_jitter_duplicates_reordering_and_a_rate_schedule_keep_the_bits(tmp_path, clean):
    """h1's port loses 1 %, delays 4 ms +- 3 ms, sends 5 % twice and 10 % at once (both ways);
    h2's link runs at 100, then 20, then 100 Mbit/s: job a's parameters are the clean run's
    bits; each port direction's capture holds the frames it kept plus its copies; reordering
    happened and is counted; each rate change is in the summary as tc showed it."""
    h1 = {"delay": "4ms", "jitter": "3ms", "duplicate": 5, "reorder": 10}
    topo = write_topology(tmp_path, 1, False, h1, {"bw_schedule": [[0, 100], [0.1, 20], [0.2, 100]]})
    rows, stdout, run = run_topology(tmp_path, str(topo), "soft")
    a = rows["a"]
    assert a["params_sha256"] == clean["params_sha256"] and a["train_steps"] == 60
    ports = json.loads((run.path / "logs" / "s1-port-loss.json").read_text())
    for e in ports:
        capture = run.path / "pcaps" / f"{run.run_id}s1-eth1_{e['direction']}.pcap"
        assert len(pcap_frames(capture)) == e["seen"] - e["dropped"] + e["duplicated"], e
        assert e["duplicated"] > 0 and e["delayed"] > 0 and (e["jitter_ms"], e["reorder_pct"]) == (3, 10), e
    assert sum(e["reordered"] for e in ports) > 0 and a["link_reordered_pct"] > 0 and a["link_duplicated_pct"] > 0
    assert a["link_jitter_ms"] == 3 and "reordered" in stdout and "duplicated (of 5 %)" in stdout
    changes = json.loads((run.path / "summary.json").read_text())["links"]["bw_changes"]
    assert [(c["link"], c["mbit"], c["mbit_applied"]) for c in changes][:3] == [
        ("h2-s1-p2", 100, [100, 100]), ("h2-s1-p2", 20, [20, 20]), ("h2-s1-p2", 100, [100, 100])], changes
    assert changes[0]["at_s"] < 0 < 0.1 <= changes[1]["at_s"] and "link h2-s1-p2: 20 Mbit/s asked" in stdout


def test_bmv2_is_refused_loss_and_delay_naming_the_software_data_plane(tmp_path, mininet):
    proc = subprocess.run([sys.executable, "-m", "inagg.bmv2_env.emulation.mininet_run", "--topo",
                           str(write_topology(tmp_path, 1, False)), "--dataplane", "bmv2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    if "simple_switch_grpc is not on PATH" in proc.stderr:
        pytest.skip("BMv2 is not installed")
    assert proc.returncode != 0 and "run it on the software data plane (make run DATAPLANE=soft" in proc.stderr
    assert "switch s1" not in proc.stdout      # no switch was started


def test_bmv2_follows_a_rate_schedule(tmp_path, mininet):
    """A bw_schedule is tc's, not the data plane's: on BMv2 h2's link takes each rate in turn
    (the rates tc shows after each change in the summary) and job a trains to the end."""
    if shutil.which("simple_switch_grpc") is None:
        pytest.skip("BMv2 is not installed")
    topo = write_topology(tmp_path, 0, False, None, {"bw_schedule": [[0, 50], [0.1, 10], [0.2, 50]]})
    rows, stdout, run = run_topology(tmp_path, str(topo), "bmv2")
    assert rows["a"]["ok"] and rows["a"]["train_steps"] == 60
    changes = json.loads((run.path / "summary.json").read_text())["links"]["bw_changes"]
    assert [(c["mbit"], c["mbit_applied"]) for c in changes][:3] == [(50, [50, 50]), (10, [10, 10]), (50, [50, 50])]
    assert "link h2-s1-p2: 10 Mbit/s asked, 10/10 Mbit/s applied" in stdout and "port impairments" not in stdout
