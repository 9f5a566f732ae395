"""The row language of the dialect key tables (``verl_keys.py``, ``roll_keys.py``).

One row per line: ``<key> <value> [+<key>=<value> | -<key>]... <expectation>``. The
value (YAML, no spaces) is set on the test's base config; ``+k=v`` sets, ``-k`` deletes
another key first. Expectations:

- ``-> native.path`` — the value arrives there unchanged;
- ``-> native.path = x`` — ``x`` arrives there;
- ``noted`` — accepted; a note names the key;
- ``!! words`` — rejected; the ConfigError names the key and contains ``words``.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

Row = tuple[str, str, list[str], str]


def set_key(data: dict[str, Any], path: str, value: Any) -> None:
    node = data
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def del_key(data: dict[str, Any], path: str) -> None:
    node = data
    *parents, leaf = path.split(".")
    for part in parents:
        node = node[part]
    del node[leaf]


def get_native(cfg: Any, path: str) -> Any:
    for part in path.split("."):
        cfg = cfg[part] if isinstance(cfg, dict) else getattr(cfg, part)
    return cfg


def noted(notes: list[str], key: str) -> bool:
    return any(re.search(rf"(^|[ :,]){re.escape(key)}($|[,=:])", n) for n in notes)


def parse_value(text: str) -> Any:
    return yaml.safe_load(text)


def parse_rows(text: str) -> list[Row]:
    rows = []
    for line in text.strip().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        tokens = line.split()
        key, value, rest = tokens[0], tokens[1], tokens[2:]
        extras = []
        while rest and rest[0][0] in "+-" and rest[0] not in ("->",):
            extras.append(rest.pop(0))
        rows.append((key, value, extras, " ".join(rest)))
    return rows


def apply_row(data: dict[str, Any], key: str, value: str, extras: list[str]) -> dict[str, Any]:
    """``data`` with the row's extras and its key set (in place)."""
    for extra in extras:
        if extra.startswith("+"):
            k, _, v = extra[1:].partition("=")
            set_key(data, k, parse_value(v))
        else:
            del_key(data, extra[1:])
    set_key(data, key, parse_value(value))
    return data
