"""docs/architecture.md must stay true as code moves: every ``path:name`` anchor it gives names a
real definition and every file it names exists (the layers it draws: tests/test_layers.py)."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
ANCHOR = re.compile(r"`((?:inagg|native|p4)/[\w/]+\.(?:py|cpp|hpp|p4)):([\w.:]+)")
FILE = re.compile(r"`((?:inagg|native|p4)/[\w/]+\.(?:py|cpp|hpp|p4|txtpb|json))`")


def anchors() -> list[tuple[str, str]]:
    return sorted(set(ANCHOR.findall(DOC.read_text())))


def python_names(path: Path) -> set[str]:
    """Module-level functions, classes and assignments, and ``Class.method`` for methods."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names.update(f"{node.name}.{n.name}" for n in node.body
                         if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
        if isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def defines(path: Path, name: str) -> bool:
    text = path.read_text()
    if path.suffix == ".py":
        return name in python_names(path)
    if path.suffix == ".p4":
        return re.search(r"\b(control|parser|table|action)\s+%s\b" % re.escape(name), text) is not None
    # C++: a definition starts its line with a return type (or is a constructor) and opens a body
    pattern = r"^[\w:<>,*& ]*\b%s\s*\([^;]*?\)\s*(const\s*)?\{" % re.escape(name)
    return re.search(pattern, text, re.M | re.S) is not None


@pytest.mark.parametrize("path,name", anchors())
def test_anchor_names_a_definition(path, name):
    file = ROOT / path
    assert file.is_file(), f"docs/architecture.md names {path}, which does not exist"
    assert defines(file, name), f"docs/architecture.md names {path}:{name}, which is not defined there"


def test_doc_has_anchors_and_named_files_exist():
    assert len(anchors()) > 50
    missing = [p for p in FILE.findall(DOC.read_text()) if not (ROOT / p).is_file()]
    assert not missing, f"docs/architecture.md names missing files: {missing}"
