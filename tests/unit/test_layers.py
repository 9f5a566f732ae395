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
    "envs": 2,
    "tracking": 2,
    "checkpoint": 2,
    "rewards": 3,
    "training": 3,
    "rollout": 4,
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
