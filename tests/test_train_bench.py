"""benchmarks/train_bench.py, briefly (2 workers, turns of 3 steps, the links on a two-phase
bandwidth schedule, 100 Mbit/s then 20 from 0.3 s after time zero, a target of 0 so that
``--until-target`` ends the run after the first turn of each): every configuration trains
from the same seed on the same batches, a row each with its step time (phase ``all``), the
inagg replica on the switch; gloo's and inagg's replicas end at the same accuracy (one rounding
of the sums apart); the job's start (to its paths calibrated) is in every row. Each phase has a row per configuration with the rate tc showed on every
link end once the schedule had re-rated them, and no step counted in two phases. The run leaves
nothing behind. Needs root and Mininet."""

import csv
import subprocess
import sys

import pytest

from test_emulation import ROOT, assert_left_nothing, mininet_missing

CONFIGS = ["gloo", "inagg", "inagg+artopk", "powersgd"]
COLUMNS = ["model", "rate", "workers", "config", "phase", "phase_start_s", "mbit_applied", "applied_at_s",
           "parameters", "steps", "step_s", "ratio", "target", "steps_to_target", "seconds_to_target",
           "final_accuracy", "start_s", "load1_start", "load1_end"]


def test_train_bench_trains_every_configuration_alike_through_a_rate_change(tmp_path):
    if reason := mininet_missing():
        pytest.skip(reason)
    proc = subprocess.run([sys.executable, "benchmarks/train_bench.py", "--workers", "2", "--steps", "9",
                           "--turn", "3", "--target", "0", "--until-target", "--bw-schedule", "0:100,0.3:20",
                           "--results", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert_left_nothing(proc.stdout, interfaces=3, processes=4)   # 2 workers, the aggregator's host
    assert proc.returncode == 0, proc.stdout + proc.stderr
    table = list(csv.DictReader(open(tmp_path / "train_bench.csv")))
    assert list(table[0]) == COLUMNS and (tmp_path / "train_bench.png").exists()
    rows = {row["config"]: row for row in table if row["phase"] == "all"}
    assert list(rows) == CONFIGS and rows["gloo"]["rate"] == "schedule 0:100,0.3:20"
    assert all(int(r["steps"]) == 3 and float(r["step_s"]) > 0 for r in rows.values())   # one turn of 3
    assert all(r["steps_to_target"] == "3" and float(r["seconds_to_target"]) > 0 for r in rows.values())
    assert rows["gloo"]["ratio"] == "1.0"
    assert len({r["start_s"] for r in table}) == 1 and float(table[0]["start_s"]) > 0   # the job's, once
    assert abs(float(rows["inagg"]["final_accuracy"]) - float(rows["gloo"]["final_accuracy"])) <= 0.02
    phases = [(r["config"], r["phase"], r["rate"], r["mbit_applied"]) for r in table if r["phase"] != "all"]
    assert phases == [(c, p, rate, applied) for p, rate, applied in (("0", "100mbit", "100"), ("1", "20mbit", "20"))
                      for c in CONFIGS]
    at = {r["phase"]: float(r["applied_at_s"]) for r in table if r["phase"] != "all"}
    assert at["0"] <= 0 and at["1"] >= 0.3   # at bring-up, before time zero; after its time in the schedule
    for config in CONFIGS:
        assert sum(int(r["steps"]) for r in table if r["config"] == config and r["phase"] != "all") <= 3
