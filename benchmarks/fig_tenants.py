"""ATP's multi-tenant figure: each job's completion time (JCT) and Jain's fairness index with the
switch's slots shared dynamically (the controller's default), statically (each job one fixed
minimum window from its placement to its end: ``sharing = "static"``) and round by round
(ATP's pool: ``sharing = "atp"``, docs/atp.md), ``controller/allocator.py``, ``make fig-tenants``.

Each run is ``make run``'s launcher (``inagg.bmv2_env.emulation.mininet_run``, software data
plane) on a topology (``--topo``, default ``tenants_fig.json``: four jobs of different sizes
arriving at different times, a pool too small for what they would use together) whose
controller section is given the policy; ``--scale`` multiplies every job's iterations, duration
and arrival time (a quick run). The policies are separate runs (a controller has one), in
alternating order, ``--reps`` of each; every job's JCT comes from the launcher's own summary
rows, as does Jain's index over the jobs' gradient bytes/s (the aggregation service each got)
and steps/s. Rows: per (policy, job) the JCT's median and min-max, its arrival, the widest
switch window it held (of all runs), its calls on the host aggregator (the median run's) and
where its first grant put it in each run (``first_grants``: switch or host); per policy a row
``all`` with the runs' mean JCT and both indexes. ``figures.py`` checks the load and writes the
CSV, PNG and record; each run's saved summary stays in its run directory (the "summary saved"
lines this prints).

    sudo .venv/bin/python benchmarks/fig_tenants.py [--topo FILE] [--reps 3] [--scale 1]
        [--max-load 1.0] [--loaded refuse|mark] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

from figures import add_figure_arguments, figure_main, save_plot, spread, spread_fields  # noqa: E402
from inagg.bmv2_env.emulation.summary import fairness  # noqa: E402
from inagg.controller.allocator import SHARING  # noqa: E402

NAME = "fig_tenants"
TOPO = ROOT / "bmv2_env" / "emulation" / "topologies" / "tenants_fig.json"
RUN_SECONDS = 900          # one run's limit: bring-up, four jobs, teardown on a loaded machine
FIELDS = ("sharing", "job", "workload", "arrival_s", *spread_fields("jct_s", "jain_bytes", "jain_steps"),
          "window_max", "host_calls", "first_grants")


def scaled_topology(topo: dict, sharing: str, scale: float) -> dict:
    """``topo`` with the controller's ``sharing`` and every job's length and arrival scaled."""
    jobs = []
    for job in topo["jobs"]:
        job = dict(job)
        if "iterations" in job:
            job["iterations"] = max(1, round(job["iterations"] * scale))
        for key in ("duration", "start"):
            if key in job:
                job[key] = round(job[key] * scale, 3)
        jobs.append(job)
    return {**topo, "controller": {**topo.get("controller", {}), "sharing": sharing}, "jobs": jobs}


def one_run(args: argparse.Namespace, sharing: str, work: Path) -> list[dict]:
    """One launcher run under ``sharing``: its summary rows; RuntimeError naming the run's end
    when a job did not finish."""
    topo, rows = work / f"{sharing}.json", work / f"{sharing}-rows.json"
    topo.write_text(json.dumps(scaled_topology(json.loads(args.topo.read_text()), sharing, args.scale)))
    cmd = [sys.executable, "-m", "inagg.bmv2_env.emulation.mininet_run", "--topo", str(topo), "--dataplane", "soft",
           "--json", str(rows)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=RUN_SECONDS)
    print(next((line for line in proc.stdout.splitlines() if "summary saved" in line), proc.stdout[-300:]), flush=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the {sharing} run failed (status {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return json.loads(rows.read_text())


def measure(args: argparse.Namespace, watch) -> list[dict]:
    """``--reps`` runs of each policy, the order alternating; one row per (policy, job) and one
    per policy for all jobs."""
    runs: dict[str, list[list[dict]]] = {s: [] for s in SHARING}
    with tempfile.TemporaryDirectory(prefix="fig_tenants-") as work:
        for rep in range(args.reps):
            for sharing in (SHARING if rep % 2 == 0 else tuple(reversed(SHARING))):
                runs[sharing].append(one_run(args, sharing, Path(work)))
                watch.sample(f"after {sharing} run {rep + 1}")
    return [row for sharing in SHARING for row in policy_rows(sharing, runs[sharing])]


def windows(row: dict) -> tuple[int, int]:
    """A job's widest switch window in a run (slots) and its calls on the host aggregator,
    from its grants (``slots`` written ``[base,end)``)."""
    ranges = [g["slots"].strip("[)").split(",") for g in row["grants"] if g["mode"] == "switch"]
    widest = max((int(end) - int(base) for base, end in ranges), default=0)
    return widest, sum(g["calls"] for g in row["grants"] if g["mode"] != "switch")


def policy_rows(sharing: str, runs: list[list[dict]]) -> list[dict]:
    """One policy's rows from its runs' summary rows."""
    names = [r["name"] for r in runs[0] if "jct_s" in r]
    by_job = {n: [next(r for r in run if r["name"] == n) for run in runs] for n in names}
    rows = [{"sharing": sharing, "job": n, "workload": rs[0]["workload"],
             "arrival_s": round(statistics.median(r["arrival_s"] for r in rs), 2),
             **spread([r["jct_s"] for r in rs], "jct_s"), **spread([], "jain_bytes"), **spread([], "jain_steps"),
             "window_max": max(windows(r)[0] for r in rs),
             "host_calls": statistics.median(windows(r)[1] for r in rs),
             "first_grants": " ".join(r["grants"][0]["mode"] for r in rs)} for n, rs in by_job.items()]
    fair = [fairness(run) for run in runs]
    rows.append({"sharing": sharing, "job": "all", "workload": "", "arrival_s": None,
                 **spread([statistics.mean(r["jct_s"] for r in run if "jct_s" in r) for run in runs], "jct_s"),
                 **spread([f["jain_grad_bytes_per_s"] for f in fair if f["jain_grad_bytes_per_s"]], "jain_bytes"),
                 **spread([f["jain_steps_per_s"] for f in fair if f["jain_steps_per_s"]], "jain_steps"),
                 "window_max": None, "host_calls": None, "first_grants": ""})
    return rows


def plot(plt, rows: list[dict], path: Path, watch) -> None:
    """JCT per job under both policies (bars, min-max), and Jain's index of each policy."""
    jobs = [r["job"] for r in rows if r["sharing"] == SHARING[0] and r["job"] != "all"]
    by = {(r["sharing"], r["job"]): r for r in rows}
    fig, (jct, jain) = plt.subplots(1, 2, figsize=(9, 3.8), gridspec_kw={"width_ratios": [3, 1]})
    for i, sharing in enumerate(SHARING):
        mine = [by[sharing, j] for j in jobs]
        med = [r["jct_s_median"] for r in mine]
        width = 0.8 / len(SHARING)
        jct.bar([x - 0.4 + width * (i + 0.5) for x in range(len(jobs))], med, width, label=sharing, capsize=3,
                yerr=[[m - r["jct_s_min"] for m, r in zip(med, mine)], [r["jct_s_max"] - m for m, r in zip(med, mine)]])
        r = by[sharing, "all"]
        if r["jain_bytes_median"] is None:   # no run measured the jobs' gradient bytes/s
            continue
        jain.bar([i], [r["jain_bytes_median"]], 0.6, capsize=3,
                 yerr=[[r["jain_bytes_median"] - r["jain_bytes_min"]], [r["jain_bytes_max"] - r["jain_bytes_median"]]])
    jct.set_xticks(range(len(jobs)), [f"{j}\n+{by[SHARING[0], j]['arrival_s']:g} s" for j in jobs], fontsize=8)
    jct.set_ylabel("job completion time (s)")
    jct.legend(fontsize=7)
    jain.set_xticks(range(len(SHARING)), SHARING)
    jain.set_ylim(0, 1.05)
    jain.set_ylabel("Jain's index, gradient bytes/s")
    save_plot(fig, path, f"multi-tenant JCT, {' vs '.join(SHARING)} sharing: median, min-max of {rows[0]['reps']} runs",
              watch)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--topo", type=Path, default=TOPO, help="the jobs and the network (default %(default)s)")
    p.add_argument("--scale", type=float, default=1.0, help="every job's iterations, duration and arrival times x this")
    add_figure_arguments(p, reps=3)
    args = p.parse_args(argv)
    if not args.scale > 0:
        p.error("--scale must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    return figure_main(NAME, parse_args(argv), measure, FIELDS, plot)


if __name__ == "__main__":
    sys.exit(main())
