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


def test_a_rank_killed_mid_run_leaves_the_rows_measured_and_the_reason(tmp_path):
    """A rank of the tree job killed (SIGKILL, by the PID the run recorded) once the first
    timed turn is done (as a rank the controller's lease drops at load 30 dies): the bench still writes the rows it measured (both jobs at 1 MiB, rank
    0's clock), one more row marking the failed turn with its reason, and exits 1, leaving
    nothing behind."""

    from test_emulation import Output, kill_when

    if reason := mininet_missing():
        pytest.skip(reason)
    proc = subprocess.Popen([sys.executable, "benchmarks/tree_bench.py", "--sizes-mib", "1", "--reps", "4",
                             "--results", str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    output = Output(proc)
    try:
        kill_when(output, "turn 1/4 done", 500, "tree-h2")
        proc.wait(120)
        out = output.rest(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, out
    # the turn under way when it died: 2, or 3 when tree's turn 2 was quicker than the kill
    assert "tree_bench FAILED, partial results in" in out and re.search(r"job tree, turn [23] \(1 MiB\): a rank exited",
                                                                       out), out
    rows = list(csv.DictReader(open(tmp_path / "tree_bench.csv")))
    measured = [r for r in rows if not r["failed"]]
    assert {r["job"] for r in measured} == {"flat", "tree"} and all(r["clock"] == "rank 0" for r in measured), rows
    assert all(float(r["median_s"]) > 0 and r["reps"] in ("1", "2") for r in measured), rows
    [failed] = [r for r in rows if r["failed"]]
    assert failed["job"] == "tree" and failed["bytes"] == str(1 << 20) and failed["median_s"] == "", failed
    assert_left_nothing(out)
