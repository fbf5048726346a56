"""P4Testgen's tests of the three inagg programs, generated with bounded, deterministic settings
and committed beside the P4 sources (``p4/testgen/<target>/``): the oracle every engine that
runs a program is replayed against (tests/test_testgen_replay.py).

Per target (``TARGETS``): the v1model program for BMv2, the TNA program for Tofino 1 and for
Tofino 2 (``-D__TARGET_TOFINO__``, which bf-p4c's driver defines and p4testgen does not). Every
run has a fixed seed (1; Tofino 2's is 3, where 1 and 2 abort), a test bound (unbounded
generation does not end in minutes on inagg), a
path selection, front-panel port ranges (the replay sends on ports, not into a recirculation
port or one reserved for loopback, p4/tofino/types.p4: p4testgen would otherwise start paths at
one with a forged bridged header) and, for BMv2,
frames that fit a 1500-byte MTU (the replay's veth pairs). The date line of each test is
dropped; the rest depends only on the command, p4testgen and the sources on a quiet machine
(under load, BMv2's path run gave other tests from its 30th on: docs/testing.md).

The STF files keep the commands and a compact trace (the tables' chosen actions and the
packet's fate), not p4testgen's full trace (hundreds of lines per test for the 64 value
headers); ``--print-traces`` on the recorded command gives it back. ``manifest.json`` records
the command, the tool's identity (hash of its binary: this build prints no version) and a hash
of the P4 sources, so a test can tell the committed tests are current without regenerating.

    python -m tools.testgen [--target bmv2|tofino|tofino2 ...]      (make testgen)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tools.built_from import TOFINO_SOURCES, sources_hash

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "p4" / "testgen"


@dataclass(frozen=True)
class Target:
    """The p4testgen runs of one program: its target/arch flags, and per run (the file prefix)
    its bounds and path selection; ``sources``: what the tests depend on (globs from ROOT)."""

    name: str
    program: str
    flags: tuple[str, ...]
    runs: dict[str, tuple[str, ...]]
    sources: tuple[str, ...]
    seed: int = 1

    def command(self, run: str, out_dir: Path) -> list[str]:
        return ["p4testgen", *self.flags, *self.runs[run], "--test-backend", "stf",
                "--seed", str(self.seed), "--out-dir", str(out_dir), self.program]


# Runs per program: "path", any outcome (most paths end in a drop), and for BMv2 "out", paths
# that send a packet (--output-packet-only), so the replay compares frames as well as drops. On
# the Tofino program p4testgen finds no such path (docs/testing.md): an "out" run there gives
# no test in minutes. BMv2's "out" stops at 30 tests: with the reduce-scatter's RoundOwner and
# ResultElision and ATP's admission beside them, p4testgen's greedy search gives up looking for
# a 33rd with an internal error (more guard violations than it permits: paths whose output port
# its STF back end cannot test).
_GREEDY = ("--path-selection", "greedy_statement_search", "--track-coverage", "STATEMENTS")
_RANDOM = ("--path-selection", "random_backtrack")
_OUT = ("--output-packet-only",)

TARGETS = {t.name: t for t in (
    Target("bmv2", "p4/inagg.p4",
           ("--target", "bmv2", "--arch", "v1model", "-Ip4/include", "-Ip4", "--port-ranges", "1:8",
            "--packet-size-range", "0:12000"),
           {"path": ("--max-tests", "40", *_GREEDY), "out": ("--max-tests", "30", *_GREEDY, *_OUT)},
           ("p4/inagg.p4", "p4/include/*.p4")),
    Target("tofino", "p4/tofino/inagg.p4",
           ("--target", "tofino", "--arch", "tna", "-D__TARGET_TOFINO__=1", "-Ip4/include", "-Ip4",
            "-Ip4/tofino", "--port-ranges", "0:55"),
           {"path": ("--max-tests", "30", *_RANDOM)}, TOFINO_SOURCES),
    Target("tofino2", "p4/tofino/inagg.p4",
           ("--target", "tofino2", "--arch", "t2na", "-D__TARGET_TOFINO__=2", "-Ip4/include", "-Ip4",
            "-Ip4/tofino", "--port-ranges", "8:63"),
           # seed 3: with seeds 1 and 2 (since recirc_spread.p4) a path reaches value_pair.p4's
           # two-output RegisterAction.execute, where this p4testgen aborts the whole run
           # (../shared/toolchains/README.md)
           {"path": ("--max-tests", "30", *_RANDOM)}, TOFINO_SOURCES, seed=3),
)}

# The trace lines kept (compacted): which action each table chose, and the packet's fate.
_BRANCH = re.compile(r"^# \[(?:Constant )?Table Branch: ([\w.]+).*?(?:Chosen action|Choosing default action): ([^|\]]+)")
_FATE = re.compile(r"^# \[(Packet marked dropped|mark_to_drop executed\.|Output port tainted.*)\]")


def tool_identity() -> str:
    """sha256 of the p4testgen binary (``--version`` names it; this build's version is <null>)."""
    proc = subprocess.run(["p4testgen", "--target", "bmv2", "--arch", "v1model", "--version"],
                          capture_output=True, text=True, check=True)
    binary = Path((proc.stdout + proc.stderr).splitlines()[0].strip())   # it prints on stderr
    return hashlib.sha256(binary.read_bytes()).hexdigest()


def manifest(target: Target, tool: str) -> dict:
    """What the committed tests were generated from (checked by the currency test)."""
    return {"commands": {run: target.command(run, Path(f"p4/testgen/{target.name}")) for run in target.runs},
            "tool_sha256": tool, "sources_sha256": sources_hash(target.sources)}


def compact(text: str) -> str:
    """The STF without its date line and with the trace cut to table choices and fate."""
    lines = []
    for line in text.splitlines():
        if line.startswith("# Date generated"):
            continue
        if line.startswith("# ["):
            branch, fate = _BRANCH.match(line), _FATE.match(line)
            if branch:
                lines.append(f"# table {branch.group(1)}: {branch.group(2).strip()}")
            elif fate:
                lines.append(f"# {fate.group(1)}")
            continue
        if line.strip() or (lines and lines[-1].strip()):
            lines.append(line)
    return "\n".join(lines).rstrip() + "\n"


def test_number(path: Path) -> int:
    return int(path.stem.rsplit("_", 1)[1])


def generate_run(target: Target, run: str, out: Path) -> tuple[int, float]:
    """One p4testgen run into ``out``: its compacted tests as <run>_NNN.stf, in p4testgen's
    order. Returns (tests, seconds)."""
    with tempfile.TemporaryDirectory(prefix="inagg-testgen-") as tmp:
        started = time.monotonic()
        proc = subprocess.run(target.command(run, Path(tmp)), cwd=ROOT, capture_output=True, text=True)
        seconds = time.monotonic() - started
        if proc.returncode != 0:
            raise SystemExit(f"p4testgen {target.name} {run} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
        found = sorted(Path(tmp).glob("*.stf"), key=test_number)
        for i, path in enumerate(found, 1):
            (out / f"{run}_{i:03d}.stf").write_text(compact(path.read_text()))
    return len(found), seconds


def generate(target: Target, tool: str) -> None:
    """Replace p4/testgen/<target>/ with the tests of its runs and the manifest, saying on
    stderr how many tests each run gave in how long."""
    out = OUT / target.name
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for run in target.runs:
        tests, seconds = generate_run(target, run, out)
        print(f"testgen {target.name} {run}: {tests} tests in {seconds:.0f} s", file=sys.stderr)
    (out / "manifest.json").write_text(json.dumps(manifest(target, tool), indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", action="append", choices=sorted(TARGETS),
                        help="only these targets (default: all)")
    args = parser.parse_args(argv)
    tool = tool_identity()
    for name in args.target or TARGETS:
        generate(TARGETS[name], tool)
    return 0


if __name__ == "__main__":
    sys.exit(main())
