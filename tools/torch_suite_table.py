"""The outcome table of torch's distributed test suite (tests/torch_dist_suite.py) on gloo and on
inagg: each test's outcome and seconds on each backend, from the JUnit XML files of the runs
(pytest ``--junitxml``; docs/results/torch_suite/README.md has the commands)::

    python -m tools.torch_suite_table --gloo GLOO.xml --inagg INAGG.xml [--inagg-rerun RERUN.xml ...] \\
        --out docs/results/torch_suite/outcomes.csv

A test a run did not reach is ``NOT RUN``. ``--inagg-rerun``: later runs of some tests on inagg
(after a fix) whose outcomes replace the first run's; the ``inagg_run`` column says which run
each inagg outcome is from. tests/test_torch_suite.py reads the table (``read_table``).
"""

from __future__ import annotations

import argparse
import csv
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

OUTCOMES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "NOT RUN")
COLUMNS = ("test", "gloo", "gloo_seconds", "inagg", "inagg_seconds", "inagg_run")
_MARKS = {"failure": "FAILED", "error": "ERROR", "skipped": "SKIPPED"}


def junit_outcomes(path: Path) -> dict[str, tuple[str, float]]:
    """Each test of a JUnit XML file: (outcome, seconds)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        raise SystemExit(f"cannot read the JUnit XML {path}: {e}") from None
    found = {}
    for case in root.iter("testcase"):
        marks = [_MARKS[child.tag] for child in case if child.tag in _MARKS]
        found[case.get("name")] = (marks[0] if marks else "PASSED", float(case.get("time", "0")))
    if not found:
        raise SystemExit(f"{path} holds no test cases: is it pytest's --junitxml output?")
    return found


def table(gloo: dict, inagg: dict, reruns: list[tuple[str, dict]]) -> list[dict]:
    """One row per test of either run, in name order."""
    inagg_run = {name: "full" for name in inagg}
    inagg = dict(inagg)
    for label, rerun in reruns:
        inagg.update(rerun)
        inagg_run.update({name: label for name in rerun})
    rows = []
    for name in sorted(set(gloo) | set(inagg)):
        g, i = gloo.get(name, ("NOT RUN", 0.0)), inagg.get(name, ("NOT RUN", 0.0))
        rows.append({"test": name, "gloo": g[0], "gloo_seconds": f"{g[1]:.1f}", "inagg": i[0],
                     "inagg_seconds": f"{i[1]:.1f}", "inagg_run": inagg_run.get(name, "")})
    return rows


def read_table(path: Path) -> list[dict]:
    """The rows of a table this module wrote."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        if row["gloo"] not in OUTCOMES or row["inagg"] not in OUTCOMES:
            raise ValueError(f"{path}: {row['test']} has outcomes {row['gloo']!r}/{row['inagg']!r}, "
                             f"not among {OUTCOMES}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gloo", type=Path, required=True, help="JUnit XML of the run on gloo")
    parser.add_argument("--inagg", type=Path, required=True, help="JUnit XML of the run on inagg")
    parser.add_argument("--inagg-rerun", type=Path, nargs="*", default=[],
                        help="JUnit XML of later runs of some tests on inagg (their outcomes win)")
    parser.add_argument("--out", type=Path, required=True, help="the CSV to write")
    args = parser.parse_args(argv)
    reruns = [(f"rerun {n + 1}", junit_outcomes(p)) for n, p in enumerate(args.inagg_rerun)]
    rows = table(junit_outcomes(args.gloo), junit_outcomes(args.inagg), reruns)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print(f"{args.out}: {len(rows)} tests", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
