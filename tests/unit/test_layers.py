"""The layer table of DESIGN.md, enforced: imports inside ``temper`` point down only.

Ranks follow the team's checker (``shared/tools/layers.py``): a package may import its
own modules and packages of a lower rank — never one above it or beside it. Two rows of
DESIGN.md say more than "below": ``config`` imports nothing of temper and ``algorithms``
torch only (their one exception is ``temper.registry``, the bottom row every layer may
use: the one :class:`~temper.registry.Registry` and its "did you mean"). Lazy imports
inside functions count the same as module-level ones.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

import temper

PACKAGE = Path(temper.__file__).parent

# lower = below; a package may import packages of a strictly lower rank
RANK = {
    "registry": -1,
    "config": 0,
    "utils": 0,
    "algorithms": 1,
    "data": 2,
    "tracking": 2,
    "checkpoint": 2,
    "rewards": 3,
    "training": 3,
    "rollout": 4,
    "envs": 4,  # episodes: environments with tools run code in the rewards' sandbox
    "roles": 4,
    "cluster": 5,
    "pipelines": 6,
    "report": 6,
    "cli": 7,
    "__main__": 8,
    "__init__": 8,
}
# rows whose "may import" is narrower than "anything below"
ONLY = {"config": {"registry"}, "algorithms": {"registry"}, "registry": set()}


@functools.cache
def imports() -> list[tuple[str, str, str, int]]:
    """``(source package, imported package, file, line)`` of every temper import."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        src = rel.parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "temper" and len(parts) > 1 and parts[1] != src:
                    out.append((src, parts[1], rel.as_posix(), node.lineno))
    return out


def test_every_package_has_a_layer():
    packages = {p.name.removesuffix(".py") for p in PACKAGE.iterdir() if p.name != "__pycache__"}
    assert packages <= set(RANK), f"packages missing from the layer table: {packages - set(RANK)}"


@pytest.mark.parametrize("src", sorted(RANK))
def test_imports_point_down(src):
    def allowed(dst: str) -> bool:
        return dst in ONLY[src] if src in ONLY else RANK.get(dst, 99) < RANK[src]

    bad = [
        f"{file}:{line} imports temper.{dst}"
        for s, dst, file, line in imports()
        if s == src and not allowed(dst)
    ]
    assert not bad, "imports up or sideways in the layer table:\n" + "\n".join(bad)


def _module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    where = PACKAGE.parent.joinpath(*name.split("."))
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


@functools.cache
def module_graph(package: str) -> dict[str, set[str]]:
    """``module -> modules of temper.<package> it imports`` — at module level, inside
    functions and under ``TYPE_CHECKING`` alike (a type-only import is still knowledge
    of the other module). ``from temper.p import m`` is an edge to the module ``m``."""
    graph: dict[str, set[str]] = {}
    prefix = f"temper.{package}"
    for path in sorted((PACKAGE / package).rglob("*.py")):
        src = _module_of(path)
        edges = graph.setdefault(src, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = [f"{node.module}.{a.name}" for a in node.names]
                modules = [s for s in subs if _is_module(s)]
                targets = modules if len(modules) == len(subs) else [node.module, *modules]
            else:
                continue
            for target in targets:
                if target == prefix or target.startswith(prefix + "."):
                    while not _is_module(target):
                        target = target.rsplit(".", 1)[0]
                    if target != src:
                        edges.add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component that has one (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


PACKAGES = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file())


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_inside(package):
    """Modules of one package form no circle: a module that needs another's private
    fields (checkpoint code reading the trainer's, engine io reaching into its engine)
    is one module split in two."""
    cycles = _cycles(module_graph(package))
    assert not cycles, "modules that import each other (directly or round a circle):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )
