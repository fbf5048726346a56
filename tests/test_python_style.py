"""The house rules for Python that a machine can count, so they hold without anyone counting:
ruff with the project's configuration (pyproject.toml: unused imports and names, complexity and
statements per function), and no function longer than 60 lines in the code or its tests."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("hostlib", "controller", "bmv2_env", "tests", "benchmarks", "tools", "examples")
MAX_LINES = 60


def python_files() -> list[Path]:
    """Every Python file of ours; the gRPC stubs are generated (make protos), not written."""
    return [f for d in FOLDERS for f in sorted((ROOT / d).rglob("*.py")) if "_pb2" not in f.name]


def long_functions(path: Path) -> list[str]:
    """``file:line name (N lines)`` for each function of ``path`` over MAX_LINES lines."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_LINES:
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_function_over_60_lines():
    found = [f for p in python_files() for f in long_functions(p)]
    assert not found, "split these along their seams:\n" + "\n".join(found)


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]' brings it)")
    proc = subprocess.run([ruff, "check", "--output-format", "concise", *FOLDERS], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
