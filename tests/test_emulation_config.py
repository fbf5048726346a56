"""What the emulation launcher decides before it starts anything (no root needed): the topology
parser, the scaling of EPOCHS across jobs, equal steps per rank, per-run names and records."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from inagg.controller.config import parse_config
from inagg.controller.trees import host_aggregator_at, job_tree
from inagg.bmv2_env.emulation.mininet_run import controller_switches, job_epochs, main as mininet_main
from inagg.bmv2_env.emulation.run_dir import RunDir, process_start_time, stop_run
from inagg.bmv2_env.emulation.topology import Endpoint, TopologyError, host_ip, load_topology, parse_topology
from inagg.bmv2_env.demos.train_demo import load_digits_split, steps_per_epoch

ROOT = Path(__file__).resolve().parents[1]


def topo(links, jobs=None, aggregator="agg"):
    hosts = {f"h{i}": {"ip": f"10.0.0.{i}/24", "mac": f"08:00:00:00:00:{i:02x}"} for i in range(1, 5)}
    hosts["agg"] = {"ip": "10.0.0.100/24", "mac": "08:00:00:00:00:64"}
    switches = {s: {"aggregator_ip": "10.0.0.254", "aggregator_mac": "00:00:00:00:00:fe"} for s in ("s1", "s2")}
    return {"hosts": hosts, "switches": switches, "links": links, "aggregator": aggregator,
            "jobs": jobs if jobs is not None else [{"name": "j", "workers": ["h1", "h2"]}]}


BASE_LINKS = [["h1", "s1-p1"], ["h2", "s1-p2"], ["agg", "s1-p5"], ["h3", "s2-p1"], ["h4", "s2-p2"]]


def test_shipped_topologies_parse():
    for path in (ROOT / "bmv2_env" / "emulation" / "topologies").glob("*.json"):
        t = load_topology(path)
        assert t.jobs and t.attachment(t.aggregator).node in t.switches


def test_switch_to_switch_link_parses():
    t = parse_topology(topo(BASE_LINKS + [["s1-p6", "s2-p3", {"bw": 100}]]))
    trunk = t.links[-1]
    assert (trunk.a, trunk.b, trunk.params) == (Endpoint("s1", 6), Endpoint("s2", 3), {"bw": 100})
    assert t.host_ports("s1") == {"10.0.0.1": {"port": 1, "mac": "08:00:00:00:00:01"},
                                  "10.0.0.2": {"port": 2, "mac": "08:00:00:00:00:02"},
                                  "10.0.0.100": {"port": 5, "mac": "08:00:00:00:00:64"}}
    assert set(t.host_ports("s2")) == {"10.0.0.3", "10.0.0.4"}


def test_a_job_across_unlinked_switches_is_refused_by_name():
    data = topo(BASE_LINKS, jobs=[{"name": "wide", "workers": ["h1", "h3"]}])
    with pytest.raises(TopologyError, match=r"job wide: its workers \(h1 on s1, h3 on s2\).*no switch links join"):
        parse_topology(data)


def test_a_host_runs_several_ranks_and_host_reduce_is_a_boolean():
    t = parse_topology(topo(BASE_LINKS, jobs=[{"name": "j", "workers": ["h1", "h1", "h2"], "host_reduce": True}]))
    assert t.jobs[0]["workers"] == ["h1", "h1", "h2"]
    with pytest.raises(TopologyError, match="job j: host_reduce must be true or false"):
        parse_topology(topo(BASE_LINKS, jobs=[{"name": "j", "workers": ["h1"], "host_reduce": "yes"}]))


@pytest.mark.parametrize("trunks", [[["s1-p6", "s2-p3"], ["s1-p7", "s2-p4"]], [["s1-p6", "s1-p7"]]])
def test_switch_links_must_form_a_forest(trunks):
    with pytest.raises(TopologyError, match="closes a cycle of switch links"):
        parse_topology(topo(BASE_LINKS + trunks))


def test_the_leaf_spine_job_is_a_tree_rooted_at_the_spine_beside_the_host_aggregator():
    """The controller config the launcher writes for leaf_spine.json: links on both ends, the
    job's tree over both ToRs rooted at the spine, the host aggregator a host of the spine."""
    t = load_topology(ROOT / "bmv2_env" / "emulation" / "topologies" / "leaf_spine.json")
    switches = controller_switches(t, [f"unix:/nowhere/{n}" for n in t.switches], "soft", {})
    assert [(s["name"], s["links"]) for s in switches] == [
        ("tor1", {"spine": 5}), ("tor2", {"spine": 5}), ("spine", {"tor1": 1, "tor2": 2})]
    config = parse_config({"host_aggregator": "10.0.0.100:42666", "admin_token": "x", "switches": switches})
    where = {ip: s.name for s in config.switches for ip in s.hosts}
    job = t.jobs[0]
    tree = job_tree(config, {r: where[host_ip(t.hosts[h])] for r, h in enumerate(job["workers"])})
    assert tree.root == "spine" and tree.ranks == {"tor1": (0, 1, 2, 3), "tor2": (4, 5, 6, 7), "spine": ()}
    assert host_aggregator_at(config)[0] == "spine"


@pytest.mark.parametrize("links, message", [
    ([["h1", "s9-p1"]], "'s9-p1' is neither a host nor a switch port"),
    ([["h1", "h2"]], "host-to-host link"),
    ([["h1", "s1-p1"], ["h2", "s1-p1"]], "s1-p1 is already linked"),
    ([["h1", "s1-p0"]], "port 0 of s1 not in 1..510"),
    ([["h1"]], r"expected \[a, b\]"),
])
def test_bad_links_are_named(links, message):
    with pytest.raises(TopologyError, match=message):
        parse_topology(topo(links))


def test_unlinked_host_and_unknown_worker_are_named():
    with pytest.raises(TopologyError, match="host h4 is linked to no switch"):
        parse_topology(topo(BASE_LINKS[:4]))
    with pytest.raises(TopologyError, match=r"job j: workers must be hosts, unknown \['h9'\]"):
        parse_topology(topo(BASE_LINKS, jobs=[{"name": "j", "workers": ["h1", "h9"]}]))


def test_epochs_override_keeps_the_jobs_ratio():
    t = load_topology(ROOT / "bmv2_env" / "emulation" / "topologies" / "two_jobs.json")
    assert job_epochs(t, None) == {"first": 8, "second": 24}
    assert job_epochs(t, 2) == {"first": 2, "second": 6}     # the second still outlives the first
    assert job_epochs(t, 1) == {"first": 1, "second": 3}


@pytest.mark.parametrize("epochs", ["0", "-2"])
def test_epochs_below_one_are_refused(epochs, capsys):
    with pytest.raises(SystemExit) as exit_:      # before anything is brought up
        mininet_main(["--epochs", epochs])
    assert exit_.value.code == 2 and f"--epochs must be >= 1, got {epochs}" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--p4info", "--bmv2-json"])
def test_program_files_for_the_software_data_plane_are_refused(flag, capsys):
    """It runs the committed program only: a P4Info or BMv2 JSON given for it is an error, not
    silently left unused."""
    with pytest.raises(SystemExit) as exit_:      # before anything is brought up
        mininet_main(["--dataplane", "soft", flag, "p4/out/bmv2/inagg.p4info.txtpb"])
    assert exit_.value.code == 2 and "are pushed to BMv2 switches" in capsys.readouterr().err


@pytest.mark.parametrize("workers", range(1, 9))
def test_every_rank_takes_the_same_steps(workers):
    """Rank r trains on samples r, r + workers, ...: each rank's share has at least
    steps_per_epoch batches, whatever the number of workers (5 and 6 used to differ)."""
    samples = len(load_digits_split(0)[1])
    steps = steps_per_epoch(samples, workers, 16)
    shares = [len(np.arange(r, samples, workers)) for r in range(workers)]
    assert all(share // 16 >= steps for share in shares) and min(shares) // 16 == steps


def test_interface_names_carry_the_run_id_and_fit(tmp_path):
    run = RunDir("ab12", tmp_path)
    assert run.interface_name("s1", 5) == "ab12s1-eth5"
    with pytest.raises(ValueError, match="longer than 15 characters"):
        run.interface_name("switch12", 100)


def test_stop_run_signals_only_recorded_live_processes(tmp_path):
    """A recorded process is stopped; a recorded PID now used by another process is not."""
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run = RunDir("cd34", tmp_path)
        run.path.mkdir()
        run.add_process(mine.pid, "sleeper")
        # the other process's PID, recorded with a start time it does not have (a recycled PID)
        run.record["processes"].append({"pid": other.pid, "start": process_start_time(other.pid) - 1,
                                        "what": "recycled"})
        run.save()
        done = stop_run(RunDir("cd34", tmp_path))
        assert mine.wait(10) is not None and other.poll() is None
        assert done == [f"sleeper (pid {mine.pid}) stopped"]
        assert json.loads((run.path / "run.json").read_text())["finished"]
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()


def test_stop_and_clean_act_on_the_callers_runs_unless_all(tmp_path, capsys):
    """``make stop``/``make clean`` stop (and clean deletes) only the runs the calling user
    started, as its run record says; another user's run keeps running and is named; ``--all``
    (ALL=1) acts on it too."""
    import threading

    from inagg.bmv2_env.emulation.mininet_run import stop_leftovers
    from inagg.bmv2_env.emulation.run_dir import current_user

    base, sleepers, runs = tmp_path / "runs", [], []
    for user in (current_user(), "someone-else"):
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        threading.Thread(target=proc.wait, daemon=True).start()   # reaped as soon as it ends
        run = RunDir.create(base)
        assert run.record["user"] == current_user()
        run.record["user"] = user
        run.add_process(proc.pid, f"{user}'s service")
        sleepers.append(proc)
        runs.append(run)
    mine, theirs = runs
    try:
        assert stop_leftovers(None, base=base) == 0
        assert sleepers[0].wait(10) is not None and sleepers[1].poll() is None
        out = capsys.readouterr().out
        assert f"run {theirs.run_id}: started by someone-else, left alone (ALL=1" in out, out
        assert stop_leftovers(None, clean=True, base=base) == 0
        assert not mine.path.exists() and theirs.path.exists() and sleepers[1].poll() is None
        assert stop_leftovers(None, all_users=True, clean=True, base=base) == 0
        assert sleepers[1].wait(10) is not None and not base.exists()
    finally:
        for proc in sleepers:
            proc.kill()


def test_a_new_run_deletes_finished_runs_but_the_newest(tmp_path, monkeypatch):
    """Runs piled up (each with pcaps of every port, up to 7 GB) until the disk was full; a new
    run now deletes finished runs but the newest ``INAGG_KEEP_RUNS``; unfinished ones stay."""
    from inagg.bmv2_env.emulation.run_dir import prune_finished_runs

    def run(rid: str, finished: bool, age: int) -> None:
        r = RunDir(rid, tmp_path)
        r.path.mkdir()
        r.record["finished"] = finished
        r.save()
        os.utime(r.record_path, (time.time() - age, time.time() - age))

    for i in range(5):
        run(f"f{i}aa", True, age=100 * i)      # f0aa the newest
    run("u0aa", False, age=1000)
    monkeypatch.setenv("INAGG_KEEP_RUNS", "2")
    new = RunDir.create(tmp_path)
    left = {p.name for p in tmp_path.iterdir() if p.is_dir() and not p.is_symlink()}
    assert left == {"f0aa", "f1aa", "u0aa", new.run_id}
    assert prune_finished_runs(tmp_path, keep=0) == ["f0aa", "f1aa"]
    monkeypatch.setenv("INAGG_KEEP_RUNS", "-1")
    with pytest.raises(ValueError, match="INAGG_KEEP_RUNS must be a whole number"):
        RunDir.create(tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (creates a veth pair)")
def test_netem_probe_uses_only_its_own_interfaces(tmp_path):
    """The netem probe works on a veth pair named after the run, recorded, and deleted after."""
    from inagg.bmv2_env.emulation.mininet_run import netem_available
    from inagg.bmv2_env.emulation.run_dir import root_interfaces

    run = RunDir("ef56", tmp_path)
    run.path.mkdir()
    assert netem_available(run) in (True, False)
    assert not [n for n in root_interfaces() if n.startswith("ef56")]
    assert run.record["interfaces"] == ["ef56netem", "ef56netem2"]
