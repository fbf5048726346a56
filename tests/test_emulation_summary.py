"""The emulation's summary (bmv2_env/emulation/summary.py) on the records of real runs (no
root needed): tests/fixtures/emulation_runs/ holds what the launcher saved as records.json in
two runs, two_jobs.json (the second job falls back to the host aggregator, then is upgraded to
the switch) and four_hosts_four_ranks.json (16 ranks, 4 of them the switch's workers)."""

import json
from pathlib import Path

import pytest

from inagg.bmv2_env.emulation.impairments import plan
from inagg.bmv2_env.emulation.summary import summary, write_summary
from inagg.bmv2_env.emulation.topology import TopologyError
from inagg.bmv2_env.emulation.topology import load_topology

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "tests" / "fixtures" / "emulation_runs"
TOPOLOGIES = ROOT / "bmv2_env" / "emulation" / "topologies"


def real_run(name: str):
    """A real run's topology, job records and switch counters."""
    run = json.loads((RUNS / name).read_text())
    return load_topology(TOPOLOGIES / run["topology"]), run["records"], run["switches"]


def job_line(lines: list[str], job: str) -> list[str]:
    return next(line for line in lines if line.startswith(f"{job} ")).split()


def stats_of(record: dict) -> list[dict]:
    return [record["done"][r]["stats"] for r in sorted(record["done"], key=int)]


def test_grants_counts_the_grants_used_not_the_changes(tmp_path):
    """The second job used two grants (the host aggregator, then the switch): its story has two
    lines and its grants column says 2, where it said 1 (the changes); the first job's says 1."""
    topo, records, switches = real_run("two_jobs.json")
    lines, rows = summary(topo, records, switches, tmp_path)
    first, second = rows
    assert (first["grants_used"], second["grants_used"]) == (1, 2) and second["grant_changes"] == 1
    assert (job_line(lines, "first")[2], job_line(lines, "second")[2]) == ("1", "2")
    assert sum("upgraded to switch s1" in line for line in lines) == 1


def test_placed_shows_where_the_job_is_after_its_upgrade(tmp_path):
    """``placed:`` of the upgraded job is the switch it moved to, not the reason it first went
    to the host aggregator (which the controller's listing at placement still says)."""
    topo, records, switches = real_run("two_jobs.json")
    full = "switch s1 has no free slots for it (or an operator drained it); it moves to the switch when slots free up"
    lines, rows = summary(topo, records, switches, tmp_path, listed={"second": full})
    second = rows[1]
    assert second["grants"][0]["reason"] == full and second["grants"][-1]["mode"] == "switch"
    assert second["placement"] == f"switch {second['grants'][-1]['aggregator']}"
    placed = [line.strip() for line in lines if line.strip().startswith("placed:")]
    assert placed[1] == f"placed: {second['placement']}; 2 worker(s) of the switch"


def test_retransmissions_and_megabytes_are_both_per_worker(tmp_path):
    """``retx/worker`` is the mean over the switch's workers, as ``MB sent/worker`` is (the
    column summed them); on hosts that reduce first, the workers are the 4 leaders of 16 ranks."""
    for run, workers in (("two_jobs.json", 2), ("four_hosts_four_ranks.json", 4)):
        topo, records, switches = real_run(run)
        lines, rows = summary(topo, records, switches, tmp_path)
        for record, row in zip(records, rows):
            leaders = [s for s in stats_of(record) if s.get("leader", True)]
            assert len(leaders) == row["switch_workers"] == workers
            retx = sum(s["retransmissions"] for s in leaders)
            assert row["retransmissions"] == retx and row["retx_per_worker"] == pytest.approx(retx / workers)
            assert row["mb_sent"] == pytest.approx(sum(s["wire_bytes_sent"] for s in leaders) / workers / 1e6)
            fields = job_line(lines, row["name"])
            assert fields[5:7] == [f"{row['mb_sent']:.2f}", f"{row['retx_per_worker']:.1f}"]
    topo, records, switches = real_run("two_jobs.json")
    assert sum(s["retransmissions"] for s in stats_of(records[0])) == 2    # so a sum would read 2, not 1.0
    assert job_line(summary(topo, records, switches, tmp_path)[0], "first")[6] == "1.0"


def test_the_summary_is_saved_as_text_and_json_of_the_same_figures(tmp_path):
    """summary.txt is the printed text; summary.json the same figures, each job's row and each
    switch's counters; a job whose ranks did not all report is FAILED in both."""
    topo, records, switches = real_run("two_jobs.json")
    records[1]["done"].pop("1")                 # as when a rank of the second job died
    lines, rows = summary(topo, records, switches, tmp_path / "logs")
    write_summary(tmp_path, lines, rows, switches)
    text = (tmp_path / "summary.txt").read_text()
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert text == "\n".join(lines).lstrip("\n") + "\n" and text.startswith("per-job summary\n")
    assert saved == {"jobs": rows, "switches": switches,
                     "fairness": {"jobs": 0, "jain_grad_bytes_per_s": None, "jain_steps_per_s": None}}
    first, second = saved["jobs"]
    assert second == {"name": "second", "ok": False}
    assert f"second       FAILED: see {tmp_path}/logs/second-*.log" in text
    fields = job_line(lines, "first")
    assert fields[1:3] == [first["mode"], str(first["grants_used"])] and fields[8] == f"{100 * first['accuracy']:.1f}%"
    for name, c in switches.items():
        assert f"switch {name}: {c['job_aggregated']} contributions aggregated, {c['job_results']} rounds" in text


def test_a_failed_run_saves_why(tmp_path):
    write_summary(tmp_path, ["run abcd failed: job j rank 1 on h2 was killed by SIGKILL"], [], {},
                  failed="job j rank 1 on h2 was killed by SIGKILL")
    assert json.loads((tmp_path / "summary.json").read_text()) == {
        "jobs": [], "switches": {}, "failed": "job j rank 1 on h2 was killed by SIGKILL",
        "fairness": {"jobs": 0, "jain_grad_bytes_per_s": None, "jain_steps_per_s": None}}
    assert (tmp_path / "summary.txt").read_text() == "run abcd failed: job j rank 1 on h2 was killed by SIGKILL\n"


def test_link_loss_is_what_was_applied_not_what_was_asked(tmp_path):
    """A topology asking loss 1 % on h1's link: the column says 1 where netem applied it or,
    without netem, the soft switch's ports did (with their measured drops), and BMv2 without
    netem is refused; a delay nothing applies is named as not applied, never claimed."""
    topo, records, switches = real_run("two_jobs.json")
    link = next(link for link in topo.links if "h1" in (link.a.node, link.b.node))
    link.params["loss"] = 1
    applied, rows = summary(topo, records, switches, tmp_path, applied=plan(topo, "soft", netem=True))
    assert [r["link_loss_pct"] for r in rows] == [1, 0] and job_line(applied, "first")[7] == "1"
    assert not any("NOT applied" in line for line in applied)
    with pytest.raises(TopologyError, match="DATAPLANE=soft"):
        plan(topo, "bmv2", netem=False)
    soft = plan(topo, "soft", netem=False)
    soft.port_stats = {"s1": [{"port": 1, "direction": "in", "seen": 1000, "dropped": 9, "loss_pct": 1},
                              {"port": 1, "direction": "out", "seen": 1000, "dropped": 11, "loss_pct": 1}]}
    lines, rows = summary(topo, records, switches, tmp_path, applied=soft)
    assert [(r["link_loss_pct"], r["link_loss_measured_pct"]) for r in rows] == [(1, 1.0), (0, None)]
    assert "  p1 in 9/1000 (0.90 % of 1 %), out 11/1000 (1.10 % of 1 %)" in lines
    del link.params["loss"]
    link.params["jitter"] = "1ms"
    link.params["delay"] = "5ms"
    link.params["max_queue_size"] = 10
    lines, rows = summary(topo, records, switches, tmp_path, applied=plan(topo, "soft", netem=False))
    assert [(r["link_loss_pct"], r["link_delay_ms"], r["link_jitter_ms"], r["link_delay_asked_ms"]) for r in rows] == [
        (0, 5, 1, 5), (0, 0, 0, 0)]
    assert "link max_queue_size of the topology NOT applied (this kernel has no netem qdisc)" in "\n".join(lines)
    with pytest.raises(TopologyError, match="link delay and jitter: .*DATAPLANE=soft"):
        plan(topo, "bmv2", netem=False)


def test_duplicates_reordering_and_rate_changes_are_reported_as_counted(tmp_path):
    """The ports' duplicated and reordered frames become the job's measured shares and the
    port's line; each bandwidth change applied is a line with its time and tc's rates."""
    topo, records, switches = real_run("two_jobs.json")
    link = next(link for link in topo.links if "h1" in (link.a.node, link.b.node))
    link.params.update(delay="5ms", jitter="2ms", duplicate=10, reorder=5)
    applied = plan(topo, "soft", netem=False)
    counts = {"seen": 200, "dropped": 0, "delayed": 180, "duplicated": 20, "reordered": 30, "loss_pct": 0,
              "delay_ms": 5, "jitter_ms": 2, "duplicate_pct": 10, "reorder_pct": 5}
    applied.port_stats = {"s1": [{"port": 1, "direction": d, **counts} for d in ("in", "out")]}
    applied.bw_changes = [{"link": "h1-s1-p1", "at_s": -3.2, "mbit": 100, "mbit_applied": [100.0, 100.0]},
                          {"link": "h1-s1-p1", "at_s": 5.01, "mbit": 20, "mbit_applied": [20.0, None]}]
    lines, rows = summary(topo, records, switches, tmp_path, applied=applied)
    assert [(r["link_duplicated_pct"], r["link_reordered_pct"]) for r in rows] == [(10.0, 15.0), (None, None)]
    text = "\n".join(lines)
    assert "link delay/jitter/duplicate/reorder applied by the software data plane's ports" in text
    assert ("  p1 in 0/200 (0.00 % of 0 %), 180 delayed 5 +- 2 ms, 20 duplicated (of 10 %), 30 reordered, "
            "out 0/200") in text
    assert "  -3.2 s link h1-s1-p1: 100 Mbit/s asked, 100/100 Mbit/s applied" in lines
    assert "  +5.0 s link h1-s1-p1: 20 Mbit/s asked, 20/none Mbit/s applied" in lines
    write_summary(tmp_path, lines, rows, switches, applied=applied)
    saved = json.loads((tmp_path / "summary.json").read_text())["links"]
    assert saved["bw_changes"] == applied.bw_changes and saved["port_stats"] == applied.port_stats
    assert saved["by"] == "soft switch ports" and saved["applied"] == ["delay", "jitter", "duplicate", "reorder"]
