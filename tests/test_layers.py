"""The layers inagg's folders show hold at package level: every ``import`` in inagg/ (module level
or inside a function, absolute or relative, no exemptions) goes to the importing subpackage itself
or to one the table below lets it use, so dependencies point down and no cycle between
subpackages is possible. The table is the design (inagg/__init__.py draws it); this test is
what keeps the code to it."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "inagg"

BOTTOM = {"inagg"}                                     # inagg/*.py: version, errors, the C++ loader
MAY_USE = {
    "inagg": set(),
    "wire": BOTTOM,
    "jobservice": BOTTOM | {"wire"},
    "worker": BOTTOM | {"wire", "jobservice"},
    "control": BOTTOM | {"wire", "jobservice"},
    "aggregator": BOTTOM | {"wire", "jobservice"},
    "pytorch": BOTTOM | {"wire", "jobservice", "worker"},
    "softswitch": BOTTOM | {"wire", "jobservice", "control", "aggregator"},
    "emulation": BOTTOM | {"wire", "jobservice", "worker", "control", "aggregator", "softswitch"},
    "demos": BOTTOM | {"wire", "jobservice", "worker", "pytorch", "control", "aggregator",
                       "softswitch", "emulation"},
}


def layer_of(module: str) -> str:
    """``inagg.wire.codec`` -> ``wire``; ``inagg.errors`` or ``inagg`` -> ``inagg``."""
    parts = module.split(".")
    if len(parts) > 1 and (PACKAGE / parts[1]).is_dir():
        return parts[1]
    return "inagg"


def modules() -> dict[str, Path]:
    found = {}
    for f in sorted(PACKAGE.rglob("*.py")):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (f, is_package)
    return found


def imported(module: str, path: Path, is_package: bool) -> set[str]:
    """The inagg modules (or packages) ``module`` imports, with relative imports resolved."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + is_package]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names)   # ``from inagg import wire``
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    known = modules()
    return {m for m in out if m in known}


def test_every_subpackage_has_a_place():
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert subpackages == set(MAY_USE) - {"inagg"}


@pytest.mark.parametrize("module", sorted(modules()))
def test_imports_point_down(module):
    path, is_package = modules()[module]
    mine = layer_of(module)
    wrong = sorted(m for m in imported(module, path, is_package)
                   if layer_of(m) != mine and layer_of(m) not in MAY_USE[mine])
    assert not wrong, f"{module} ({mine}) imports {wrong}: {mine} may use only {sorted(MAY_USE[mine])}"


def test_the_table_has_no_cycle():
    def reaches(start: str, goal: str, seen: frozenset = frozenset()) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n}))
                   for n in MAY_USE[start])
    assert not [p for p in MAY_USE if reaches(p, p)]
