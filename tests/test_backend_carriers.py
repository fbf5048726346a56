"""What a user is told of the paths that carried an ``inagg`` group's calls, from the logs and stats
of real 2-rank runs (tests/backend_rank.py ``report``, inagg's loggers at INFO on stderr): one
line on rank 0 at start naming the carriers in use, each fallback once per reason on rank 0
(logger ``inagg.fallbacks``, never a WARNING), ``stats()['carriers']`` accounting for every
allreduce's calls and bytes, no c10d ``waitForInput`` line from the agreement's store waits
(rank 1 comes late to three agreements), and no local deployment where every rank is on one
host (structure, not time: the child processes of each rank)."""

from __future__ import annotations

import json
import subprocess
import sys

from rank_fork import RankProcess
from test_backend_lifecycle import ROOT, RANK, _env, _free_port

_FALLBACK_REASONS = ("dtype torch.int64", "op MAX", "dtype torch.float64", "inagg runs allreduce and reduce-scatter only")
_CALLS = 64 + 16 + 2 * 3   # the allreduces a report run makes (tests/backend_rank.py)
_NEVER = ("waitForInput", "WARNING", "switch mode", "aggregating on the switch", "Traceback")


def _report(**env: str) -> list[tuple[dict, list[str]]]:
    """Each rank's stats (``stats`` line) and stderr lines for a 2-rank report run, its ranks
    forked (tests/rank_fork.py)."""
    port = _free_port()
    procs = [RankProcess([sys.executable, str(RANK), "inagg", "report"], cwd=ROOT, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=_env(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2",
                                  MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **env))
             for r in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out[-2000:] + err[-4000:]
    return [(json.loads(out.split("stats ", 1)[1].splitlines()[0]), err.splitlines()) for out, err in outs]


def _check_counts(stats: dict) -> None:
    """Every allreduce counted once, under one carrier, with its bytes."""
    carriers = stats["carriers"]
    assert sum(c["calls"] for c in carriers.values()) == _CALLS, carriers
    assert sum(c["bytes"] for c in carriers.values()) == stats["sent"], carriers
    assert carriers["gloo"]["calls"] >= 2 * 3, carriers   # the fallbacks at least


def test_a_job_on_one_host_starts_nothing_and_says_shared_memory_and_fixed_point_over_gloo():
    (stats0, err0), (stats1, err1) = _report()
    summary = [line for line in err0 if line.startswith("inagg.paths INFO inagg: 2 ranks on 1 host")]
    assert len(summary) == 1, err0
    assert "allreduces on shared memory or fixed point over gloo" in summary[0], summary
    assert "no switch, controller or aggregator started" in summary[0], summary
    fallbacks = [line for line in err0 if line.startswith("inagg.fallbacks INFO")]
    assert len(fallbacks) == len(_FALLBACK_REASONS), fallbacks   # once per reason, each made twice
    assert all(any(f"({reason})" in line for line in fallbacks) for reason in _FALLBACK_REASONS), fallbacks
    assert not [line for line in err1 if " INFO " in line], err1   # rank 0 speaks for the job
    for stats, err in ((stats0, err0), (stats1, err1)):
        assert not [line for line in err if any(word in line for word in _NEVER)], err
        assert stats["children"] == [] and stats["controller"] is None, stats   # no deployment, no controller
        assert set(stats["carriers"]) <= {"shared memory", "fixed point over gloo", "gloo"}, stats["carriers"]
        _check_counts(stats)
    assert stats0["carriers"] == stats1["carriers"]   # every rank takes the same path for the same call


def test_a_job_whose_ranks_are_switch_workers_starts_its_deployment_and_says_switch():
    """``INAGG_HOST_REDUCE=off`` (every rank a worker of the switch) with every eligible call
    pinned to inagg's path: rank 0 starts the local deployment, and the carrier is the switch."""
    (stats0, err0), (stats1, err1) = _report(INAGG_HOST_REDUCE="off", INAGG_ALLREDUCE_PATH="inagg")
    summary = [line for line in err0 if line.startswith("inagg.paths INFO inagg: 2 ranks, each a worker")]
    assert len(summary) == 1, err0
    assert "allreduces on switch (pinned by INAGG_ALLREDUCE_PATH=inagg)" in summary[0], summary
    assert "at its local deployment unix:" in summary[0], summary
    assert stats0["children"] and not stats1["children"], (stats0, stats1)   # rank 0's deployment
    assert not [line for line in err1 if " INFO " in line], err1   # rank 0 speaks for the job
    for stats, err in ((stats0, err0), (stats1, err1)):
        assert not [line for line in err if any(word in line for word in _NEVER[:2])], err
        assert set(stats["carriers"]) == {"switch", "gloo"} and stats["controller"].startswith("unix:"), stats
        _check_counts(stats)
