"""The emulation beyond one switch (needs root and Debian's mininet), the run held to the bits
of a plainer run of the same job: bmv2_env/emulation/topologies/leaf_spine.json's 8-rank job
aggregates on its tree (two ToRs of four workers under the spine) and trains to exactly the losses
and final parameters of the same job on one switch of the same data plane (the same K, so the same
exponent blocks); each level's counters say so: every ToR aggregates 4 contributions a round and
sends one up, the spine 2. On the software data plane, and on BMv2 when installed. One epoch: every
step's sums must match, so the first epoch's 11 steps show a difference as a second epoch would.

The shared helpers (``variant``, ``levels``) serve tests/test_emulation_sixteen_ranks.py too; the
two runs are in files of their own so pytest-xdist's ``--dist loadfile`` puts them on either
worker."""

import json
import re

import pytest

from inagg.bmv2_env.emulation.testbed import bmv2_missing

from test_emulation import ROOT, assert_clean_logs, mininet_missing, run_topology

TOPOLOGIES = ROOT / "bmv2_env" / "emulation" / "topologies"
SWITCH_LINE = re.compile(r"^switch (\w+): (\d+) contributions aggregated, (\d+) rounds completed$", re.M)
TREE = "aggregation tree over spine, tor1 (ranks 0, 1, 2, 3), tor2 (ranks 4, 5, 6, 7); root spine"


@pytest.fixture(autouse=True)
def needs_mininet():
    if reason := mininet_missing():
        pytest.skip(reason)


def variant(tmp_path, name: str, change) -> str:
    """A copy of shipped topology ``name`` changed by ``change(topology)``, as a file."""
    topo = json.loads((TOPOLOGIES / name).read_text())
    change(topo)
    path = tmp_path / f"variant-{name}"
    path.write_text(json.dumps(topo))
    return str(path)


def levels(stdout: str) -> dict[str, tuple[int, int]]:
    """Each switch's (contributions aggregated, rounds completed) from the summary."""
    return {name: (int(agg), int(rounds)) for name, agg, rounds in SWITCH_LINE.findall(stdout)}


def one_switch(topo: dict) -> None:
    """Every host on one switch (the spine's aggregator address)."""
    topo["switches"] = {"s1": topo["switches"]["spine"]}
    topo["links"] = [[h, f"s1-p{i + 1}"] for i, h in enumerate(topo["hosts"])]


def test_leaf_spine_training_aggregates_on_its_tree_exactly_as_on_one_switch(tmp_path):
    # The reference is one switch of the same data plane: the demo's calls share an exponent
    # per packet of the grant's K (364 on the soft target at MTU 1500, 64 on BMv2), so the two
    # targets' sums are each exact but not the same bits; a tree must give its K's bits.
    for dataplane in ["soft"] + ([] if bmv2_missing() else ["bmv2"]):
        flat, _, _ = run_topology(tmp_path, variant(tmp_path, "leaf_spine.json", one_switch), dataplane,
                                  "--epochs", "1")
        ref = flat["mlp"]
        assert ref["ok"] and ref["placement"].startswith("switch") and ref["params_sha256"]
        rows, stdout, run = run_topology(tmp_path, "leaf_spine.json", dataplane, "--epochs", "1")
        job = rows["mlp"]
        assert job["ok"] and job["placement"] == TREE, stdout
        assert (job["losses"], job["accuracy"], job["params_sha256"]) == \
            (ref["losses"], ref["accuracy"], ref["params_sha256"]), stdout
        assert job["host_results"] == 0 and len(set(job["steps"])) == 1
        rounds = levels(stdout)["spine"][1]
        assert rounds > 0 and levels(stdout) == {"tor1": (4 * rounds, rounds), "tor2": (4 * rounds, rounds),
                                                 "spine": (2 * rounds, rounds)}, stdout
        assert_clean_logs(run)
