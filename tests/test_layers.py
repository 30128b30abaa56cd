"""The package's import graph: the layers the folders name, imported downwards only,
and no circle of imports between modules.

Read from the source (ast), so nothing is imported: an import under ``if
TYPE_CHECKING:`` is for annotations and does not count for the layers, but does for
circles (a circle through annotations still ties modules together); ``from package import module``
is an edge to that module; a module importing its own parent package is not an edge
(Python imports parents first anyway).
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ringreduce"

LAYERS = [
    {"errors", "config", "sizes", "defaults"},
    {"plan"},
    {"safety"},
    {"execution"},
    {"engine", "engine_calls"},
    {"integrations", "fsdp", "ddp"},
    {"benchmark", "bench", "model", "info", "__main__", ""},
]
"""Bottom first. A module may import from its own layer's groups and from lower layers;
"" is the package's own __init__ (the public API)."""


def _modules() -> dict[str, Path]:
    mods = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ["ringreduce", *path.relative_to(PACKAGE).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _annotation_only(tree: ast.Module) -> set[int]:
    nodes: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            nodes.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return nodes


def _absolute(package: str, level: int, module: str) -> str:
    """``from {"." * level}{module} import ...`` inside ``package``, made absolute."""
    if not level:
        return module
    parts = package.split(".")
    return ".".join([*parts[: len(parts) - level + 1], module]).strip(".")


def _edges(mods: dict[str, Path], annotations: bool = False) -> dict[str, set[str]]:
    """Module -> the package modules it imports; ``annotations``: imports under ``if
    TYPE_CHECKING:`` count too (they tie modules together for a reader all the same)."""
    edges: dict[str, set[str]] = collections.defaultdict(set)
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        skip = set() if annotations else _annotation_only(tree)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.ImportFrom):
                source = _absolute(package, node.level, node.module or "")
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in mods else source
                           for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            edges[mod].update(t for t in targets
                              if t in mods and t != mod and not mod.startswith(t + "."))
    return edges


def _layer(mod: str) -> int:
    group = mod.split(".")[1] if "." in mod else ""
    return next(i for i, layer in enumerate(LAYERS) if group in layer)


def test_every_import_goes_down_the_layers() -> None:
    edges = _edges(_modules())
    upward = sorted(f"{m} -> {t}" for m, targets in edges.items() for t in targets
                    if _layer(t) > _layer(m))
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


@pytest.mark.parametrize("annotations", [False, True], ids=["runtime", "with type-only"])
def test_no_circle_of_imports(annotations: bool) -> None:
    edges = _edges(_modules(), annotations)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(mod: str) -> list[str] | None:
        state[mod] = 1
        path.append(mod)
        for nxt in sorted(edges.get(mod, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[mod] = 2
        path.pop()
        return None

    for mod in sorted(_modules()):
        if mod not in state:
            circle = visit(mod)
            assert circle is None, "a circle of imports: " + " -> ".join(circle)
