"""K from the link: in the emulation the software data plane carries as many values per packet
as the links' MTU allows (inagg.hostlib.wire.grant.values_for_mtu), and jumbo-frame topologies work.

Each case runs benchmarks/wire_bench.py briefly (two ranks, one 256 KiB tensor, one repetition,
links at 100 Mbit/s): the ranks read K from their switch grant, check every sum, and the run
leaves nothing behind. Needs root and Mininet; the topology checks need neither."""

import csv
import subprocess
import sys
from pathlib import Path

import pytest

from inagg.bmv2_env.emulation.mininet_run import soft_values_per_packet
from inagg.bmv2_env.emulation.run_dir import RunDir, root_interfaces
from inagg.bmv2_env.emulation.topology import TopologyError, parse_topology
from inagg.hostlib.wire.grant import values_for_mtu
from test_emulation import RUN_LINE, mininet_missing

ROOT = Path(__file__).resolve().parents[1]


def test_soft_k_follows_the_mtu_and_the_transports():
    assert soft_values_per_packet(1500, {"udp"}) == values_for_mtu(1500) == 364
    assert soft_values_per_packet(9000, {"udp"}) == values_for_mtu(9000) == 2239
    assert soft_values_per_packet(1500, {"udp", "roce"}) == 355      # RoCE's headers: 9 values fewer


def test_topology_mtu_is_checked():
    topo = {"hosts": {"h1": {"ip": "10.0.0.1/24", "mac": "08:00:00:00:00:01"}},
            "switches": {"s1": {"aggregator_ip": "10.0.0.254", "aggregator_mac": "00:00:00:00:00:fe"}},
            "links": [["h1", "s1-p1"]], "aggregator": "h1", "jobs": [{"name": "j", "workers": ["h1"]}]}
    assert parse_topology(topo).mtu == 1500
    assert parse_topology({**topo, "mtu": 9000}).mtu == 9000
    with pytest.raises(TopologyError, match="mtu must be an integer in 576..65535"):
        parse_topology({**topo, "mtu": 100})


@pytest.mark.parametrize("mtu", [1500, 9000])
def test_switch_grant_carries_the_links_k(tmp_path, mtu):
    reason = mininet_missing()
    if reason:
        pytest.skip(reason)
    proc = subprocess.run([sys.executable, "benchmarks/wire_bench.py", "--workers", "2", "--sizes-mib", "0.25",
                           "--reps", "1", "--warmup", "2", "--two-jobs", "0", "--mtu", str(mtu), "--results", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    run = RunDir(RUN_LINE.search(proc.stdout).group(1))
    assert run.record["finished"] and run.live_processes() == [], proc.stdout
    assert [n for n in root_interfaces() if n.startswith(run.run_id)] == []
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [row] = list(csv.DictReader(open(tmp_path / "wire_bench.csv")))
    assert (row["mode"], int(row["k"]), int(row["mtu"])) == ("switch", values_for_mtu(mtu), mtu)
    assert row["auto_paths"] and float(row["auto_vs_best"]) > 0   # the auto group's calls, timed and checked
