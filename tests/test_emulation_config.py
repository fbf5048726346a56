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
from inagg.bmv2_env.demos.train_demo import steps_per_epoch
from inagg.bmv2_env.demos.workloads import load_data

ROOT = Path(__file__).resolve().parents[1]


def topo(links, jobs=None, aggregator="agg"):
    hosts = {f"h{i}": {"ip": f"10.0.0.{i}/24", "mac": f"08:00:00:00:00:{i:02x}"} for i in range(1, 5)}
    hosts["agg"] = {"ip": "10.0.0.100/24", "mac": "08:00:00:00:00:64"}
    switches = {f"s{i}": {"aggregator_ip": f"10.0.0.{255 - i}", "aggregator_mac": f"00:00:00:00:0{i}:fe"}
                for i in (1, 2)}
    return {"hosts": hosts, "switches": switches, "links": links, "aggregator": aggregator,
            "jobs": jobs if jobs is not None else [{"name": "j", "workers": ["h1", "h2"]}]}


BASE_LINKS = [["h1", "s1-p1"], ["h2", "s1-p2"], ["agg", "s1-p5"], ["h3", "s2-p1"], ["h4", "s2-p2"]]


def test_shipped_topologies_parse():
    paths = sorted((ROOT / "bmv2_env" / "emulation" / "topologies").glob("*.json"))
    assert len(paths) >= 5     # the folder moved once and this test passed on none
    for path in paths:
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
    with pytest.raises(TopologyError, match=r"job j\): host_reduce must be true or false"):
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
    with pytest.raises(TopologyError, match=r"job j\): workers must be hosts, unknown \['h9'\]"):
        parse_topology(topo(BASE_LINKS, jobs=[{"name": "j", "workers": ["h1", "h9"]}]))


def _set(path: str, value):
    """A change to the test topology: set the value at ``path`` ("jobs.0.epochs"); DELETE removes it."""
    def change(data: dict) -> None:
        *parents, last = path.split(".")
        for part in parents:
            data = data[int(part)] if isinstance(data, list) else data[part]
        if value is DELETE:
            del data[last]
        elif isinstance(data, list):
            data[int(last)] = value
        else:
            data[last] = value
    return change


def _rename(path: str, old: str, new: str):
    """A change that renames key ``old`` to ``new`` in the object at ``path``."""
    def change(data: dict) -> None:
        for part in path.split(".") if path else []:
            data = data[int(part)] if isinstance(data, list) else data[part]
        data[new] = data.pop(old)
    return change


DELETE = object()
# (change to a valid topology, what the error must say: the entry, the problem, what to write)
BAD_TOPOLOGIES = {
    "worker for workers": (_rename("jobs.0", "workers", "worker"),
                           r"jobs\[0\] \(job j\): unknown key 'worker' \(did you mean 'workers'\?\)"),
    "epoch for epochs": (_rename("jobs.0", "epochs", "epoch"),
                         r"jobs\[0\] \(job j\): unknown key 'epoch' \(did you mean 'epochs'\?\)"),
    "link for links": (_rename("", "links", "link"), r"unknown key 'link' \(did you mean 'links'\?\)"),
    "host key": (_rename("hosts.h2", "mac", "Mac"), r"host h2: unknown key 'Mac' \(did you mean 'mac'\?\)"),
    "switch key": (_rename("switches.s1", "aggregator_ip", "aggregator-ip"),
                   r"switch s1: unknown key 'aggregator-ip' \(did you mean 'aggregator_ip'\?\)"),
    "link option": (_set("links.0", ["h1", "s1-p1", {"los": 1}]), r"links\[0\]: unknown key 'los' \(did you mean 'loss'\?\)"),
    "controller key": (_set("controller", {"min_windows": 8}), r"controller: unknown key 'min_windows' \(did you mean 'min_window'\?\)"),
    "controller key the launcher sets": (_set("controller", {"listen": "127.0.0.1:1"}),
                                         r"controller: 'listen' is set by the launcher for every run; remove it"),
    "missing workers": (_set("jobs.0.workers", DELETE), r"jobs\[0\] \(job j\): missing 'workers'"),
    "no jobs": (_set("jobs", []), "jobs must be a non-empty list"),
    "MAC syntax": (_set("hosts.h2.mac", "08:00:00:00:02"), r"host h2: mac: '08:00:00:00:02' is not a MAC address; "
                   "write six hex pairs joined by ':'"),
    "multicast MAC": (_set("hosts.h2.mac", "01:00:5e:00:00:02"), "host h2: mac: 01:00:5e:00:00:02 is a multicast or zero"),
    "switch MAC syntax": (_set("switches.s1.aggregator_mac", "fe"), "switch s1: aggregator_mac: 'fe' is not a MAC"),
    "IP syntax": (_set("hosts.h2.ip", "10.0.0.300/24"), r"host h2: ip: '10.0.0.300/24' is not an IPv4 address with "
                  r"its prefix length; write it like '10.0.0.1/24'"),
    "IP without prefix": (_set("hosts.h2.ip", "10.0.0.2"), "host h2: ip: '10.0.0.2' is not an IPv4 address with its prefix"),
    "broadcast IP": (_set("hosts.h2.ip", "10.0.0.255/24"), "host h2: ip: 10.0.0.255/24 is the broadcast address"),
    "switch IP syntax": (_set("switches.s1.aggregator_ip", "10.0.0.254/24"),
                         r"switch s1: aggregator_ip: '10.0.0.254/24' is not an IPv4 address; write it without a prefix"),
    "duplicate MAC": (_set("hosts.h2.mac", "08:00:00:00:00:01"),
                      r"host h2: MAC 08:00:00:00:00:01 is already host h1's; .*a free one: 08:00:00:00:00:02\)"),
    "duplicate IP": (_set("hosts.h2.ip", "10.0.0.1/24"), r"host h2: IP 10.0.0.1 is already host h1's; .*an IP of its own \(a free one: 10.0.0.2\)"),
    "aggregator IP equal to a host's": (_set("switches.s1.aggregator_ip", "10.0.0.3"),
                                        r"switch s1 \(aggregator_ip\): IP 10.0.0.3 is already host h3's"),
    "aggregator MAC equal to a host's": (_set("switches.s2.aggregator_mac", "08:00:00:00:00:64"),
                                         r"switch s2 \(aggregator_mac\): MAC 08:00:00:00:00:64 is already host agg's"),
    "host on another subnet": (_set("hosts.h4.ip", "10.0.1.4/24"),
                               r"host h4: 10.0.1.4/24 is not on 10.0.0.0/24, .* no router.* write e.g. '10.0.0.4/24'"),
    "aggregator off the subnet": (_set("switches.s2.aggregator_ip", "10.0.1.254"),
                                  r"switch s2: aggregator_ip 10.0.1.254 is not a host address of the hosts' subnet"),
    "min_window 0": (_set("controller", {"min_window": 0}), "controller: min_window 0 must be a whole number >= 1"),
    "sharing unknown": (_set("controller", {"sharing": "fair"}),
                        "controller: sharing 'fair': write one of dynamic, static"),
    "min_window a string": (_set("controller", {"min_window": "8"}), "controller: min_window '8' must be a whole number"),
    "host_window over host_slots": (_set("controller", {"host_slots": 16, "host_window": 32}),
                                    "host_window 32 is larger than host_slots 16"),
    "lease 0": (_set("controller", {"rank_lease_seconds": 0}), "rank_lease_seconds 0 must be a number of seconds > 0"),
    "transport tcp": (_set("jobs.0.transport", "tcp"), r"job j\): transport 'tcp': the emulation's jobs take 'udp' or 'roce'"),
    "unknown hook": (_set("jobs.0.hook", "powersgd"), r"job j\): hook 'powersgd': .* 'inagg' or 'artopk'"),
    "host_reduce with artopk": (_set("jobs.0", {"name": "j", "workers": ["h1"], "host_reduce": True, "hook": "artopk"}),
                                "host_reduce true with hook 'artopk'.*drop host_reduce or use hook 'inagg'"),
    "epochs 0": (_set("jobs.0.epochs", 0), r"job j\): epochs 0 must be a whole number >= 1"),
    "negative start_delay": (_set("jobs.0.start_delay", -1), r"job j\): start_delay -1 must be a number of seconds >= 0"),
    "job name with a slash": (_set("jobs.0.name", "a/b"), r"name 'a/b': use letters, digits"),
    "two jobs of one name": (_set("jobs", [{"name": "j", "workers": ["h1"]}, {"name": "j", "workers": ["h2"]}]),
                             r"jobs\[1\] \(job j\): another job is named 'j'"),
    "aggregator not a host": (_set("aggregator", "ag"), r"aggregator 'ag' is not a host \(did you mean 'agg'\?\)"),
    "bw out of range": (_set("links.0", ["h1", "s1-p1", {"bw": 5000}]), r"links\[0\]: bw 5000 must be Mbit/s in \(0, 1000\]"),
    "delay without unit": (_set("links.0", ["h1", "s1-p1", {"delay": "5"}]), r"links\[0\]: delay '5' must be a time as tc"),
    "loss over 100": (_set("links.0", ["h1", "s1-p1", {"loss": 150}]), r"loss 150 must be a percentage in 0..100"),
    "duplicate negative": (_set("links.0", ["h1", "s1-p1", {"duplicate": -1}]), r"duplicate -1 must be a percentage"),
    "jitter without delay": (_set("links.0", ["h1", "s1-p1", {"jitter": "1ms"}]),
                             r"links\[0\]: jitter without a delay: netem's jitter varies the delay; add a \"delay\""),
    "reorder without delay": (_set("links.0", ["h1", "s1-p1", {"reorder": 10}]), r"reorder without a delay"),
    "bw and bw_schedule": (_set("links.0", ["h1", "s1-p1", {"bw": 10, "bw_schedule": [[0, 10]]}]),
                           r"bw and bw_schedule both given.*remove bw"),
    "bw_schedule not pairs": (_set("links.0", ["h1", "s1-p1", {"bw_schedule": [[0, 10, 3]]}]),
                              r"bw_schedule \[\[0, 10, 3\]\] must be a list of \[seconds, Mbit/s\] pairs"),
    "bw_schedule rate 0": (_set("links.0", ["h1", "s1-p1", {"bw_schedule": [[0, 0]]}]), r"rates in \(0, 1000\]"),
    "bw_schedule late start": (_set("links.0", ["h1", "s1-p1", {"bw_schedule": [[1, 10]]}]),
                               r"bw_schedule times \[1\] must start at 0 and increase"),
    "bw_schedule backwards": (_set("links.0", ["h1", "s1-p1", {"bw_schedule": [[0, 10], [5, 2], [5, 3]]}]),
                              r"times \[0, 5, 5\] must start at 0 and increase"),
    "reordr for reorder": (_set("links.0", ["h1", "s1-p1", {"delay": "1ms", "reordr": 5}]),
                           r"unknown key 'reordr' \(did you mean 'reorder'\?\)"),
    # workloads (demos/workloads.py)
    "unknown model": (_set("jobs.0.model", "resnet"), r"job j\): unknown model 'resnet'; the zoo has mlp, cnn, transformer"),
    "model misspelt": (_set("jobs.0.model", "transfomer"), r"unknown model 'transfomer' \(did you mean 'transformer'\?\)"),
    "modle for model": (_set("jobs.0.modle", "cnn"), r"unknown key 'modle' \(did you mean 'model'\?\)"),
    "negative start": (_set("jobs.0.start", -3), r"job j\): start -3 must be a number of seconds >= 0"),
    "start and start_delay": (_set("jobs.0", {"name": "j", "workers": ["h1"], "start": 1, "start_delay": 1}),
                              r"start and start_delay both given.*keep one"),
    "iterations and epochs": (_set("jobs.0.iterations", 10), r"job j\): epochs and iterations both given"),
    "iterations and duration": (_set("jobs.0", {"name": "j", "workers": ["h1"], "iterations": 5, "duration": 3}),
                                r"iterations and duration both given: a job runs for epochs, iterations or a duration"),
    "iterations 0": (_set("jobs.0", {"name": "j", "workers": ["h1"], "iterations": 0}),
                     r"iterations 0 must be a whole number of steps >= 1"),
    "duration 0": (_set("jobs.0", {"name": "j", "workers": ["h1"], "duration": 0}), r"duration 0 must be a number of seconds > 0"),
    "model and profile": (_set("jobs.0", {"name": "j", "workers": ["h1"], "model": "cnn", "iterations": 3,
                                          "profile": {"bucket_bytes": [4096]}}), r"both a model and a profile"),
    "profile key": (_set("jobs.0", {"name": "j", "workers": ["h1"], "iterations": 3, "profile": {"buckets": [4096]}}),
                    r"profile: unknown key 'buckets' \(did you mean 'bucket_bytes'\?\)"),
    "profile bucket not float32": (_set("jobs.0", {"name": "j", "workers": ["h1"], "iterations": 3,
                                                   "profile": {"bucket_bytes": [4095]}}),
                                   r"bucket_bytes \[4095\] must be a non-empty list of byte counts, each a multiple of 4"),
    "profile negative compute": (_set("jobs.0", {"name": "j", "workers": ["h1"], "iterations": 3,
                                                 "profile": {"bucket_bytes": [64], "compute_ms": -1}}),
                                 r"compute_ms -1 must be milliseconds >= 0"),
    "profile with epochs": (_set("jobs.0.profile", {"bucket_bytes": [64]}), r"a profile needs \"iterations\" or \"duration\""),
    "profile collective": (_set("jobs.0", {"name": "j", "workers": ["h1"], "iterations": 3,
                                           "profile": {"bucket_bytes": [64], "collective": "all_gather"}}),
                           r"collective 'all_gather' must be one of allreduce, reduce_scatter"),
    "reduce_scatter shards": (_set("jobs.0", {"name": "j", "workers": ["h1", "h2", "h3"], "iterations": 3,
                                              "profile": {"bucket_bytes": [64], "collective": "reduce_scatter"}}),
                              r"each of its 3 workers an equal shard: every bucket_bytes must be a multiple of 12"),
    "profile with a hook": (_set("jobs.0", {"name": "j", "workers": ["h1"], "iterations": 3, "hook": "inagg",
                                            "profile": {"bucket_bytes": [64]}}), r"hook with a profile"),
}


@pytest.mark.parametrize("case", list(BAD_TOPOLOGIES))
def test_a_bad_topology_is_refused_naming_file_entry_and_fix(tmp_path, case):
    """Each mistake in a topology file is refused by the loader the launcher uses, before any
    network is built, with the file, the entry and what to write instead."""
    change, message = BAD_TOPOLOGIES[case]
    data = json.loads(json.dumps(topo(BASE_LINKS, jobs=[{"name": "j", "workers": ["h1", "h2"], "epochs": 2}])))
    data["controller"] = {"min_window": 8}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    load_topology(path)                         # valid before the change
    change(data)
    path.write_text(json.dumps(data))
    with pytest.raises(TopologyError, match=f"^{path}: .*{message}"):
        load_topology(path)


def test_a_long_switch_name_and_port_are_refused_before_its_interface_is_made():
    """A switch port's interface is <run id><switch>-eth<port>, at most 15 characters: switch
    name and port number take 7 at most (the launcher failed on it after the netem probe)."""
    data = topo([["h1", "spine1-p12"], ["h2", "spine1-p2"], ["agg", "spine1-p5"]],
                jobs=[{"name": "j", "workers": ["h1", "h2"]}])
    data["hosts"] = {h: data["hosts"][h] for h in ("h1", "h2", "agg")}
    data["switches"] = {"spine1": data["switches"]["s1"]}
    with pytest.raises(TopologyError, match=r"^t.json: links\[0\]: switch 'spine1' with port 12 names an interface "
                                            r"over Linux's 15 characters; keep .* within 7 characters"):
        parse_topology(data, "t.json")
    data["links"][0][1] = "spine1-p1"
    assert parse_topology(data).attachment("h1").port == 1


def test_a_key_twice_in_one_object_is_refused(tmp_path):
    """JSON keeps the last of a repeated key: a second host h1 would replace the first silently."""
    path = tmp_path / "twice.json"
    text = json.dumps(topo(BASE_LINKS))
    path.write_text(text.replace('"h2": {', '"h1": {"ip": "10.0.0.9/24", "mac": "08:00:00:00:00:09"}, "h2": {', 1))
    with pytest.raises(TopologyError, match=f"cannot read topology {path}: key 'h1' appears twice in one object"):
        load_topology(path)


def test_the_launcher_refuses_a_bad_topology_before_building_anything(tmp_path, capsys):
    """``make run``'s entry point with a bad file: exit 2 and the loader's message, no run
    directory made and nothing started, with or without root."""
    data = topo(BASE_LINKS)
    data["jobs"][0]["worker"] = data["jobs"][0].pop("workers")
    path = tmp_path / "typo.json"
    path.write_text(json.dumps(data))
    assert mininet_main(["--topo", str(path), "--dataplane", "soft"]) == 2
    out, err = capsys.readouterr()
    assert f"inagg-mininet: {path}: jobs[0] (job j): unknown key 'worker' (did you mean 'workers'?)" in err
    assert "run " not in out     # no run directory was created


def test_workload_topology_jobs_and_their_lengths():
    """The multi-tenant example: four jobs of the zoo and a profile, arriving at their times;
    only jobs that run for epochs are scaled by --epochs."""
    t = load_topology(ROOT / "bmv2_env" / "emulation" / "topologies" / "multi_tenant.json")
    assert [j.get("model", "profile" if "profile" in j else "mlp") for j in t.jobs] == \
        ["mlp", "cnn", "transformer", "profile"]
    assert sorted(j.get("start", 0) for j in t.jobs) == sorted({j.get("start", 0) for j in t.jobs})
    assert job_epochs(t, None) == {}


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
    samples = len(load_data("mlp", 0)[1])
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


def test_a_new_run_deletes_finished_runs_but_the_newest(tmp_path, monkeypatch, capsys):
    """Runs piled up (each with pcaps of every port, up to 7 GB) until the disk was full; a new
    run now deletes the caller's finished runs but the newest ``INAGG_KEEP_RUNS`` (``make run
    KEEP_RUNS=``, ``--keep-runs``), says which, and leaves unfinished runs and other users'
    runs alone."""
    from inagg.bmv2_env.emulation.mininet_run import parse_args, pruned_line
    from inagg.bmv2_env.emulation.run_dir import current_user, prune_finished_runs

    def run(rid: str, finished: bool, age: int, user: str = current_user()) -> None:
        r = RunDir(rid, tmp_path)
        r.path.mkdir()
        r.record.update(finished=finished, user=user)
        r.save()
        os.utime(r.record_path, (time.time() - age, time.time() - age))

    for i in range(5):
        run(f"f{i}aa", True, age=100 * i)      # f0aa the newest
    run("u0aa", False, age=1000)
    run("o0aa", True, age=2000, user="someone-else")
    monkeypatch.setenv("INAGG_KEEP_RUNS", "2")
    new = RunDir.create(tmp_path)
    left = {p.name for p in tmp_path.iterdir() if p.is_dir() and not p.is_symlink()}
    assert left == {"f0aa", "f1aa", "u0aa", "o0aa", new.run_id}
    assert new.pruned == ["f2aa", "f3aa", "f4aa"]
    assert pruned_line(new.pruned, 2) == (
        f"pruned 3 finished run(s) of {current_user()} beyond the newest 2: f2aa, f3aa, f4aa "
        "(keep more: make run KEEP_RUNS=n, --keep-runs n or INAGG_KEEP_RUNS=n)")
    assert RunDir.create(tmp_path, keep=5).pruned == []          # --keep-runs over the variable
    assert prune_finished_runs(tmp_path, keep=0) == ["f0aa", "f1aa"]
    monkeypatch.setenv("INAGG_KEEP_RUNS", "-1")
    with pytest.raises(ValueError, match="INAGG_KEEP_RUNS must be a whole number"):
        RunDir.create(tmp_path)
    with pytest.raises(SystemExit):                               # before anything is brought up
        parse_args(["--dataplane", "soft"])
    assert "INAGG_KEEP_RUNS must be a whole number >= 0, got '-1'" in capsys.readouterr().err
    monkeypatch.delenv("INAGG_KEEP_RUNS")
    with pytest.raises(SystemExit):
        parse_args(["--dataplane", "soft", "--keep-runs", "-1"])
    assert "--keep-runs must be >= 0" in capsys.readouterr().err


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


def test_a_failed_rank_or_exited_service_is_named_with_its_log(tmp_path):
    """The launcher's watch (watch.check_processes, called every 0.2 s while jobs run) on real
    processes: a rank that exits 0 has finished and is not a failure; a rank killed or exiting
    non-zero, or a service exiting at all, is named with how it ended and its log's last lines."""
    from inagg.bmv2_env.emulation.watch import RunFailed, Watched, check_processes

    def process(code: str, log_lines: int) -> tuple[subprocess.Popen, Path]:
        log = tmp_path / f"p{time.monotonic_ns()}.log"
        with open(log, "w") as f:
            script = f"import sys, time\nfor i in range({log_lines}): print('line', i)\n{code}"
            return subprocess.Popen([sys.executable, "-c", script], stdout=f, stderr=subprocess.STDOUT), log

    done, done_log = process("sys.exit(0)", 1)
    sleeper, sleeper_log = process("time.sleep(60)", 0)
    failing, failing_log = process("sys.exit(3)", 40)
    try:
        for p in (done, failing):
            p.wait(30)
        check_processes([Watched("job j rank 0 on h1", done, done_log),
                         Watched("the controller", sleeper, sleeper_log, service=True)])
        with pytest.raises(RunFailed) as failed:
            check_processes([Watched("job j rank 0 on h1", done, done_log),
                             Watched("job j rank 1 on h2", failing, failing_log)])
        text = str(failed.value)
        assert text.startswith(f"job j rank 1 on h2 exited with code 3; last lines of {failing_log}:\n    line 25\n")
        assert text.endswith("    line 39") and "line 24" not in text and "rank 0" not in text
        sleeper.kill()
        sleeper.wait(10)
        with pytest.raises(RunFailed, match=r"^the controller was killed by SIGKILL; .*\n    \(its log is empty\)$"):
            check_processes([Watched("the controller", sleeper, sleeper_log, service=True)])
    finally:
        for p in (done, sleeper, failing):
            if p.poll() is None:
                p.kill()


def test_link_impairments_become_the_soft_switch_ports():
    """Without netem a host link's loss, delay, jitter, duplicate and reorder are applied at its
    switch port both ways, a switch link's at each end's egress; the flags carry the seed; BMv2
    is refused naming the alternative (with netem too once a link asks duplicate or reorder,
    which Mininet does not pass to netem), and max_queue_size, which nothing applies without
    netem, is listed as not applied; TCLink gets only what it applies."""
    from inagg.bmv2_env.emulation.impairments import impairment_flags, plan, switch_impairments, tclink_options

    t = parse_topology(topo([["h1", "s1-p1", {"loss": 1.5, "max_queue_size": 10}], ["h2", "s1-p2"], ["agg", "s1-p5"],
                             ["h3", "s2-p1", {"delay": "500us", "jitter": "1ms", "duplicate": 5, "reorder": 25}],
                             ["h4", "s2-p2"], ["s1-p6", "s2-p3", {"loss": 2, "delay": "0.01s"}]]))
    h3 = {"delay": 0.5, "jitter": 1, "duplicate": 5, "reorder": 25}
    assert switch_impairments(t) == {"s1": [(1, "in", {"loss": 1.5}), (1, "out", {"loss": 1.5}),
                                            (6, "out", {"loss": 2, "delay": 10})],
                                     "s2": [(1, "in", h3), (1, "out", h3), (3, "out", {"loss": 2, "delay": 10})]}
    assert impairment_flags(switch_impairments(t)["s2"], 3) == [
        "--loss", "3:out:2", "--delay", "1:in:0.5", "--delay", "1:out:0.5", "--delay", "3:out:10",
        "--jitter", "1:in:1", "--jitter", "1:out:1", "--duplicate", "1:in:5", "--duplicate", "1:out:5",
        "--reorder", "1:in:25", "--reorder", "1:out:25", "--loss-seed", "3"]
    assert impairment_flags([], 3) == []
    soft = plan(t, "soft", netem=False)
    assert (soft.by, soft.applied, soft.not_applied) == (
        "soft switch ports", ("delay", "jitter", "loss", "duplicate", "reorder"), ("max_queue_size",))
    assert plan(t, "soft", netem=True).by == "soft switch ports"
    with pytest.raises(TopologyError, match="Mininet's TCLink passes netem no duplicate or reorder .*DATAPLANE=soft"):
        plan(t, "bmv2", netem=True)
    with pytest.raises(TopologyError, match="link delay and jitter and loss and duplicate and reorder: this kernel "
                                            "has no netem .*make run DATAPLANE=soft"):
        plan(t, "bmv2", netem=False)
    netem_only = parse_topology(topo([["h1", "s1-p1", {"loss": 1, "delay": "5ms", "bw": 10}], *BASE_LINKS[1:]]))
    assert plan(netem_only, "bmv2", netem=True).by == "netem"
    assert tclink_options(t.links[3].params, "soft switch ports") == {}
    assert tclink_options(netem_only.links[0].params, "netem") == {"loss": 1, "delay": "5ms", "bw": 10}
    assert tclink_options({"bw_schedule": [[0, 50], [3, 5]], "loss": 1}, "none") == {"bw": 50, "use_tbf": True}
    assert plan(parse_topology(topo(BASE_LINKS)), "bmv2", netem=False).by == "none"
