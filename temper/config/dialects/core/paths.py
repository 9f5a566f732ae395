"""Dotted paths into nested mappings: the one set of helpers every dialect uses.

A path names a key by its sections, ``"actor_rollout_ref.actor.strategy"``. A step into
something that is not a mapping, or a missing key, ends a lookup (``MISSING``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

MISSING: Any = object()  # a path that leads nowhere (``None`` is a value a file may set)


def get(tree: Any, path: str, default: Any = None) -> Any:
    """The value at ``path`` in ``tree``, or ``default`` when there is none."""
    node = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def has(tree: Any, path: str) -> bool:
    """Whether ``tree`` holds ``path`` (at any value, ``None`` included)."""
    return get(tree, path, MISSING) is not MISSING


def put(tree: dict[str, Any], path: str, value: Any) -> None:
    """Set ``path`` to ``value``, making the sections on the way; a step into a value that
    is not a mapping leaves ``tree`` as it is."""
    node = tree
    *parents, last = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            return
    node[last] = value


def delete(tree: dict[str, Any], path: str) -> None:
    """Remove ``path`` from ``tree`` (nothing when it is not there)."""
    *parents, last = path.split(".")
    node = get(tree, ".".join(parents), MISSING) if parents else tree
    if isinstance(node, dict):
        node.pop(last, None)


def nest(flat: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """A nested mapping from ``(path, value)`` pairs."""
    out: dict[str, Any] = {}
    for path, value in flat:
        put(out, path, value)
    return out


def leaf_items(value: Any, path: str) -> list[tuple[str, Any]]:
    """Every leaf under ``path`` holding ``value`` (a section's leaves, each with its value;
    a non-empty section is not a leaf, an empty one is), in the file's order."""
    if isinstance(value, dict) and value:
        return [leaf for k, v in value.items() for leaf in leaf_items(v, f"{path}.{k}")]
    return [(path, value)]


def leaves(value: Any, path: str) -> list[str]:
    """The paths of :func:`leaf_items`."""
    return [leaf for leaf, _ in leaf_items(value, path)]
