"""benchmarks/fig_tenants.py (``make fig-tenants``) in its smallest form, as tests/test_figures.py runs
the others (one repetition, the load check set to mark; needs root and Mininet). A file of its
own so pytest-xdist's ``--dist loadfile`` can run it on another worker than the other figures."""

import json

from test_figures import emulation, run_figure, spread_ok

import fig_tenants  # test_figures put benchmarks/ on the path


def test_fig_tenants_writes_each_jobs_jct_under_each_policy(tmp_path):
    """Two of the figure's jobs (the two profiles: the ranks' start-up is most of a small run)."""
    emulation()
    topo = json.loads(fig_tenants.TOPO.read_text())
    topo["jobs"] = [j for j in topo["jobs"] if "profile" in j]
    (tmp_path / "topo.json").write_text(json.dumps(topo))
    rows, _ = run_figure(tmp_path, "fig_tenants", "--scale", "0.05", "--topo", str(tmp_path / "topo.json"),
                         timeout=600)
    jobs = [j["name"] for j in topo["jobs"]]
    assert [(r["sharing"], r["job"]) for r in rows] == [(s, j) for s in ("dynamic", "static", "atp")
                                                        for j in [*jobs, "all"]]
    assert all(spread_ok(r, "jct_s") for r in rows)
    assert all(0 < float(r["jain_bytes_median"]) <= 1 for r in rows if r["job"] == "all")
    static = [int(r["window_max"]) for r in rows if r["sharing"] == "static" and r["job"] != "all"]
    assert static and all(w in (0, 256) for w in static)          # one minimum window, never grown
    atp = [int(r["window_max"]) for r in rows if r["sharing"] == "atp" and r["job"] != "all"]
    assert atp and all(w == 0 for w in atp)          # host-aggregator grants, the switch's pool shared
