"""SwitchML's figure: allreduce time against the number of workers (2, 4, 8), inagg through the
switch against gloo's ring, on the emulation with every host link shaped (``make fig-workers``).

The measurement is ``wire_bench.py``'s (its network, its rank processes, its calls): one job per
worker count, each rank holding both groups, ``--reps`` calls on each per size, the order of the
two alternating from one repetition to the next, every sum checked, a call's time its slowest
rank's. This script only asks it for the figure's points (no auto group, no two-jobs case) and
turns each (N, size) into the median and min-max of either path and of the repetitions'
inagg / gloo ratios, beside the framing limit (inagg's floor) and the ring's ideal time.
``figures.py`` checks the load and writes the CSV, PNG and record.

    sudo .venv/bin/python benchmarks/fig_workers.py [--workers 2 4 8] [--sizes-mib 4 16] [--reps 5]
        [--rate 100mbit] [--max-load 1.0] [--loaded refuse|mark] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

import wire_bench  # noqa: E402 - benchmarks/, the script's own folder
from figures import add_figure_arguments, figure_main, spread, spread_fields, time_panels  # noqa: E402

NAME = "fig_workers"
FIELDS = ("rate", "mtu", "k", "workers", "bytes", *spread_fields("inagg_s", "gloo_s", "ratio"),
          "framing_limit_s", "ring_ideal_s", "retransmissions")


def wire_args(args: argparse.Namespace) -> argparse.Namespace:
    """wire_bench's options for the figure's points."""
    return wire_bench.parse_args(["--workers", *map(str, args.workers), "--sizes-mib", *map(str, args.sizes_mib),
                                  "--reps", str(args.reps), "--rate", args.rate, "--mtu", str(args.mtu),
                                  "--two-jobs", "0", "--no-auto", "--warmup", "0"])


def point(result: dict, nbytes: int, wargs: argparse.Namespace) -> dict:
    """One (N, size): both paths' spread, the ratios', the floors."""
    calls = [c for c in result["calls"] if c[0] == nbytes]
    seconds = {p: {c[1]: c[3] for c in calls if c[2] == p} for p in wire_bench.PATHS}
    ratios = [seconds["inagg"][rep] / seconds["gloo"][rep] for rep in seconds["inagg"]]
    n = result["workers"]
    return {"rate": wargs.rate, "mtu": wargs.mtu, "k": result["k"], "workers": n, "bytes": nbytes,
            **spread(list(seconds["inagg"].values()), "inagg_s"), **spread(list(seconds["gloo"].values()), "gloo_s"),
            **spread(ratios, "ratio"),
            "framing_limit_s": round(wire_bench.framing_limit(nbytes, result["k"], wargs.rate), 4),
            "ring_ideal_s": round(wire_bench.gloo_ideal(nbytes, n, wargs.mtu, wargs.rate), 4),
            "retransmissions": result["retransmissions"]}


def measure(args: argparse.Namespace, watch) -> list[dict]:
    """wire_bench's experiment at the figure's points; one row per (N, size)."""
    wargs = wire_args(args)
    results = wire_bench.run_experiment(wargs)
    watch.sample("after the calls")
    return [point(result, nbytes, wargs) for result in results for nbytes in wargs.sizes]


def plot(plt, rows: list[dict], path: Path, watch) -> None:
    """Time vs N per size: both paths' medians with min-max bars, the floors dashed/dotted."""
    def draw(ax, ns: list, mine: list[dict]) -> None:
        ax.plot(ns, [r["ring_ideal_s"] for r in mine], "k:", label="ring ideal")
        ax.set_title(f"{mine[0]['bytes'] / wire_bench.MIB:g} MiB, K = {mine[0]['k']}", fontsize=9)
        ax.set_xlabel("workers")
        ax.set_xticks(ns)

    time_panels(plt, rows, "workers", draw, path, "workers", watch)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4, 8], help="worker counts, one job each")
    p.add_argument("--sizes-mib", type=float, nargs="+", default=[4, 16], help="tensor sizes (MiB)")
    p.add_argument("--rate", default="100mbit", help="every host link's rate (tc tbf)")
    p.add_argument("--mtu", type=int, default=1500, help="every link's MTU; K follows it")
    add_figure_arguments(p, reps=5)
    args = p.parse_args(argv)
    if min(args.workers) < 2:
        p.error("every --workers must be >= 2")
    return args


def main(argv: list[str] | None = None) -> int:
    return figure_main(NAME, parse_args(argv), measure, FIELDS, plot)


if __name__ == "__main__":
    sys.exit(main())
