"""A leaf-spine emulation (needs root and Debian's mininet): the 8-rank job of
inagg/emulation/topologies/leaf_spine.json aggregates on its tree (two ToRs of four workers under
the spine) and trains to exactly the same losses as the same job on one switch; each level's
counters say so: every ToR aggregates 4 contributions a round and sends one up, the spine 2.
On the software data plane, and on BMv2 when installed (its results are the same bits)."""

import json
import re

import pytest

from inagg.emulation.testbed import bmv2_missing

from test_emulation import ROOT, assert_clean_logs, mininet_missing, run_topology

LEAF_SPINE = ROOT / "inagg" / "emulation" / "topologies" / "leaf_spine.json"
SWITCH_LINE = re.compile(r"^switch (\w+): (\d+) contributions aggregated, (\d+) rounds completed$", re.M)
TREE = "aggregation tree over spine, tor1 (ranks 0, 1, 2, 3), tor2 (ranks 4, 5, 6, 7); root spine"


def one_switch_twin(tmp_path):
    """leaf_spine.json with every host on one switch (the spine's aggregator address)."""
    topo = json.loads(LEAF_SPINE.read_text())
    topo["switches"] = {"s1": topo["switches"]["spine"]}
    topo["links"] = [[h, f"s1-p{i + 1}"] for i, h in enumerate(topo["hosts"])]
    path = tmp_path / "one_switch.json"
    path.write_text(json.dumps(topo))
    return str(path)


def test_leaf_spine_training_aggregates_on_its_tree_exactly_as_on_one_switch(tmp_path):
    reason = mininet_missing()
    if reason:
        pytest.skip(reason)
    flat, _, _ = run_topology(tmp_path, one_switch_twin(tmp_path), "soft", "--epochs", "2")
    assert flat["mlp"]["ok"] and flat["mlp"]["placement"].startswith("switch")
    for dataplane in ["soft"] + ([] if bmv2_missing() else ["bmv2"]):
        rows, stdout, run = run_topology(tmp_path, "leaf_spine.json", dataplane, "--epochs", "2")
        job = rows["mlp"]
        assert job["ok"] and job["placement"] == TREE, stdout
        assert (job["losses"], job["accuracy"]) == (flat["mlp"]["losses"], flat["mlp"]["accuracy"]), stdout
        assert job["host_results"] == 0 and len(set(job["steps"])) == 1
        levels = {name: (int(agg), int(rounds)) for name, agg, rounds in SWITCH_LINE.findall(stdout)}
        rounds = levels["spine"][1]
        assert rounds > 0 and levels == {"tor1": (4 * rounds, rounds), "tor2": (4 * rounds, rounds),
                                         "spine": (2 * rounds, rounds)}, stdout
        assert_clean_logs(run)
