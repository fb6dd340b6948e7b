"""The package's shape, checked: dependencies point one way (down the layers below), stages do not
import each other, runtimes do not import each other, and no module outgrows one sitting."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tritonbundle"
#: Lowest first. A unit may import its own modules and units of lower layers only.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"__init__", "contract", "errors", "canary"}),
    frozenset({"log", "files"}),
    frozenset({"proc", "modelconfig", "traffic", "installation"}),
    frozenset({"manifest", "payloads", "gpu_sharing"}),
    frozenset({"plan", "recipes", "server", "clients"}),
    frozenset({"runtimes", "measure"}),
    frozenset({"tasks", "served"}),
    frozenset({"build", "loadtests", "gateway", "release"}),
    frozenset({"bench", "demo", "tune"}),
    frozenset({"cli"}),
    frozenset({"__main__"}),
)
MAX_LINES = 500


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _unit(parts: tuple[str, ...]) -> str:
    """``tritonbundle.runtimes.tensorrt.engine`` -> ``runtimes``; a top-level module is its own unit."""
    return parts[0].removesuffix(".py") if parts else "__init__"


def _layer(unit: str) -> int:
    for index, units in enumerate(LAYERS):
        if unit in units:
            return index
    raise AssertionError(f"{unit} is in no layer of tests/test_architecture.py: place it")


def _imports(path: Path) -> set[tuple[str, ...]]:
    """Project modules imported anywhere in a file, as parts after ``tritonbundle``."""
    out: set[tuple[str, ...]] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            parts = tuple(name.split("."))
            if parts[0] == "tritonbundle" and len(parts) > 1 and (
                (PACKAGE / parts[1]).is_dir() or (PACKAGE / f"{parts[1]}.py").is_file()
            ):
                out.add(parts[1:])
    return out


def _edges() -> list[tuple[str, str, str]]:
    """(importing file, importing unit, imported unit) for every import between different units."""
    edges = []
    for path in _modules():
        rel = path.relative_to(PACKAGE).parts
        unit = _unit(rel)
        for target in _imports(path):
            other = _unit(target)
            if other != unit:
                edges.append(("/".join(rel), unit, other))
    return edges


def test_every_import_points_down_the_layers() -> None:
    upward = [f"{file} ({unit}, layer {_layer(unit)}) imports {other} (layer {_layer(other)})"
              for file, unit, other in _edges() if _layer(other) >= _layer(unit)]
    assert upward == []


def test_the_layers_leave_no_cycle_between_units() -> None:
    graph: dict[str, set[str]] = {}
    for _, unit, other in _edges():
        graph.setdefault(unit, set()).add(other)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for nxt in graph.get(start, ()):
            if nxt == goal or (nxt not in seen and reaches(nxt, goal, seen | {nxt})):
                return True
        return False

    assert [u for u in graph if reaches(u, u, {u})] == []


def test_runtimes_do_not_import_each_other() -> None:
    runtimes = PACKAGE / "runtimes"
    folders = {p.name for p in runtimes.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    crossing = []
    for folder in folders:
        for path in (runtimes / folder).rglob("*.py"):
            for target in _imports(path):
                if target[:1] == ("runtimes",) and len(target) > 1 and target[1] in folders and target[1] != folder:
                    crossing.append(f"runtimes/{folder}/{path.name} imports runtimes.{target[1]}")
    assert crossing == []


def test_the_registry_is_the_only_place_that_names_the_runtimes() -> None:
    """Adding a runtime is one folder plus one line in runtimes.PLUGINS: nothing else branches on a name."""
    offenders = []
    for path in _modules():
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "runtimes" or rel.parts[0] == "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and any(
                isinstance(c, ast.Constant) and c.value in ("onnxruntime", "tensorrt", "pytorch") for c in node.comparators
            ):
                offenders.append(f"{rel}:{node.lineno}")
    assert offenders == []


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_over_500_lines(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE)} has {lines} lines: split it by job"
