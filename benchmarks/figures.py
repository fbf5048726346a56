"""What the papers' figures share (``make fig-workers``, ``fig-loss``, ``fig-tenants``,
``fig-tree``: ``fig_*.py`` beside this file): where they go, the machine's load, the spread of
the repetitions, the CSV, the PNG and the record of how they were made.

A figure goes to ``docs/results/<UTC date>-figs/`` (``--out``): ``<name>.csv`` (one row per
point: each series' median, min and max over the repetitions, the load and whether the machine
was quiet), ``<name>.png`` (medians with min-max bars) and ``<name>.txt`` (the exact command,
the commit, the start and end, every load sample, the cores). A figure is quiet when the
machine's 1-minute load average stayed at or under ``--max-load`` at every sample (at the
start, after each network or run the figure brings up, at the end). At the start a loaded machine is refused (exit 3) unless
``--loaded mark``, which runs anyway; either way a figure whose load rose above the threshold
is marked "not quiet" in its title, its CSV and its record: a figure never looks quiet when it
was not.
"""

from __future__ import annotations

import argparse

import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from emulation_ranks import ROOT, launcher_can_run, write_csv
from plots import pyplot

DEFAULT_MAX_LOAD = 1.0      # the 1-minute load a machine running nothing but the figure stays under
REFUSED = 3                 # the exit status of a figure refused for the machine's load


class Loaded(Exception):
    """The machine was not quiet when the figure should start."""


def default_out() -> Path:
    """Today's (UTC) figures folder under docs/results."""
    return ROOT / "docs" / "results" / f"{datetime.now(timezone.utc):%Y-%m-%d}-figs"


def _at_least_one(text: str) -> int:
    """``--reps``: a whole number of repetitions, at least one (argparse names the flag)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: a figure needs at least 1 repetition")
    return value


def add_figure_arguments(parser, reps: int) -> None:
    """The flags every figure takes: repetitions, the load threshold and what to do above it,
    and where the files go."""
    parser.add_argument("--reps", type=_at_least_one, default=reps, help="repetitions of every point (the spread: min-max)")
    parser.add_argument("--max-load", type=float, default=DEFAULT_MAX_LOAD, metavar="L",
                        help="the 1-minute load average a quiet machine stays under (default %(default)s)")
    parser.add_argument("--loaded", choices=("refuse", "mark"), default="refuse",
                        help="above --max-load at the start: refuse to run (default) or run and mark the figure "
                             "'not quiet'")
    parser.add_argument("--out", type=Path, default=default_out(), help="the figure's folder (default %(default)s)")


@dataclass
class LoadWatch:
    """The load average sampled through a figure's run, against its threshold."""

    threshold: float
    samples: list[tuple[str, float]] = field(default_factory=list)

    def sample(self, when: str) -> float:
        """Record the 1-minute load average now, labelled ``when``; returns it."""
        load = os.getloadavg()[0]
        self.samples.append((when, round(load, 2)))
        return load

    @property
    def quiet(self) -> bool:
        return all(load <= self.threshold for _, load in self.samples)

    @property
    def peak(self) -> float:
        return max(load for _, load in self.samples)

    def label(self) -> str:
        """The figure title's note: empty when quiet."""
        return "" if self.quiet else f"\n[not quiet: load {self.peak:.1f} > {self.threshold:g}]"


def start_watch(args) -> LoadWatch:
    """The first sample; Loaded when it is above the threshold and the figure must refuse."""
    watch = LoadWatch(args.max_load)
    load = watch.sample("start")
    if load > args.max_load and args.loaded == "refuse":
        raise Loaded(f"the machine's 1-minute load average is {load:.2f}, above --max-load {args.max_load:g}: "
                     f"wait for a quiet machine, or run with --loaded mark (the figure is then marked "
                     f"'not quiet')")
    return watch


def spread(values: list[float], prefix: str) -> dict:
    """``<prefix>_median``, ``_min`` and ``_max`` of ``values`` (seconds, rounded to 0.1 ms for
    times, 4 digits otherwise); all None for no values."""
    if not values:
        return {f"{prefix}_{k}": None for k in ("median", "min", "max")}
    return {f"{prefix}_median": round(statistics.median(values), 4), f"{prefix}_min": round(min(values), 4),
            f"{prefix}_max": round(max(values), 4)}


def spread_fields(*prefixes: str) -> tuple[str, ...]:
    """The CSV columns ``spread`` writes for each prefix."""
    return tuple(f"{p}_{k}" for p in prefixes for k in ("median", "min", "max"))


LOAD_FIELDS = ("reps", "load1_peak", "max_load", "quiet")


def load_columns(watch: LoadWatch, reps: int) -> dict:
    """The columns every figure's rows end with."""
    return {"reps": reps, "load1_peak": watch.peak, "max_load": watch.threshold, "quiet": watch.quiet}


def errorbars(ax, xs: list, rows: list[dict], prefix: str, label: str, style: str = "o-") -> None:
    """Medians of ``prefix`` over ``xs`` with min-max bars."""
    med = [r[f"{prefix}_median"] for r in rows]
    low = [m - r[f"{prefix}_min"] for m, r in zip(med, rows)]
    high = [r[f"{prefix}_max"] - m for m, r in zip(med, rows)]
    ax.errorbar(xs, med, yerr=[low, high], fmt=style, capsize=3, markersize=4, label=label)


def save_plot(fig, path: Path, title: str, watch: LoadWatch) -> None:
    """The figure under its title (marked when not quiet), saved as PNG, then closed."""
    fig.suptitle(title + watch.label(), fontsize=9, color="black" if watch.quiet else "red")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    pyplot().close(fig)


def time_panels(plt, rows: list[dict], key: str, draw, path: Path, what: str, watch: LoadWatch) -> None:
    """One panel per tensor size (``bytes``), its rows in the order of ``key`` (the x axis):
    both paths' medians with min-max bars and the framing limit dashed, then ``draw(ax, xs,
    rows)`` adds the figure's own lines and labels; saved as "time vs ``what``"."""
    sizes = sorted({r["bytes"] for r in rows})
    fig, axes = plt.subplots(1, len(sizes), figsize=(4.2 * len(sizes), 3.8), squeeze=False)
    for ax, nbytes in zip(axes[0], sizes):
        mine = sorted((r for r in rows if r["bytes"] == nbytes), key=lambda r: r[key])
        xs = [r[key] for r in mine]
        errorbars(ax, xs, mine, "inagg_s", "inagg (switch)")
        errorbars(ax, xs, mine, "gloo_s", "gloo ring", "s-")
        ax.plot(xs, [r["framing_limit_s"] for r in mine], "k--", label="framing limit")
        draw(ax, xs, mine)
        ax.set_ylim(bottom=0)
    axes[0][0].set_ylabel(f"allreduce time (s), links {rows[0]['rate']}")
    axes[0][0].legend(fontsize=7)
    save_plot(fig, path, f"time vs {what}: median, min-max of {rows[0]['reps']} repetitions", watch)


def commit() -> str:
    """The checkout's commit (with ``+dirty`` for uncommitted changes to anything but
    docs/results, where figures go), or ``unknown``."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/results") else "")


def write_record(path: Path, watch: LoadWatch, started: float, made_at: str) -> None:
    """How the figure was made: the command, the commit (``made_at``, read before the figure's
    own files changed the checkout), when, the load samples, the cores."""
    stamp = lambda t: datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")  # noqa: E731
    lines = [f"command: {shlex.join([sys.executable, *sys.argv])}", f"make: {os.environ.get('FIG_MAKE', '-')}",
             f"commit: {made_at}", f"started: {stamp(started)}", f"ended: {stamp(time.time())}",
             f"cores: {os.cpu_count()}", f"max load: {watch.threshold:g}",
             f"quiet: {'yes' if watch.quiet else 'NO (peak 1-minute load %.2f)' % watch.peak}",
             "load samples (1-minute load average): " + ", ".join(f"{w} {v:.2f}" for w, v in watch.samples)]
    path.write_text("\n".join(lines) + "\n")


def figure_main(name: str, args, measure, fields: tuple[str, ...], plot) -> int:
    """A figure's launcher: refuse a loaded machine (``--loaded``), ``measure(args, watch)``'s
    rows (the emulation's: root and Mininet), then the CSV, the PNG (``plot(rows, path,
    watch)``) and the record under ``--out``."""
    if not launcher_can_run(name):
        return 2
    started, made_at = time.time(), commit()
    try:
        watch = start_watch(args)
    except Loaded as e:
        print(f"{name}: {e}", file=sys.stderr)
        return REFUSED
    rows = measure(args, watch)
    watch.sample("end")
    rows = [{**r, **load_columns(watch, args.reps)} for r in rows]
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / f"{name}.csv", fields + LOAD_FIELDS, rows)
    plt = pyplot()
    if plt is not None:
        plot(plt, rows, args.out / f"{name}.png", watch)
    write_record(args.out / f"{name}.txt", watch, started, made_at)
    print(f"{name}: {len(rows)} rows in {args.out / name}.csv, plot and record beside it; "
          f"{'quiet' if watch.quiet else 'NOT QUIET'} (peak load {watch.peak:.2f}, threshold {watch.threshold:g})")
    return 0
