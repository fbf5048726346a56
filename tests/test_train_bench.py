"""benchmarks/train_bench.py, briefly (2 workers, one turn of 3 steps, links at 100 Mbit/s): every
configuration trains from the same seed on the same batches, a row each with its step time, the
inagg replica on the switch; gloo's and inagg's replicas end at the same accuracy (one
rounding of the sums apart). The run leaves nothing behind. Needs root and Mininet."""

import csv
import subprocess
import sys

import pytest

from test_emulation import ROOT, assert_left_nothing, mininet_missing


def test_train_bench_trains_every_configuration_alike(tmp_path):
    if reason := mininet_missing():
        pytest.skip(reason)
    proc = subprocess.run([sys.executable, "benchmarks/train_bench.py", "--workers", "2", "--turns", "1",
                           "--turn", "3", "--results", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert_left_nothing(proc.stdout, interfaces=3, processes=4)   # 2 workers, the aggregator's host
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {row["config"]: row for row in csv.DictReader(open(tmp_path / "train_bench.csv"))}
    assert list(rows) == ["gloo", "inagg", "inagg+artopk", "powersgd"]
    assert all(int(r["steps"]) == 3 and float(r["step_s"]) > 0 for r in rows.values())
    assert rows["gloo"]["ratio"] == "1.0" and (tmp_path / "train_bench.png").exists()
    assert abs(float(rows["inagg"]["final_accuracy"]) - float(rows["gloo"]["final_accuracy"])) <= 0.02
