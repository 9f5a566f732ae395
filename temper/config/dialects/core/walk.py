"""The one walk of a dialect file against its key table.

A table maps dotted key paths to :mod:`core.rules`; a ``*`` segment matches any one segment
(a ROLL reward name, an env tag), and the segments it matched reach the rule (``{0}``
in a ROLL ``Map``'s native key). The walk visits every key of the file in its order:
a key with a rule is handed to it (a rule on a section claims its whole subtree), a
section the table knows keys under is entered, and anything else is an unknown key.
What each case means in a dialect's words is its context's (:class:`Walker`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Protocol

from temper.config.dialects.core.rules import Map, Rule


class Walker(Protocol):
    """A dialect's translation context, as the walk drives it."""

    def enter(self, path: str) -> bool:
        """``path`` is the key translated next; False skips it (handled already)."""
        ...

    def apply(self, rule: Rule, value: Any, stars: Sequence[str]) -> None: ...

    def null_section(self) -> None:
        """The key entered is a section the file leaves null."""
        ...

    def not_a_section(self, parts: tuple[str, ...], siblings: frozenset[str], value: Any) -> None:
        """The key entered is a section with a value that is not a mapping."""
        ...

    def unknown(self, parts: tuple[str, ...], siblings: frozenset[str]) -> None:
        """The key entered is in no table (``siblings``: its parent's known keys); raises."""
        ...


class KeyTable:
    """A key table (``path -> rule``) and its walk."""

    def __init__(self, rules: dict[str, Rule]) -> None:
        self.rules = rules
        self.patterns = [(tuple(p.split(".")), rule) for p, rule in rules.items()]
        # exact paths by their place in the table; the first row that matches wins
        self.exact = {p: i for i, (p, _) in enumerate(self.patterns) if "*" not in p}
        self.wild = [(i, p, r) for i, (p, r) in enumerate(self.patterns) if "*" in p]
        # the table is fixed; paths recur across and within files
        self.lookup = functools.cache(self._lookup)
        self.children = functools.cache(self._children)

    @functools.cached_property
    def reverse(self) -> dict[str, str]:
        """Native key -> the key that maps to it (a direct mapping preferred over a weak
        one; keys without a ``*`` segment)."""
        out: dict[str, str] = {}
        maps = [(k, r) for k, r in self.rules.items() if isinstance(r, Map) and "*" not in k]
        for key, rule in sorted(maps, key=lambda kv: kv[1].weak):
            for native in rule.natives:
                out.setdefault(native, key)
        return out

    def _lookup(self, parts: tuple[str, ...]) -> tuple[Rule, list[str]] | None:
        first = self.exact.get(parts)
        for i, pat, rule in self.wild:
            if first is not None and i > first:
                break
            if len(pat) == len(parts) and all(p in ("*", s) for p, s in zip(pat, parts)):
                return rule, [s for p, s in zip(pat, parts) if p == "*"]
        return None if first is None else (self.patterns[first][1], [])

    def _children(self, parts: tuple[str, ...]) -> frozenset[str]:
        n = len(parts)
        return frozenset(
            pat[n]
            for pat, _ in self.patterns
            if len(pat) > n and all(p in ("*", s) for p, s in zip(pat, parts))
        )

    def rule(self, key: str) -> Rule | None:
        """The rule of dotted key ``key`` (None when the table has none)."""
        found = self.lookup(tuple(key.split(".")))
        return None if found is None else found[0]

    def is_rule(self, key: str) -> bool:
        """Whether top-level ``key`` is a setting of this table (not a definition)."""
        return self.lookup((key,)) is not None or bool(self.children((key,)))

    def walk(self, ctx: Walker, value: Any, parts: tuple[str, ...]) -> None:
        """Translate key ``parts`` holding ``value``."""
        if not ctx.enter(".".join(parts)):
            return
        found = self.lookup(parts)
        if found is not None:
            ctx.apply(found[0], value, found[1])
            return
        if self.children(parts):
            if isinstance(value, dict):
                self.walk_section(ctx, value, parts)
            elif value is None:
                ctx.null_section()
            else:
                ctx.not_a_section(parts, self.children(parts[:-1]), value)
            return
        ctx.unknown(parts, self.children(parts[:-1]))

    def walk_section(self, ctx: Walker, node: dict[str, Any], parts: tuple[str, ...]) -> None:
        """Translate every key of section ``parts`` (``()``: the whole file)."""
        for name, value in node.items():
            self.walk(ctx, value, (*parts, str(name)))
