"""SwitchML's figure: allreduce time against the links' loss rate (0, 0.01 %, 0.1 %, 1 %), inagg
through the switch against gloo's ring over the same lossy links (``make fig-loss``).

This kernel has no netem: the loss is the software data plane's own, dropped at the switch's
port of every host link in both directions (``inagg-soft-switch --loss``, seeded) and counted
there, so ``loss_pct`` is what the ports dropped, not what was asked. Per loss rate one
``wire_bench.py`` network (every host link shaped, ``--loss``) with one job of ``--workers``
ranks, each holding both groups: ``--reps`` calls on each per size, the two alternating in the
same processes, every sum checked (a lost frame is resent, never summed twice). Each (loss,
size) gives both paths' median and min-max, the repetitions' inagg / gloo ratios, inagg's
median over its loss-free one (``slowdown``), and the job's retransmissions. ``figures.py``
checks the load and writes the CSV, PNG and record.

    sudo .venv/bin/python benchmarks/fig_loss.py [--loss 0 0.01 0.1 1] [--workers 4] [--sizes-mib 4]
        [--reps 5] [--rate 100mbit] [--max-load 1.0] [--loaded refuse|mark] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))

import wire_bench  # noqa: E402 - benchmarks/, the script's own folder
from fig_workers import point  # noqa: E402
from figures import add_figure_arguments, figure_main, spread_fields, time_panels  # noqa: E402

NAME = "fig_loss"
FIELDS = ("loss_asked_pct", "loss_pct", "rate", "mtu", "k", "workers", "bytes",
          *spread_fields("inagg_s", "gloo_s", "ratio"), "slowdown", "framing_limit_s", "ring_ideal_s", "retransmissions")


def wire_args(args: argparse.Namespace, loss: float) -> argparse.Namespace:
    """wire_bench's options for one loss rate's network."""
    return wire_bench.parse_args(["--workers", str(args.workers), "--sizes-mib", *map(str, args.sizes_mib),
                                  "--reps", str(args.reps), "--rate", args.rate, "--two-jobs", "0", "--no-auto",
                                  "--warmup", "0", "--loss", str(loss)])


def measure(args: argparse.Namespace, watch) -> list[dict]:
    """One network per loss rate, in order; one row per (loss, size), with the slowdown."""
    rows = []
    for loss in args.loss:
        wargs = wire_args(args, loss)
        [result] = wire_bench.run_experiment(wargs)
        watch.sample(f"after loss {loss:g} %")
        rows += [{"loss_asked_pct": loss, "loss_pct": result["loss_pct"], **point(result, nbytes, wargs)}
                 for nbytes in wargs.sizes]
    clean = {r["bytes"]: r["inagg_s_median"] for r in rows if r["loss_asked_pct"] == 0}
    return [{**r, "slowdown": round(r["inagg_s_median"] / clean[r["bytes"]], 3) if r["bytes"] in clean else None}
            for r in rows]


def plot(plt, rows: list[dict], path: Path, watch) -> None:
    """Time vs loss rate per size (symlog x: 0 is a point), both paths with min-max bars."""
    def draw(ax, xs: list, mine: list[dict]) -> None:
        ax.set_xscale("symlog", linthresh=0.01)
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.set_xlabel("loss per link direction (%)")
        ax.set_title(f"{mine[0]['bytes'] / wire_bench.MIB:g} MiB, {mine[0]['workers']} workers", fontsize=9)

    time_panels(plt, rows, "loss_asked_pct", draw, path, "loss", watch)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--loss", type=float, nargs="+", default=[0, 0.01, 0.1, 1], metavar="PCT",
                   help="loss rates (percent of the frames per link direction), one network each")
    p.add_argument("--workers", type=int, default=4, help="ranks of the job")
    p.add_argument("--sizes-mib", type=float, nargs="+", default=[4], help="tensor sizes (MiB)")
    p.add_argument("--rate", default="100mbit", help="every host link's rate (tc tbf)")
    add_figure_arguments(p, reps=5)
    args = p.parse_args(argv)
    if args.workers < 2 or not all(0 <= x <= 100 for x in args.loss):
        p.error("--workers must be >= 2 and every --loss a percentage in 0..100")
    return args


def main(argv: list[str] | None = None) -> int:
    return figure_main(NAME, parse_args(argv), measure, FIELDS, plot)


if __name__ == "__main__":
    sys.exit(main())
