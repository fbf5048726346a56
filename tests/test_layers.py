"""The layers inagg's folders show hold at two levels: the card's three top folders in a strict
order (hostlib < controller < bmv2_env), and inside each its subpackages. Every ``import`` in
them (module level or inside a function, absolute or relative, no exemptions) and every
``python -m`` launch string goes to the importing layer itself or to one the tables below let it
use, so dependencies point down and no cycle is possible. The tables are the design; the drawings
of the layers (each folder's ``__init__`` docstring, its README and docs/architecture.md) are
checked against them, and this test is what keeps the code to them."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("hostlib", "controller", "bmv2_env")         # bottom to top: the card's order

# (folder, subpackage) -> the layers it uses besides itself; "" is the folder's own modules. Each
# entry is an edge some import takes (test_every_allowance_is_used): the table is the design,
# drawn in each folder's __init__ docstring, never a list of exemptions.
H, C, E = "hostlib", "controller", "bmv2_env"
MAY_USE: dict[tuple[str, str], set[tuple[str, str]]] = {
    (H, ""): set(),                                   # version, errors, the C++ loader
    (H, "wire"): set(),
    (H, "jobservice"): {(H, "wire")},
    (H, "worker"): {(H, ""), (H, "wire"), (H, "jobservice")},
    (H, "aggregator"): {(H, ""), (H, "wire"), (H, "jobservice")},
    (H, "pytorch"): {(H, ""), (H, "wire"), (H, "worker")},
    (C, "tofino"): set(),
    (C, ""): {(C, "tofino"), (H, ""), (H, "wire"), (H, "jobservice")},
    (E, ""): set(),
    (E, "softswitch"): {(C, ""), (C, "tofino"), (H, ""), (H, "wire"), (H, "aggregator")},
    (E, "emulation"): {(E, "softswitch"), (C, ""), (H, ""), (H, "wire"), (H, "jobservice"),
                       (H, "worker"), (H, "aggregator")},
    (E, "demos"): {(E, "emulation"), (H, ""), (H, "wire"), (H, "jobservice"), (H, "worker"),
                   (H, "aggregator"), (H, "pytorch")},
}
# A process started with ``python -m`` is not an import: the torch backend's zero-setup deployment
# starts bmv2_env's services in a subprocess, so hostlib stays below bmv2_env. Every launch is
# checked against this list, and each entry must still be a launch somewhere (no unused allowance).
# The emulation runs the training demo's workers on its hosts the same way.
LAUNCHES_UP = {(("hostlib", "worker"), "inagg.bmv2_env.emulation.services"),
               (("bmv2_env", "emulation"), "inagg.bmv2_env.demos.train_demo")}


def layer_of(module: str) -> tuple[str, str]:
    """``inagg.hostlib.wire.codec`` -> ``("hostlib", "wire")``; ``inagg.hostlib.errors`` ->
    ``("hostlib", "")``."""
    parts = module.split(".")
    folder = parts[1]
    sub = parts[2] if len(parts) > 2 and (ROOT / folder / parts[2]).is_dir() else ""
    return folder, sub


def modules() -> dict[str, tuple[Path, bool]]:
    found = {}
    for folder in FOLDERS:
        for f in sorted((ROOT / folder).rglob("*.py")):
            parts = ["inagg", *f.relative_to(ROOT).with_suffix("").parts]
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (f, is_package)
    return found


def launches(tree: ast.AST) -> set[str]:
    """The modules ``tree`` starts by name through ``inagg.hostlib.launch.python_m``, the one
    builder of ``python -m`` commands (test_every_launch_is_built_in_one_place): a string, or a
    module-level constant holding one. A launch that passes the module object itself
    (``python_m(switch)``) is an import, checked as one."""
    constants = {t.id: node.value.value for node in getattr(tree, "body", ()) if isinstance(node, ast.Assign)
                 and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                 for t in node.targets if isinstance(t, ast.Name)}
    out = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args and "python_m" in (getattr(node.func, "id", None),
                                                                              getattr(node.func, "attr", None))):
            continue
        target = node.args[0]
        if isinstance(target, ast.Constant):
            out.add(target.value)
        elif isinstance(target, ast.Name) and target.id in constants:
            out.add(constants[target.id])
    return out


def literal_launches(tree: ast.AST) -> list[str]:
    """Commands ``tree`` spells out as ``[..., "-m", ...]`` lists or tuples (what ``python_m`` is for)."""
    return [ast.unparse(node) for node in ast.walk(tree) if isinstance(node, (ast.List, ast.Tuple))
            and any(isinstance(a, ast.Constant) and a.value == "-m" for a in node.elts)]


def imported(module: str, path: Path, is_package: bool) -> set[str]:
    """The inagg modules (or packages) ``module`` imports, with relative imports resolved, and
    those it starts with ``python -m`` or imports by name (``importlib.import_module``)."""
    out = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + is_package]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names)   # ``from inagg.hostlib import wire``
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    known = modules()
    return {m for m in out if m in known}


def test_every_subpackage_has_a_place():
    found = {(f, p.name) for f in FOLDERS for p in (ROOT / f).iterdir() if (p / "__init__.py").is_file()}
    assert found | {(f, "") for f in FOLDERS} == set(MAY_USE)


def test_no_code_folder_named_inagg():
    assert not (ROOT / "inagg").exists(), "the card's folders hold the code; inagg is only the import root"


@pytest.mark.parametrize("module", sorted(modules()))
def test_imports_point_down(module):
    path, is_package = modules()[module]
    mine = layer_of(module)
    wrong = sorted(m for m in imported(module, path, is_package)
                   if layer_of(m) != mine and layer_of(m) not in MAY_USE[mine])
    assert not wrong, f"{module} {mine} imports {wrong}: it may use only {sorted(MAY_USE[mine])}"


def below(layer: tuple[str, str], mine: tuple[str, str]) -> bool:
    """``layer`` is in a lower folder than ``mine`` or reached from it through the table."""
    if FOLDERS.index(layer[0]) < FOLDERS.index(mine[0]):
        return True
    todo, seen = [mine], set()
    while todo:
        for n in MAY_USE[todo.pop()] - seen:
            seen.add(n)
            todo.append(n)
    return layer in seen


@pytest.mark.parametrize("module", sorted(modules()))
def test_launches_point_down_or_are_declared(module):
    path, _ = modules()[module]
    mine = layer_of(module)
    for target in launches(ast.parse(path.read_text())):
        assert target in modules(), f"{module} launches `python -m {target}`, which is no module"
        layer = layer_of(target)
        assert layer == mine or below(layer, mine) or (mine, target) in LAUNCHES_UP, \
            f"{module} {mine} launches {target} {layer} above it; declare it in LAUNCHES_UP or move it"


@pytest.mark.parametrize("module", sorted(set(modules()) - {"inagg.hostlib.launch"}))
def test_every_launch_is_built_in_one_place(module):
    """Every ``python -m`` command is ``python_m``'s, from the module object where the launcher may
    import it, so a moved module can never leave a stale launch string behind."""
    path, _ = modules()[module]
    assert not literal_launches(ast.parse(path.read_text())), f"{module}: build the command with python_m"


def test_every_declared_launch_up_is_used():
    used = {(layer_of(m), t) for m, (p, _) in modules().items() for t in launches(ast.parse(p.read_text()))}
    assert LAUNCHES_UP <= used


def test_the_tables_have_no_cycle():
    def reaches(start, goal, seen=frozenset()) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in MAY_USE[start])
    assert not [p for p in MAY_USE if reaches(p, p)]
    rank = {f: i for i, f in enumerate(FOLDERS)}
    assert all(rank[b[0]] <= rank[a[0]] for a, uses in MAY_USE.items() for b in uses)


def test_every_allowance_is_used():
    used = {(layer_of(m), layer_of(t)) for m, (p, pkg) in modules().items() for t in imported(m, p, pkg)}
    unused = sorted((a, b) for a, uses in MAY_USE.items() for b in uses if (a, b) not in used)
    assert not unused, f"allowances no import uses (drop them from MAY_USE): {unused}"


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_drawings_name_the_layers(folder):
    """Each folder's docstring draws its subpackages; docs/architecture.md names the folders in
    the card's order."""
    drawing = ast.get_docstring(ast.parse((ROOT / folder / "__init__.py").read_text()))
    subs = sorted(s for f, s in MAY_USE if f == folder and s)
    missing = [s for s in subs if not re.search(rf"\b{s}\b", drawing)]
    assert not missing, f"{folder}/__init__.py's drawing misses {missing}"
    arch = (ROOT / "docs/architecture.md").read_text()
    drawn = arch[arch.index("## 1. Pieces and layers"):arch.index("## 2.")]
    assert re.search(r"`hostlib/`.*`controller/`.*`bmv2_env/`", drawn.replace("\n", " "))
    missing = [s for s in subs if not re.search(rf"^\s+{s}\s", drawn, re.M)]
    assert not missing, f"docs/architecture.md's drawing misses {folder}'s {missing}"
