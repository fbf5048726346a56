"""Forged results from another host are never accepted (issue 37): on the emulation, h3 sends a
job's two ranks results forged from the switch's aggregator address, and as many from its own,
with the job's id, epoch, slots and round tags, while they allreduce 150 int32 tensors through
the software switch (tests/forged_results_run.py). Every element of every sum is right; the
switch's SourceGuard dropped exactly the frames forged from its aggregator address. Those from
h3's own address are plain UDP between two hosts to the switch (not to its inagg port, so not
parsed as inagg): they reach the workers, whose source check refuses them. Needs root and
Mininet."""

import json
import subprocess
import sys

import pytest

from test_emulation import ROOT, assert_left_nothing, mininet_missing


def test_forged_results_from_another_host_are_dropped_at_the_switch_and_never_accepted():
    if reason := mininet_missing():
        pytest.skip(reason)
    proc = subprocess.run([sys.executable, "tests/forged_results_run.py", "--calls", "150"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert_left_nothing(proc.stdout, interfaces=4, processes=4)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["mode"] == "switch" and (result["calls"], result["wrong"]) == (150, 0), result
    assert min(result["forged"].values()) >= 256, result          # both kinds, while the calls ran
    assert result["guard_drops"] == {"aggregator_addr": result["forged"]["aggregator_addr"], "result": 0}, result
