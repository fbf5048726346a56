"""benchmarks/tree_bench.py, briefly (one 1 MiB size, one repetition, every link at 100 Mbit/s):
the 8-rank job on the leaf-spine tree and on one switch, placed as compared, the same bits, one
row per job with its times, and each ToR uplink carrying the tensor once each way per call: a
count of the interfaces' bytes, not a timing. The run leaves nothing behind. Needs root and
Mininet."""

import csv
import re
import subprocess
import sys

import pytest

from inagg.hostlib.wire.grant import values_for_mtu
from test_emulation import ROOT, assert_left_nothing, mininet_missing

FRAME_HEADERS = 14 + 20 + 8 + 16   # Ethernet, IPv4, UDP, inagg


def test_tree_bench_counts_each_uplink_carrying_the_tensor_once_each_way(tmp_path):
    if reason := mininet_missing():
        pytest.skip(reason)
    proc = subprocess.run([sys.executable, "benchmarks/tree_bench.py", "--sizes-mib", "1", "--reps", "1",
                           "--results", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert_left_nothing(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "load average" in proc.stdout and (tmp_path / "tree_bench.png").exists()
    rows = {row["job"]: row for row in csv.DictReader(open(tmp_path / "tree_bench.csv"))}
    assert set(rows) == {"flat", "tree"}
    flat, tree = rows["flat"], rows["tree"]
    assert tree["placement"].startswith("aggregation tree over spine, tor1") and tree["same_bits"] == "True"
    assert float(flat["median_s"]) > 0 and float(tree["ratio"]) > 0 and flat["ratio"] == flat["uplink_up_x"] == ""
    k = int(tree["k"])
    assert k == values_for_mtu(1500)
    each = re.findall(r"(\w+) ([\d.]+)/([\d.]+)", tree["uplinks"])    # every ToR's, up and down
    assert [tor for tor, _, _ in each] == ["tor1", "tor2"], tree
    # once each way, plus barrier segments, plus at most one frame of K per retransmission (the
    # ranks' summed: a resent contribution may go up again, its answer come down again)
    frames = -(-int(tree["bytes"]) // (4 * k))
    most = 1.05 + int(tree["retransmissions"]) / frames
    assert all(1.0 <= float(x) < most for _, up, down in each for x in (up, down)), tree
    for direction in ("up", "down"):     # the larger ToR's, as values and in frames of K
        assert 1.0 <= float(tree[f"uplink_{direction}_x"]) < most, tree
        assert 1.0 <= float(tree[f"uplink_{direction}_wire_x"]) / ((FRAME_HEADERS + 4 * k) / (4 * k)) < most, tree
