"""The papers' figures (``make fig-*``: benchmarks/fig_*.py on benchmarks/figures.py), each in
its smallest form: tiny tensors or jobs, one repetition, the load check set to mark rather than
refuse (this machine is shared). Each writes its CSV with the expected columns, one row per
point, the spread's three numbers of every series, the load columns, its PNG and its record
(the exact command, the load samples); the run leaves nothing behind. The load check itself
and the pure parts are checked without the emulation. The emulation's cases need root and
Mininet."""

import argparse
import csv
import json
import subprocess
import sys

import pytest

from test_emulation import ROOT, assert_left_nothing, mininet_missing

sys.path.insert(0, str(ROOT / "benchmarks"))

import fig_loss  # noqa: E402
import fig_tenants  # noqa: E402
import fig_tree  # noqa: E402
import fig_workers  # noqa: E402
import figures  # noqa: E402


def run_figure(tmp_path, script: str, *options: str, timeout: float = 400) -> tuple[list[dict], str]:
    """Run a figure script into ``tmp_path``: its CSV rows and its output."""
    proc = subprocess.run([sys.executable, f"benchmarks/{script}.py", "--reps", "1", "--loaded", "mark",
                           "--out", str(tmp_path), *options], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(tmp_path / f"{script}.csv") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    module = sys.modules[script]
    assert tuple(reader.fieldnames) == module.FIELDS + figures.LOAD_FIELDS
    assert (tmp_path / f"{script}.png").stat().st_size > 0
    record = (tmp_path / f"{script}.txt").read_text()
    assert f"benchmarks/{script}.py --reps 1 --loaded mark" in record and "load samples" in record
    assert all(r["reps"] == "1" and float(r["load1_peak"]) >= 0 and r["quiet"] in ("True", "False") for r in rows)
    return rows, proc.stdout


def spread_ok(row: dict, prefix: str) -> bool:
    low, mid, high = (float(row[f"{prefix}_{k}"]) for k in ("min", "median", "max"))
    return 0 < low <= mid <= high


def emulation():
    if reason := mininet_missing():
        pytest.skip(reason)


def test_fig_workers_writes_a_point_per_worker_count(tmp_path):
    emulation()
    rows, out = run_figure(tmp_path, "fig_workers", "--workers", "2", "3", "--sizes-mib", "0.25")
    assert_left_nothing(out, interfaces=4, processes=3)
    assert [int(r["workers"]) for r in rows] == [2, 3]
    assert all(spread_ok(r, p) for r in rows for p in ("inagg_s", "gloo_s", "ratio"))


def test_fig_loss_writes_a_point_per_loss_rate_with_the_loss_the_ports_applied(tmp_path):
    emulation()
    rows, _ = run_figure(tmp_path, "fig_loss", "--loss", "0", "5", "--workers", "2", "--sizes-mib", "0.25")
    clean, lossy = rows
    assert (float(clean["loss_asked_pct"]), float(clean["loss_pct"]), float(clean["slowdown"])) == (0, 0, 1)
    assert float(lossy["loss_asked_pct"]) == 5 and 1 < float(lossy["loss_pct"]) < 15   # counted, not asked
    assert int(lossy["retransmissions"]) > 0 and all(spread_ok(r, "inagg_s") for r in rows)


@pytest.mark.parametrize("target", ["fig-workers", "fig-loss", "fig-tenants", "fig-tree"])
def test_each_make_target_runs_its_figure_and_refuses_a_loaded_machine(tmp_path, target):
    """The make target reaches its script with the load check (a threshold below any load):
    refused before anything is built, saying what to do, nothing written."""
    emulation()
    proc = subprocess.run(["make", "--no-print-directory", target, "MAX_LOAD=-1", f"FIG_ARGS=--out {tmp_path}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    script = target.replace("-", "_")
    assert proc.returncode != 0 and f"{script}: the machine's 1-minute load average is" in proc.stderr, proc.stderr
    assert "--loaded mark" in proc.stderr and "Error 3" in proc.stderr and list(tmp_path.iterdir()) == []


def test_a_loaded_machine_is_refused_or_marked(monkeypatch):
    monkeypatch.setattr(figures.os, "getloadavg", lambda: (3.5, 1.0, 1.0))
    args = argparse.Namespace(max_load=1.0, loaded="refuse")
    with pytest.raises(figures.Loaded, match="load average is 3.50, above --max-load 1: .* --loaded mark"):
        figures.start_watch(args)
    watch = figures.start_watch(argparse.Namespace(max_load=1.0, loaded="mark"))
    assert not watch.quiet and "not quiet: load 3.5 > 1" in watch.label()
    monkeypatch.setattr(figures.os, "getloadavg", lambda: (0.4, 1.0, 1.0))
    quiet = figures.start_watch(args)
    quiet.sample("end")
    assert quiet.quiet and quiet.label() == "" and quiet.peak == 0.4


def test_spread_and_the_figures_options():
    assert figures.spread([3.0, 1.0, 2.0, 10.0], "t") == {"t_median": 2.5, "t_min": 1.0, "t_max": 10.0}
    assert figures.spread([], "t") == {"t_median": None, "t_min": None, "t_max": None}
    assert fig_workers.parse_args([]).workers == [2, 4, 8]
    assert fig_loss.parse_args([]).loss == [0, 0.01, 0.1, 1]
    assert fig_tree.tree_args(fig_tree.parse_args(["--reps", "2"])).sharing == "static"
    with pytest.raises(SystemExit):
        fig_loss.parse_args(["--loss", "101"])


def test_fig_tenants_scales_the_jobs_and_sets_the_policy():
    topo = json.loads(fig_tenants.TOPO.read_text())
    scaled = fig_tenants.scaled_topology(topo, "static", 0.1)
    assert scaled["controller"] == {**topo["controller"], "sharing": "static"}
    for before, after in zip(topo["jobs"], scaled["jobs"]):
        assert after.get("iterations") == (max(1, round(before["iterations"] * 0.1)) if "iterations" in before else None)
        assert after.get("start") == (round(before["start"] * 0.1, 3) if "start" in before else None)
    assert topo["jobs"] == json.loads(fig_tenants.TOPO.read_text())["jobs"]      # the file's, untouched


def test_fig_tenants_plots_a_policy_whose_runs_gave_no_fairness_index(tmp_path):
    """A policy whose runs measured no job's gradient bytes/s (``fairness`` gives None) is
    plotted without its Jain bar: the JCTs still are."""
    plt = pytest.importorskip("matplotlib.pyplot")
    from plots import pyplot

    job = {"reps": 1, "arrival_s": 0.0, **figures.spread([2.0], "jct_s")}
    rows = [{"sharing": s, "job": j, **job, **figures.spread([] if s == "static" else [0.9], "jain_bytes")}
            for s in fig_tenants.SHARING for j in ("a", "all")]
    watch = figures.LoadWatch(1.0, [("start", 0.1)])
    fig_tenants.plot(pyplot(), rows, tmp_path / "t.png", watch)
    plt.close("all")
    assert (tmp_path / "t.png").stat().st_size > 0
