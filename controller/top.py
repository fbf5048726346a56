"""``inaggctl top``: a live table of the controller's jobs and their switch counters (with the
moves a job's stall reports made, and each recirculating switch pipe's passes lost).

Each refresh is one ``ListJobs`` call (the admin view: grants and the per-job counters the
controller reads from the switch); rates are the counter differences between two refreshes.
``--once`` prints one table of totals and exits, for scripts and tests.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from inagg.hostlib.jobservice.client import ControllerClient

CLEAR = "\x1b[H\x1b[2J"
RATE_COUNTERS = ("packets", "aggregated", "results")


def _grant_cell(j) -> str:
    if not j.HasField("active"):
        return "(joining)"
    a = j.active
    via = "/RoCE" if a.transport == "roce" else ""
    pending = f" -> {j.pending.mode} e{j.pending.epoch}" if j.HasField("pending") else ""
    return f"{a.mode}{via} [{a.slot_base},{a.slot_base + a.slot_count}) e{a.epoch}{pending}"


def recirculation_lines(listing) -> list[str]:
    """One line per switch pipe that recirculated: its passes sent, arrived and lost (what its
    recirculation ports dropped); none for a program that does not recirculate (BMv2's)."""
    return [f"switch {r.switch} pipe {r.pipe} recirculation: {r.sent} sent, {r.arrived} arrived, {r.lost} lost"
            for r in listing.recirculation]


def render(listing, previous: dict[int, dict[str, int]] | None, seconds: float) -> str:
    """The table for one ``JobList``; with a previous sample, counter rates per second too."""
    head = (f"{'job':>5} {'name':<14} {'ranks':>5}  {'grant':<34} {'packets':>10} {'aggregated':>10} "
            f"{'results':>9} {'drops':>7}")
    if previous is not None:
        head += "  " + " ".join(f"{c + '/s':>12}" for c in RATE_COUNTERS)
    lines = [f"inagg: {len(listing.jobs)} job(s), {listing.switch_slots} switch slots", head]
    for j in listing.jobs:
        c = dict(j.counters)
        drops = sum(n for k, n in c.items() if k.startswith("drop_"))
        line = (f"{j.job_id:>5} {j.name[:14]:<14} {j.joined:>2}/{j.n_workers:<2}  {_grant_cell(j):<34} "
                f"{c.get('packets', 0):>10} {c.get('aggregated', 0):>10} {c.get('results', 0):>9} {drops:>7}")
        if previous is not None:
            before = previous.get(j.job_id, {})
            line += "  " + " ".join(f"{(c.get(k, 0) - before.get(k, c.get(k, 0))) / seconds:>12.0f}"
                                    for k in RATE_COUNTERS)
        if j.stall_moves:
            line += f"  stall moves {j.stall_moves}"
        lines.append(line)
    return "\n".join(lines + recirculation_lines(listing))


def top(client: ControllerClient, admin_token: str, interval: float, once: bool,
        out: TextIO | None = None) -> None:
    """Print the table once, or refresh it every ``interval`` seconds until interrupted, to
    ``out`` (default: ``sys.stdout`` as of the call, so a redirection made after import holds)."""
    out = sys.stdout if out is None else out
    previous, then = None, time.monotonic()
    while True:
        listing = client.list_jobs(admin_token)
        now = time.monotonic()
        table = render(listing, previous, max(now - then, 1e-9))
        if once:
            print(table, file=out)
            return
        print(CLEAR + table + f"\n\nevery {interval:g} s; Ctrl-C to quit", file=out, flush=True)
        previous, then = {j.job_id: dict(j.counters) for j in listing.jobs}, now
        time.sleep(interval)
