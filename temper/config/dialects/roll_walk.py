"""Walking a ROLL config against a key table: every key is mapped, noted, rejected, or
read by a derivation (``roll_derive``); a key the table lacks is a ``ConfigError`` with
"did you mean". The RL pipelines' table is ``roll_table.TOP``, the SFT pipeline's
``roll_sft``'s.
"""

from __future__ import annotations

import functools
from typing import Any

from temper.config.dialects import paths
from temper.config.dialects.paths import MISSING
from temper.config.dialects.roll_derive import Ctx
from temper.config.dialects.rules import Call, Gated, Map, Note, Refuse, Rule, Same, describe
from temper.config.errors import ConfigError, did_you_mean


class KeyTable:
    """A ROLL key table (``path -> rule``, ``*`` matching one segment) and its walk."""

    def __init__(self, rules: dict[str, Rule]) -> None:
        self.rules = rules
        self.patterns = [(tuple(p.split(".")), rule) for p, rule in rules.items()]
        # the table is fixed; paths recur across and within files
        self.lookup = functools.cache(self._lookup)
        self.children = functools.cache(self._children)
        # native key -> the ROLL key that maps to it (keys without a `*` segment)
        self.reverse: dict[str, str] = {}
        for key, rule in rules.items():
            if isinstance(rule, Map) and "*" not in key:
                for dst in rule.natives:
                    self.reverse.setdefault(dst, key)

    def _lookup(self, parts: tuple[str, ...]) -> tuple[Rule, list[str]] | None:
        for pat, rule in self.patterns:
            if len(pat) == len(parts):
                stars = []
                for p, s in zip(pat, parts):
                    if p == "*":
                        stars.append(s)
                    elif p != s:
                        break
                else:
                    return rule, stars
        return None

    def _children(self, parts: tuple[str, ...]) -> frozenset[str]:
        n = len(parts)
        return frozenset(
            pat[n]
            for pat, _ in self.patterns
            if len(pat) > n and all(p in ("*", s) for p, s in zip(pat, parts))
        )

    def walk(self, ctx: Ctx, value: Any, parts: tuple[str, ...]) -> None:
        key = ".".join(parts)
        found = self.lookup(parts)
        if found is not None:
            _apply(ctx, key, value, *found)
            return
        kids = self.children(parts)
        if kids and isinstance(value, dict):
            for k, v in value.items():
                self.walk(ctx, v, (*parts, str(k)))
            return
        if kids and value is None:
            ctx.note(key, "empty section")
            return
        siblings = self.children(parts[:-1])
        raise ConfigError(
            key,
            f"unknown ROLL key{did_you_mean(parts[-1], siblings)}",
            "remove it, or see temper/config/dialects/roll_table.py for the ROLL keys temper "
            "understands",
        )

    def is_rule(self, key: str) -> bool:
        """Whether top-level ``key`` is a ROLL setting of this table (not a definition)."""
        return self.lookup((key,)) is not None or bool(self.children((key,)))

    def meaning(self, key: str) -> tuple[tuple[str, ...], str] | None:
        """What ROLL key ``key`` becomes here (``temper check --explain``)."""
        found = self.lookup(tuple(key.split(".")))
        if found is None:
            return None
        return rule_meaning(found[0])


def rule_meaning(rule: Rule) -> tuple[tuple[str, ...], str]:
    """What a ROLL table's rule does with its key: (native keys it sets, how)."""
    if isinstance(rule, Map):
        dst = rule.natives
        return dst, "sets " + ", ".join(dst) + (" (converted)" if rule.fn else "")
    if isinstance(rule, Refuse):
        return (), f"refused ({rule.reason}); fix: {rule.fix}"
    return (), describe(rule)


def _apply(ctx: Ctx, key: str, value: Any, rule: Rule, stars: list[str]) -> None:
    ctx.used.append(value)
    if isinstance(rule, Map):
        out = rule.fn(value, ctx) if rule.fn else value
        for dst in rule.natives:
            ctx.set(dst.format(*stars), out, key)
    elif isinstance(rule, Note):
        ctx.notes.append(
            f"{', '.join(paths.leaves(value, key))}: accepted, no effect here: {rule.why}"
        )
    elif isinstance(rule, Refuse):
        if not rule.accepts(value, ctx):
            raise ConfigError(key, f"{value!r} is not supported: {rule.reason}", rule.fix)
        ctx.note(key, rule.why or "the value given is the one temper always uses")
    elif isinstance(rule, Same):
        other = ctx.get(rule.other, MISSING)
        if other is not MISSING and other != value:
            raise ConfigError(
                key,
                f"{value!r} differs from {rule.other} ({other!r}); {rule.why}",
                f"set {key} to {other!r} or remove it",
            )
        ctx.note(key, f"same as {rule.other}; {rule.why}")
    elif isinstance(rule, Call):
        rule.fn(value, ctx)
    elif isinstance(rule, Gated):  # a table's mistake, found by the first test that reads it
        raise TypeError(f"{key}: ROLL tables have no Gated rules (use Refuse)")
    # Use: read by a derivation in roll_derive.
