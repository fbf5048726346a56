"""benchmarks/tree_bench.py cut short (needs root and Mininet): a rank of the tree job killed
mid-run. A file apart from tests/test_tree_bench.py so pytest-xdist's ``--dist loadfile`` can run
the two benches on different workers."""

import csv
import re
import subprocess
import sys

import pytest

from test_emulation import ROOT, Output, assert_left_nothing, kill_when, mininet_missing


def test_a_rank_killed_mid_run_leaves_the_rows_measured_and_the_reason(tmp_path):
    """A rank of the tree job killed (SIGKILL, by the PID the run recorded) once the first
    timed turn is done (as a rank the controller's lease drops at load 30 dies): the bench still writes the rows it measured (both jobs at 1 MiB, rank
    0's clock), one more row marking the failed turn with its reason, and exits 1, leaving
    nothing behind."""

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
