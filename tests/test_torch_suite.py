"""Torch's own distributed test suite on the inagg backend (tests/torch_dist_suite.py), against
gloo's pass set: the committed table of the whole suite on both backends
(docs/results/torch_suite/outcomes.csv, ``tools.torch_suite_table``) has every test that passes
on gloo passing on inagg, or listed in ``NOT_ON_INAGG`` with torch's reason; and CI runs a test
of each kind that passes on gloo (``CI_TESTS``, checked against the table), in a process of its
own, all passing, none skipped."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools.torch_suite_table import junit_outcomes, read_table, table as make_table

HERE = Path(__file__).resolve().parent
TABLE = HERE.parent / "docs" / "results" / "torch_suite" / "outcomes.csv"
_DISTRIBUTED_TEST = "torch/testing/_internal/distributed/distributed_test.py"

# gloo passes these and inagg does not run them: torch gates them on the backend's name in a
# way no backend joins, and running them anyway would take a test body of our own
_NO_SYNC = (f"torch builds the model only where BACKEND is mpi or gloo ({_DISTRIBUTED_TEST}:5308, "
            "_test_accumulate_gradients_no_sync: `if BACKEND == \"mpi\" or BACKEND == \"gloo\":`), "
            "so on any other backend the body fails on an unbound model; the skip before it says so")
_MONITORED = ("torch's dist.monitored_barrier refuses every group whose backend is not named gloo "
              "(torch/distributed/distributed_c10d.py:5418: `if get_backend(group) != Backend.GLOO: raise "
              "ValueError`); inagg's own inagg.hostlib.pytorch.backend.monitored_barrier is the same call")
NOT_ON_INAGG = {
    "test_accumulate_gradients_no_sync": _NO_SYNC,
    "test_accumulate_gradients_no_sync_grad_is_view": _NO_SYNC,
    "test_accumulate_gradients_no_sync_allreduce_hook": _NO_SYNC,
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook": _NO_SYNC,
    "test_monitored_barrier_gloo": _MONITORED,
    "test_monitored_barrier_gloo_rank_0_timeout": _MONITORED,
    "test_monitored_barrier_gloo_subgroup": _MONITORED,
}

# What each test exercises, by its name (the first that matches): CI runs one of each kind
KINDS = (
    ("ddp", r"ddp|DistributedDataParallel|SyncBatchNorm|post_localSGD|accumulate_gradients|grads_same|"
            r"static_graph|periodic_model|average_parameters|sync_bn|undefined_grad|output_unused|"
            r"verify_model|compute_bucket|different_graph|stateless_api|skip_all_reduce_unused"),
    ("reduce_scatter", r"reduce_scatter"),
    ("all_reduce", r"all_reduce"),
    ("all_gather", r"all_gather|allgather"),
    ("all_to_all", r"all_to_all"),
    ("broadcast", r"broadcast"),
    ("reduce", r"^test_reduce"),
    ("gather", r"gather"),
    ("scatter", r"scatter"),
    ("point_to_point", r"send|recv"),
    ("barrier", r"barrier"),
    ("groups", r"group|get_rank|get_backend"),
    ("other", r""),
)

# What CI runs: each test starts its two ranks (forked from a server that imported torch's suite
# once: tests/torch_dist_suite.py), so one costs 1-3 s on 2 loaded cores. A test of each kind that passes on
# gloo (``test_ci_runs_a_test_of_each_kind_that_passes_on_gloo``), the gloo-gated ones among
# them where a kind has one (torch_dist_suite.NAME_GATED: they check that gate's way in).
CI_TESTS = (
    "test_barrier_timeout_global", "test_all_reduce_coalesced_sum", "test_all_reduce_sum",
    "test_batch_isend_irecv_gloo", "test_get_future", "test_grads_same_across_ranks_with_no_sync",
    "test_scatter_object_list", "test_all_gather_object_default_pg", "test_ddp_logging_data_cpu",
    "test_broadcast", "test_reduce_sum", "test_gather_full_group", "test_get_backend",
)


def kind(test: str) -> str:
    """The kind of ``test`` (``KINDS``)."""
    return next(name for name, pattern in KINDS if re.search(pattern, test))


def run_suite(backend: str, tests: tuple[str, ...], tmp_path: Path) -> dict[str, str]:
    """Each test's outcome in torch's suite on ``backend``: PASSED, FAILED, ERROR, or SKIPPED
    (pytest names no test in its skip lines: a test with none of the others was skipped).
    Initialized from a file, as torch's CI runs the suite for gloo too: some tests need it."""
    ids = [f"torch_dist_suite.py::TestDistBackendWithSpawn::{t}" for t in tests]
    env = {k: v for k, v in os.environ.items() if not k.startswith("INAGG_")}
    env.update(BACKEND=backend, WORLD_SIZE="2", INIT_METHOD=f"file://{tmp_path}/init")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *ids], cwd=HERE,
                          env=env, capture_output=True, text=True, timeout=880)
    found = re.findall(r"^(PASSED|FAILED|ERROR) torch_dist_suite\.py::TestDistBackendWithSpawn::(\w+)",
                       proc.stdout, re.M)
    outcomes = {name: outcome for outcome, name in found}
    return {name: outcomes.get(name, "SKIPPED") for name in tests}


@pytest.fixture(scope="module")
def table() -> dict[str, dict]:
    return {row["test"]: row for row in read_table(TABLE)}


def test_the_committed_table_is_the_committed_runs(table):
    raw = TABLE.parent / "raw"
    made = make_table(junit_outcomes(raw / "gloo.xml"), junit_outcomes(raw / "inagg.xml"),
                      [("rerun 1", junit_outcomes(raw / "inagg_rerun_any_source.xml"))])
    assert {row["test"]: row for row in made} == table


def test_every_test_that_passes_on_gloo_passes_on_inagg_or_says_why_not(table):
    differ = {name for name, row in table.items() if row["gloo"] == "PASSED" and row["inagg"] != "PASSED"}
    assert differ == set(NOT_ON_INAGG), {name: table[name]["inagg"] for name in differ ^ set(NOT_ON_INAGG)}


def test_ci_runs_a_test_of_each_kind_that_passes_on_gloo(table):
    passing = {name for name, row in table.items() if row["gloo"] == row["inagg"] == "PASSED"}
    assert set(CI_TESTS) <= passing, set(CI_TESTS) - passing
    kinds_on_gloo = {kind(name) for name, row in table.items() if row["gloo"] == "PASSED"}
    assert kinds_on_gloo == {kind(name) for name in CI_TESTS}


@pytest.mark.timeout(900)   # 26-34 s at load 6-11 on 2 cores (spawned ranks: 3 min): room for worse
def test_torchs_suite_passes_on_inagg(tmp_path):
    assert run_suite("inagg", CI_TESTS, tmp_path) == {name: "PASSED" for name in CI_TESTS}
