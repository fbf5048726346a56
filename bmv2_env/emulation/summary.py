"""The run's summary: each job's line, where it was placed and its story, each switch's
counters; printed, and saved in the run directory.

The summary is a function of the run's records, which the launcher saves first: for each job
its topology entry, the options it ran with, its epochs' losses, every rank's final stats and
the digest of rank 0's final parameters (``job_record``; ``records.json`` in the run directory),
and each switch's counters. So a summary can be rebuilt from a finished run, and it is tested on
the records of real runs.

What each figure is, per job:

* ``grants``: the grants the job used (each activated one: its first placement, every slot
  change, fall-back and upgrade), the lines of its story; ``grant_changes`` is one less.
* ``placed:`` the job's latest placement: after an upgrade, the switch it moved to, not the
  reason it first went to the host aggregator.
* ``MB sent/worker`` and ``retx/worker``: the means over the switch's workers (on a host that
  reduces first, its leader), so both are per worker; the JSON keeps the totals too.
* ``link loss %``: the loss applied on the job's worst link, never only asked (impairments.py:
  by netem, or where the kernel has none by the software data plane's ports; else 0 and a line
  says so; the row keeps what was asked in ``link_loss_asked_pct``). Where the switch's ports
  applied it, ``link_loss_measured_pct`` is the share of the job's host links' frames they
  actually dropped, and a line per switch gives each port's counts. ``link_delay_ms`` and
  ``link_jitter_ms`` alike: those applied on the job's worst link (0 where nothing applied
  them), asked in ``link_delay_asked_ms``. ``link_duplicated_pct`` and ``link_reordered_pct``:
  the shares of the job's host links' frames that the ports sent twice, and that left behind a
  later frame (as measured when they left; None where no port counted). A link's
  ``bw_schedule``: a line per rate change applied, with its time and tc's rate afterwards.

Workloads (demos/workloads.py), per job and in the row: ``arrival_s`` (seconds after time zero,
when the jobs without a ``start`` began training), ``jct_s`` (job completion time: from its
arrival to its last rank's last step, so a job that waited for a grant pays the wait),
``steps_per_s`` and ``grad_bytes_per_s`` (its gradient bytes per step times steps, over rank
0's training time). Across the jobs, Jain's fairness index (sum x)^2 / (n sum x^2) of their
gradient bytes per second (each job's share of the aggregation service) and of their steps per
second; 1 is equal shares, 1/n one job taking all. Records of runs before workloads (no
``workload`` in their reports) have none of these.

``write_summary`` saves the printed text as ``summary.txt`` and the same figures as
``summary.json`` (``{"jobs": [...], "switches": {...}, "fairness": {...}}``; ``links``: how the
links' impairments were applied, the ports' counts and the bandwidth changes, when there were
any; a failed run's has ``failed``).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from inagg.bmv2_env.emulation.impairments import Impairments, asked_ms, bw_lines, measured_pct, port_lines
from inagg.bmv2_env.emulation.topology import Topology

HEADER = (f"{'job':<12} {'mode':<12} {'grants':>6} {'slots, epoch':<14} {'MB sent/worker':>14} "
          f"{'retx/worker':>11} {'link loss %':>11} {'accuracy':>8} {'ms/step':>8} {'ms/call':>8}")
SWITCHES_NOTE = ("per switch (a tree's levels: below its root a completed round's sum is sent up, at the "
                 "root and on one switch multicast down)")


def job_record(job: dict, time_zero: float | None = None) -> dict:
    """What the summary needs of a job the launcher ran, JSON-ready: its topology entry
    (``spec``), options (``cfg``), ranks started, epochs' (loss, accuracy), each rank's final
    report (``done``: rank -> stats, seconds, steps, params_sha256: rank 0's
    ``train_demo.params_digest``, None on the other ranks; workload: gradient bytes per step and
    the wall-clock start and end of its training), and the run's ``time_zero`` and the job's
    ``arrival`` (wall clock; None when it never arrived)."""
    return {"spec": job["spec"], "cfg": job["cfg"], "ranks": len(job["procs"]), "epochs": job["epochs"],
            "done": {str(rank): report for rank, report in job["done"].items()},
            "time_zero": time_zero, "arrival": job.get("arrival")}


def workload_figures(record: dict) -> dict:
    """A finished job's arrival, completion time and throughput (see the module's docstring);
    {} for records without workload reports."""
    done = [record["done"][r] for r in sorted(record["done"], key=int)]
    if not done or "workload" not in done[0] or record.get("arrival") is None:
        return {}
    w0, seconds, steps = done[0]["workload"], done[0]["seconds"], done[0]["steps"]
    finished = max(d["workload"]["finished"] for d in done)
    spec = record["spec"]
    return {"workload": "profile" if "profile" in spec else spec.get("model", "mlp"),
            "arrival_s": record["arrival"] - record["time_zero"], "jct_s": finished - record["arrival"],
            "grad_bytes_per_step": w0["grad_bytes"], "train_steps": steps,
            "steps_per_s": steps / seconds if seconds else 0.0,
            "grad_bytes_per_s": w0["grad_bytes"] * steps / seconds if seconds else 0.0}


def jain(values: list[float]) -> float | None:
    """Jain's fairness index of ``values``; None for no values or all zero."""
    total, squares = sum(values), sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else None


def fairness(rows: list[dict]) -> dict:
    """Jain's index across the finished jobs with workload figures, of their gradient bytes/s
    and of their steps/s."""
    jobs = [r for r in rows if r.get("ok") and "jct_s" in r]
    return {"jobs": len(jobs), "jain_grad_bytes_per_s": jain([r["grad_bytes_per_s"] for r in jobs]),
            "jain_steps_per_s": jain([r["steps_per_s"] for r in jobs])}


def workload_lines(rows: list[dict]) -> list[str]:
    """The summary's workload table (arrival, JCT, throughput per job) and fairness line."""
    jobs = [r for r in rows if r.get("ok") and "jct_s" in r]
    if not jobs:
        return []
    lines = [f"{'job':<12} {'workload':<12} {'arrival s':>9} {'JCT s':>8} {'steps':>6} {'steps/s':>8} "
             f"{'grad MB/s':>10}"]
    lines += [f"{r['name']:<12} {r['workload']:<12} {r['arrival_s']:>9.1f} {r['jct_s']:>8.1f} {r['train_steps']:>6} "
              f"{r['steps_per_s']:>8.2f} {r['grad_bytes_per_s'] / 1e6:>10.3f}" for r in jobs]
    f = fairness(rows)
    text = {k: "n/a" if f[k] is None else f"{f[k]:.3f}" for k in ("jain_grad_bytes_per_s", "jain_steps_per_s")}
    return lines + [f"Jain's fairness index over {f['jobs']} job(s): {text['jain_grad_bytes_per_s']} of gradient "
                    f"bytes/s, {text['jain_steps_per_s']} of steps/s"]


def placement(grants: list[dict], listed: str = "") -> str:
    """Where the job aggregates now, in words: its latest grant's reason (a tree, or why the
    host aggregator), else its mode and aggregator; ``listed`` (the controller's listing at
    placement) when the job used no grant."""
    if not grants:
        return listed
    latest = grants[-1]
    return latest["reason"] or f"{latest['mode']} {latest['aggregator']}"


def job_row(topo: Topology, record: dict, listed: str = "", applied: Impairments | None = None) -> dict:
    """A finished job's row, from every rank's stats (rank 0's grants and call times; the
    traffic of the switch's workers: on a host that reduces first, its leader's); ``applied``:
    how the links' options were applied (None: all as asked)."""
    done = {int(r): v for r, v in record["done"].items()}
    asked_loss = max(topo.link_loss(h) for h in record["spec"]["workers"])
    stats = [done[r]["stats"] for r in sorted(done)]
    workers = [s for s in stats if s.get("leader", True)]
    s0 = stats[0]
    retx = sum(s["retransmissions"] for s in workers)
    hosts = record["spec"]["workers"]
    is_applied = {k: applied is None or k in applied.applied for k in ("loss", "delay", "jitter")}
    asked_delay, asked_jitter = asked_ms(topo, hosts), asked_ms(topo, hosts, "jitter")
    measured = {k: measured_pct(topo, hosts, applied.port_stats, k) if applied else None
                for k in ("dropped", "duplicated", "reordered")}
    return {"name": record["spec"]["name"], "ok": True, "mode": s0["mode"], "transport": s0["transport"],
            "grants_used": len(s0["grants"]), "grant_changes": s0["grant_changes"],
            "steps": [done[r]["steps"] for r in sorted(done)], "epoch": s0["epoch"], "slots": s0["slots"],
            "epochs": record["cfg"].get("epochs"),   # None: iterations or a duration
            "accuracy": None if "profile" in record["spec"] else record["epochs"][-1][1],   # a profile learns nothing
            "host_results": s0["host_results"], "switch_results": s0["packets_received"] - s0["host_results"],
            "mb_sent": sum(s["wire_bytes_sent"] for s in workers) / len(workers) / 1e6,
            "retransmissions": retx, "retx_per_worker": retx / len(workers), "switch_workers": len(workers),
            "packets_sent": sum(s["packets_sent"] for s in workers),
            "spurious": sum(s["spurious_retransmissions"] for s in workers),
            "link_loss_pct": asked_loss if is_applied["loss"] else 0, "link_loss_asked_pct": asked_loss,
            "link_loss_measured_pct": measured["dropped"],
            "link_delay_ms": asked_delay if is_applied["delay"] else 0, "link_delay_asked_ms": asked_delay,
            "link_jitter_ms": asked_jitter if is_applied["jitter"] else 0,
            "link_duplicated_pct": measured["duplicated"], "link_reordered_pct": measured["reordered"],
            "placement": placement(s0["grants"], listed), "losses": [e[0] for e in record["epochs"]],
            "params_sha256": done[0].get("params_sha256"),
            "ms_per_step": done[0]["seconds"] / done[0]["steps"] * 1e3,
            "call_ms_median": s0["call_ms_median"], "grants": s0["grants"], **workload_figures(record)}


def aggregator_of(topo: Topology, grant: dict) -> str:
    """The switch (by its name in the topology) or host aggregator ``grant`` aggregates on."""
    if grant["mode"] == "host":
        return f"the host aggregator ({grant['aggregator']})"
    ip = grant["aggregator"].split(":")[0]
    return next((f"switch {name}" for name, sw in topo.switches.items() if sw["aggregator_ip"] == ip),
                grant["aggregator"])


def grant_change(topo: Topology, before: dict | None, grant: dict) -> str:
    """What taking ``grant`` after ``before`` (None: the job's first) was, and why, in words."""
    if before is None:
        what = "placed on"
    elif before["mode"] == grant["mode"]:
        what = "slots changed on"
    else:
        what = "fell back to" if grant["mode"] == "host" else "upgraded to"
    return f"{what} {aggregator_of(topo, grant)}" + (f": {grant['reason']}" if grant["reason"] else "")


def story_lines(topo: Topology, grants: list[dict]) -> list[str]:
    """One line per grant the job used: when (seconds after its first grant, first call),
    what changed and why, and the median time of the calls made under it."""
    lines = []
    for i, g in enumerate(grants):
        median = f"median {g['median_ms']:.2f} ms" if g["median_ms"] is not None else "no call timed"
        lines.append(f"{'':<12} {'story:' if i == 0 else '':<6} +{g['seconds']:.1f}s call {g['from_call']}: "
                     f"{grant_change(topo, grants[i - 1] if i else None, g)}; slots {g['slots']} "
                     f"epoch {g['epoch']}; {g['calls']} calls, {median}")
    return lines


def job_lines(topo: Topology, row: dict) -> list[str]:
    """A finished job's lines: its figures, where its results came from, where it is placed,
    its story."""
    via = row["mode"] + ("/RoCE" if row["transport"] == "roce" else "")
    accuracy = "-" if row["accuracy"] is None else f"{100 * row['accuracy']:.1f}%"
    ranks = len(row["steps"])
    return [f"{row['name']:<12} {via:<12} {row['grants_used']:>6} {row['slots'] + ' e' + str(row['epoch']):<14} "
            f"{row['mb_sent']:>14.2f} {row['retx_per_worker']:>11.1f} {row['link_loss_pct']:>11} "
            f"{accuracy:>8} {row['ms_per_step']:>8.1f} {row['call_ms_median'] or 0:>8.2f}",
            f"{'':<12} results: {row['switch_results']} from the switch, {row['host_results']} from the host "
            f"aggregator",
            f"{'':<12} placed: {row['placement']}; {row['switch_workers']} worker(s) of the switch"
            + (f" for {ranks} ranks (each host reduces first)" if row["switch_workers"] < ranks else ""),
            *story_lines(topo, row["grants"])]


def impairment_lines(applied: Impairments | None) -> list[str]:
    """What the summary says of the links' options: those not applied, each switch port's
    counts where the ports applied them, and the bandwidth changes applied."""
    if applied is None:
        return []
    lines = []
    if applied.not_applied:
        lines.append(f"link {'/'.join(applied.not_applied)} of the topology NOT applied (this kernel has no netem "
                     "qdisc): link loss % is what was applied")
    if applied.by == "soft switch ports":
        lines.append(f"link {'/'.join(applied.applied)} applied by the software data plane's ports: measured below")
    return lines + port_lines(applied.port_stats) + bw_lines(applied.bw_changes)


def summary(topo: Topology, records: list[dict], counters: dict, logs: Path,
            listed: dict[str, str] | None = None, applied: Impairments | None = None
            ) -> tuple[list[str], list[dict]]:
    """The summary's lines and each job's row (``{"name", "ok": False}`` for a job some rank
    of which did not report); ``listed``: each job's placement as the controller listed it;
    ``applied``: how the links' options were applied (None: all as asked)."""
    lines, rows = ["", "per-job summary", HEADER], []
    for record in records:
        name = record["spec"]["name"]
        if len(record["done"]) != record["ranks"] or not record["epochs"]:
            rows.append({"name": name, "ok": False})
            lines.append(f"{name:<12} FAILED: see {logs}/{name}-*.log")
            continue
        rows.append(job_row(topo, record, (listed or {}).get(name, ""), applied))
        lines += job_lines(topo, rows[-1])
    lines += workload_lines(rows)
    lines += impairment_lines(applied)
    lines.append(SWITCHES_NOTE)
    lines += [f"switch {name}: {c['job_aggregated']} contributions aggregated, {c['job_results']} rounds completed"
              + (f", {c['job_collisions']} ATP collisions" if c.get("job_collisions") else "")
              for name, c in counters.items()]
    return lines, rows


def write_summary(run_path: Path, lines: list[str], rows: list[dict], counters: dict,
                  failed: str | None = None, applied: Impairments | None = None) -> None:
    """``summary.txt`` (the printed lines) and ``summary.json`` (the same figures: each job's
    row, each switch's counters, the links' impairments as applied and counted when there were
    any, and why the run failed when it did) in the run directory."""
    (run_path / "summary.txt").write_text("\n".join(lines).lstrip("\n") + "\n")
    links = {"links": asdict(applied)} if applied is not None and (applied.by != "none" or applied.bw_changes) else {}
    data = {"jobs": rows, "switches": counters, "fairness": fairness(rows), **links,
            **({"failed": failed} if failed else {})}
    (run_path / "summary.json").write_text(json.dumps(data, indent=2) + "\n")
