"""What a committed compiler output was built from: ``p4/out/<target>/built_from.json``, written
by the build (``make tofino``) right after it compiled: the compiler's version line, its flags, a
hash of the P4 sources and one of every output file beside it.

A test can then tell that the committed outputs are current without the compiler's minutes per
chip (tests/test_tofino_program.py): P4 sources changed since the last build, or an output
edited by hand, fail with the command to run. A compile is deterministic for given sources,
flags and compiler, so the recompile itself is needed only where the compiler differs from the
one recorded (or when asked: ``INAGG_RECOMPILE_P4=1``).

    python -m tools.built_from p4/out/tofino --compiler "$(bf-p4c --version)" --flags "..." \\
        --sources 'p4/tofino/*.p4' 'p4/include/*.p4'
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAMP = "built_from.json"
# What the Tofino program reads (p4/tofino/inagg.p4 and its includes): make tofino's --sources.
TOFINO_SOURCES = ("p4/tofino/*.p4", "p4/include/headers.p4", "p4/include/constants.p4", "p4/include/size.p4",
                  "p4/include/unroll.p4")


def sources_hash(globs: tuple[str, ...] | list[str]) -> str:
    """sha256 over the files the globs (from the repository root) match, by path and content,
    in path order."""
    digest = hashlib.sha256()
    for path in sorted({p for g in globs for p in ROOT.glob(g)}):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def outputs_hash(folder: Path) -> dict[str, str]:
    """sha256 of every file in ``folder`` but the record itself, by name."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.is_file() and p.name != STAMP}


def record(folder: Path, compiler: str, flags: str, sources: list[str]) -> dict:
    """The record of ``folder``'s outputs, as the build writes it."""
    return {"compiler": compiler.strip(), "flags": flags, "sources": sources,
            "sources_sha256": sources_hash(sources), "outputs_sha256": outputs_hash(folder)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="the outputs' folder, e.g. p4/out/tofino")
    parser.add_argument("--compiler", required=True, help="the compiler's version line")
    parser.add_argument("--flags", required=True, help="the compiler's flags")
    parser.add_argument("--sources", nargs="+", required=True, help="globs of the P4 sources, from the root")
    args = parser.parse_args(argv)
    (args.folder / STAMP).write_text(json.dumps(record(args.folder, args.compiler, args.flags, args.sources),
                                                indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
