"""docs/architecture.md must stay true as code moves: every ``path:name`` anchor it gives names a
real definition, and the import layers it describes hold (no cycles, dependencies point down)."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
ANCHOR = re.compile(r"`((?:hostlib|native|controller|bmv2_env|p4)/[\w/]+\.(?:py|cpp|hpp|p4)):([\w.:]+)")
FILE = re.compile(r"`((?:hostlib|native|controller|bmv2_env|p4)/[\w/]+\.(?:py|cpp|hpp|p4|txtpb|json))`")

# The bottom layer: wire format, codec, transports and the aggregation engine.
BOTTOM = {"hostlib.protocol", "hostlib.native_build", "hostlib.grant", "hostlib.codec", "hostlib.transport", "hostlib.roce",
          "hostlib.scapy_layer", "hostlib.engine", "hostlib.native_engine"}


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


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (at module level or inside functions)."""
    files = {".".join(f.relative_to(ROOT).with_suffix("").parts): f
             for pkg in ("hostlib", "controller", "bmv2_env") for f in (ROOT / pkg).rglob("*.py")
             if "proto" not in f.relative_to(ROOT).parts}
    graph = {m: set() for m in files}
    for module, f in files.items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = module.split(".")[:-node.level] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                names = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            graph[module].update(n for n in names if n in files and n != module)
    return graph


def test_no_import_cycles():
    graph = import_graph()
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph[m]):
            assert state.get(n) != 1, f"import cycle: {' -> '.join(path + [m, n])}"
            if n not in state:
                visit(n, path + [m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


def test_dependencies_point_down():
    graph = import_graph()
    for m, deps in graph.items():
        if m in BOTTOM:
            assert deps <= BOTTOM, f"bottom-layer {m} imports {sorted(deps - BOTTOM)}"
        if m.startswith("controller."):
            up = {d for d in deps if not d.startswith("controller.") and d not in BOTTOM}
            assert not up, f"{m} imports {sorted(up)} (the controller uses only hostlib's bottom layer)"
        if not m.startswith("bmv2_env.") and m != "hostlib.train_demo":
            emulation = {d for d in deps if d.startswith("bmv2_env.")}
            assert not emulation, f"{m} imports the emulation layer: {sorted(emulation)}"
