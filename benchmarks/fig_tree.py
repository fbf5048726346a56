"""The tree figure: an 8-rank job's allreduce time on a two-level aggregation tree (2 ToRs x 4
under a spine) against one switch, at equal windows, every link shaped (``make fig-tree``).

The measurement is ``tree_bench.py``'s: both jobs in one network, taking turns call by call in
the same rank processes (the order alternating per repetition), every sum checked, the bits of
both compared. A tree's window is the controller's ``min_window`` on every level, fixed; a
one-switch job's grows from it under dynamic sharing, so the figure runs the controller with
``sharing = static`` (``controller/allocator.py``): the one-switch job keeps ``min_window``
too, and the run is refused when the two windows differ. Each (job, size) gives the median and
min-max of its calls and, for the tree, of the repetitions' tree / one-switch ratios.
``figures.py`` checks the load and writes the CSV, PNG and record.

    sudo .venv/bin/python benchmarks/fig_tree.py [--sizes-mib 4 16] [--reps 5] [--min-window 32]
        [--rate 100mbit] [--max-load 1.0] [--loaded refuse|mark] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

import tree_bench  # noqa: E402 - benchmarks/, the script's own folder
from figures import add_figure_arguments, figure_main, save_plot, spread, spread_fields  # noqa: E402
from wire_bench import MIB, framing_limit  # noqa: E402

NAME = "fig_tree"
FIELDS = ("job", "rate", "k", "window", "workers", "bytes", *spread_fields("seconds", "ratio"), "framing_limit_s",
          "retransmissions", "same_bits", "placement")


def tree_args(args: argparse.Namespace) -> argparse.Namespace:
    """tree_bench's options for the figure: static sharing, so both windows are min_window."""
    window = ["--min-window", str(args.min_window)] if args.min_window else []
    return tree_bench.parse_args(["--sizes-mib", *map(str, args.sizes_mib), "--reps", str(args.reps),
                                  "--rate", args.rate, "--sharing", "static", *window])


def check_windows(results: dict) -> None:
    """The comparison is at equal windows, or it is not this figure."""
    tree, flat = results["tree"]["window"], results["flat"]["window"]
    if tree != flat:
        raise RuntimeError(f"the windows differ (tree {tree}, one switch {flat} slots): the controller's static "
                           f"sharing should hold both at min_window; see the run's logs/controller.log")


def rows_of(results: dict, targs: argparse.Namespace) -> list[dict]:
    """One row per (job, size)."""
    plan, rows = tree_bench.turn_plan(targs), []
    same = results["tree"]["digest"] == results["flat"]["digest"]
    for job in tree_bench.JOBS:
        result = results[job]
        for nbytes in targs.sizes:
            mine = [i for i, (b, _) in enumerate(plan) if b == nbytes]
            ratios = [results["tree"]["seconds"][i] / results["flat"]["seconds"][i] for i in mine]
            rows.append({"job": job, "rate": targs.rate, "k": result["k"], "window": result["window"],
                         "workers": result["workers"], "bytes": nbytes,
                         **spread([result["seconds"][i] for i in mine], "seconds"),
                         **spread(ratios if job == "tree" else [], "ratio"),
                         "framing_limit_s": round(framing_limit(nbytes, result["k"], targs.rate), 4),
                         "retransmissions": sum(result["retransmissions"][i] for i in mine), "same_bits": same,
                         "placement": result["placement"]})
    return rows


def measure(args: argparse.Namespace, watch) -> list[dict]:
    """tree_bench's experiment under static sharing, checked for placement and windows."""
    targs = tree_args(args)
    results, _ = tree_bench.run_experiment(targs)
    watch.sample("after the calls")
    tree_bench.check_placement(results)
    check_windows(results)
    return rows_of(results, targs)


def plot(plt, rows: list[dict], path: Path, watch) -> None:
    """Per size: both jobs' medians as bars with min-max, the tree's ratio above its bar."""
    sizes = sorted({r["bytes"] for r in rows})
    by = {(r["job"], r["bytes"]): r for r in rows}
    fig, ax = plt.subplots(figsize=(max(4.2, 2.2 * len(sizes)), 3.8))
    xs = range(len(sizes))
    for offset, job, label in ((-0.2, "flat", "one switch"), (0.2, "tree", "2 ToRs x 4 + spine")):
        mine = [by[job, b] for b in sizes]
        med = [r["seconds_median"] for r in mine]
        ax.bar([x + offset for x in xs], med, 0.4, label=label,
               yerr=[[m - r["seconds_min"] for m, r in zip(med, mine)], [r["seconds_max"] - m for m, r in zip(med, mine)]],
               capsize=3)
    for x, b in zip(xs, sizes):
        tree = by["tree", b]
        ax.annotate(f"{tree['ratio_median']:.2f}x", (x + 0.2, tree["seconds_max"]), ha="center", va="bottom", fontsize=8)
    ax.plot(list(xs), [by["flat", b]["framing_limit_s"] for b in sizes], "k_", markersize=30, label="framing limit")
    ax.set_xticks(list(xs), [f"{b / MIB:g} MiB" for b in sizes])
    ax.set_ylabel(f"allreduce time (s), every link {rows[0]['rate']}")
    ax.set_ylim(0, 1.3 * max(r["seconds_max"] for r in rows))
    ax.legend(fontsize=7, loc="upper left")
    save_plot(fig, path, f"{rows[0]['workers']} ranks, window {rows[0]['window']} on both, K = {rows[0]['k']}\n"
              f"median, min-max of {rows[0]['reps']} repetitions", watch)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes-mib", type=float, nargs="+", default=[4, 16], help="tensor sizes (MiB)")
    p.add_argument("--min-window", type=int, help="both jobs' window (default: leaf_spine.json's min_window)")
    p.add_argument("--rate", default="100mbit", help="every link's rate (tc tbf)")
    add_figure_arguments(p, reps=5)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return figure_main(NAME, parse_args(argv), measure, FIELDS, plot)


if __name__ == "__main__":
    sys.exit(main())
