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
* ``link loss %``: the loss applied on the job's worst link, never only asked: where the kernel
  has no netem qdisc, the topology's loss is not applied, the column says 0 and a line says so
  (the row keeps what was asked in ``link_loss_asked_pct``).

``write_summary`` saves the printed text as ``summary.txt`` and the same figures as
``summary.json`` (``{"jobs": [...], "switches": {...}}``; a failed run's has ``failed``).
"""

from __future__ import annotations

import json
from pathlib import Path

from inagg.bmv2_env.emulation.topology import Topology

HEADER = (f"{'job':<12} {'mode':<12} {'grants':>6} {'slots, epoch':<14} {'MB sent/worker':>14} "
          f"{'retx/worker':>11} {'link loss %':>11} {'accuracy':>8} {'ms/step':>8} {'ms/call':>8}")
SWITCHES_NOTE = ("per switch (a tree's levels: below its root a completed round's sum is sent up, at the "
                 "root and on one switch multicast down)")


def job_record(job: dict) -> dict:
    """What the summary needs of a job the launcher ran, JSON-ready: its topology entry
    (``spec``), options (``cfg``), ranks started, epochs' (loss, accuracy) and each rank's
    final report (``done``: rank -> stats, seconds, steps, params_sha256: rank 0's
    ``train_demo.params_digest``, None on the other ranks)."""
    return {"spec": job["spec"], "cfg": job["cfg"], "ranks": len(job["procs"]), "epochs": job["epochs"],
            "done": {str(rank): report for rank, report in job["done"].items()}}


def placement(grants: list[dict], listed: str = "") -> str:
    """Where the job aggregates now, in words: its latest grant's reason (a tree, or why the
    host aggregator), else its mode and aggregator; ``listed`` (the controller's listing at
    placement) when the job used no grant."""
    if not grants:
        return listed
    latest = grants[-1]
    return latest["reason"] or f"{latest['mode']} {latest['aggregator']}"


def job_row(topo: Topology, record: dict, listed: str = "", netem: bool = True) -> dict:
    """A finished job's row, from every rank's stats (rank 0's grants and call times; the
    traffic of the switch's workers: on a host that reduces first, its leader's); ``netem``:
    whether the links' loss was applied."""
    done = {int(r): v for r, v in record["done"].items()}
    asked_loss = max(topo.link_loss(h) for h in record["spec"]["workers"])
    stats = [done[r]["stats"] for r in sorted(done)]
    workers = [s for s in stats if s.get("leader", True)]
    s0 = stats[0]
    retx = sum(s["retransmissions"] for s in workers)
    return {"name": record["spec"]["name"], "ok": True, "mode": s0["mode"], "transport": s0["transport"],
            "grants_used": len(s0["grants"]), "grant_changes": s0["grant_changes"],
            "steps": [done[r]["steps"] for r in sorted(done)], "epoch": s0["epoch"], "slots": s0["slots"],
            "epochs": record["cfg"]["epochs"], "accuracy": record["epochs"][-1][1],
            "host_results": s0["host_results"], "switch_results": s0["packets_received"] - s0["host_results"],
            "mb_sent": sum(s["wire_bytes_sent"] for s in workers) / len(workers) / 1e6,
            "retransmissions": retx, "retx_per_worker": retx / len(workers), "switch_workers": len(workers),
            "packets_sent": sum(s["packets_sent"] for s in workers),
            "spurious": sum(s["spurious_retransmissions"] for s in workers),
            "link_loss_pct": asked_loss if netem else 0, "link_loss_asked_pct": asked_loss,
            "placement": placement(s0["grants"], listed), "losses": [e[0] for e in record["epochs"]],
            "params_sha256": done[0].get("params_sha256"),
            "ms_per_step": done[0]["seconds"] / done[0]["steps"] * 1e3,
            "call_ms_median": s0["call_ms_median"], "grants": s0["grants"]}


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
    ranks = len(row["steps"])
    return [f"{row['name']:<12} {via:<12} {row['grants_used']:>6} {row['slots'] + ' e' + str(row['epoch']):<14} "
            f"{row['mb_sent']:>14.2f} {row['retx_per_worker']:>11.1f} {row['link_loss_pct']:>11} "
            f"{100 * row['accuracy']:>7.1f}% {row['ms_per_step']:>8.1f} {row['call_ms_median'] or 0:>8.2f}",
            f"{'':<12} results: {row['switch_results']} from the switch, {row['host_results']} from the host "
            f"aggregator",
            f"{'':<12} placed: {row['placement']}; {row['switch_workers']} worker(s) of the switch"
            + (f" for {ranks} ranks (each host reduces first)" if row["switch_workers"] < ranks else ""),
            *story_lines(topo, row["grants"])]


def summary(topo: Topology, records: list[dict], counters: dict, logs: Path,
            listed: dict[str, str] | None = None, netem: bool = True) -> tuple[list[str], list[dict]]:
    """The summary's lines and each job's row (``{"name", "ok": False}`` for a job some rank
    of which did not report); ``listed``: each job's placement as the controller listed it;
    ``netem``: whether the links' netem options (delay, loss, jitter) were applied."""
    lines, rows = ["", "per-job summary", HEADER], []
    for record in records:
        name = record["spec"]["name"]
        if len(record["done"]) != record["ranks"] or not record["epochs"]:
            rows.append({"name": name, "ok": False})
            lines.append(f"{name:<12} FAILED: see {logs}/{name}-*.log")
            continue
        rows.append(job_row(topo, record, (listed or {}).get(name, ""), netem))
        lines += job_lines(topo, rows[-1])
    if not netem:
        lines.append("link delay/loss/jitter of the topology NOT applied (this kernel has no netem qdisc): "
                     "link loss % is what was applied")
    lines.append(SWITCHES_NOTE)
    lines += [f"switch {name}: {c['job_aggregated']} contributions aggregated, {c['job_results']} rounds completed"
              for name, c in counters.items()]
    return lines, rows


def write_summary(run_path: Path, lines: list[str], rows: list[dict], counters: dict,
                  failed: str | None = None) -> None:
    """``summary.txt`` (the printed lines) and ``summary.json`` (the same figures: each job's
    row, each switch's counters, and why the run failed when it did) in the run directory."""
    (run_path / "summary.txt").write_text("\n".join(lines).lstrip("\n") + "\n")
    data = {"jobs": rows, "switches": counters, **({"failed": failed} if failed else {})}
    (run_path / "summary.json").write_text(json.dumps(data, indent=2) + "\n")
