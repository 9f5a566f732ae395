"""The ROLL translation's context (:class:`Ctx`) and what the rules of a ROLL key table
do, in ROLL's words: every key is mapped, noted, refused, or read by a derivation
(``roll.derive``); a key the table lacks is a ``ConfigError`` with "did you mean". The
walk is :mod:`core.walk`'s; the RL pipelines' table is ``roll_table.TOP``, the SFT
pipeline's ``roll.sft``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temper.config.dialects import Translation
from temper.config.dialects.core import paths
from temper.config.dialects.core.context import Context
from temper.config.dialects.core.paths import MISSING
from temper.config.dialects.core.rules import Call, Gated, Map, Note, Refuse, Rule, Same, describe
from temper.config.dialects.core.walk import KeyTable
from temper.config.errors import ConfigError, did_you_mean
from temper.config.loader import RawConfig


class Ctx(Context):
    """ROLL's context: the walk's :class:`walk.Walker` (the result is written by the
    writer every dialect shares, ``Context.out``)."""

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(data)
        self.used: list[Any] = []  # values of keys read by rules (for definition refs)

    # ------------------------------------------------------------------ the walk's

    def apply(self, rule: Rule, value: Any, stars: list[str]) -> None:
        apply(self, self.key, value, rule, stars)

    def null_section(self) -> None:
        self.inert("empty section", self.key)

    def not_a_section(self, parts: tuple[str, ...], siblings: frozenset[str], value: Any) -> None:
        raise unknown(parts, siblings)

    def unknown(self, parts: tuple[str, ...], siblings: frozenset[str]) -> None:
        raise unknown(parts, siblings)


def walk_file(table: KeyTable, ctx: Ctx, raw: RawConfig) -> list[str]:
    """Walk every top-level key of ``ctx.data`` against ``table``; the keys that are no
    setting but a definition other keys interpolate (or a defaults file's) are returned,
    for ``roll_derive.definitions``."""
    defs = []
    for key, value in ctx.data.items():
        if not table.is_rule(key) and (key in raw.from_defaults or key in raw.referenced):
            defs.append(key)
            continue
        table.walk(ctx, value, (str(key),))
    return defs


def translation(
    ctx: Ctx, applied: dict[str, Any], table: KeyTable, named: Callable[[str], str] = str
) -> Translation:
    """The translation ``ctx`` holds, the ROLL defaults it took (``applied``) noted; a
    pipeline file whose workers have their own names gives ``named``, which rewrites the
    shared rows' ``actor_train`` …"""
    if applied:
        ctx.remark(
            "ROLL defaults applied for keys the file omits: "
            + ", ".join(f"{k}={v!r}" for k, v in applied.items())
        )
    return Translation(
        native=ctx.out.native(),
        notes=[named(n) for n in ctx.out.notes()],
        sources={k: named(v) for k, v in ctx.out.sources().items()},
        table={k: named(v) for k, v in table.reverse.items()},
    )


def unknown(parts: tuple[str, ...], siblings: frozenset[str]) -> ConfigError:
    """A key no ROLL table has."""
    return ConfigError(
        ".".join(parts),
        f"unknown ROLL key{did_you_mean(parts[-1], siblings)}",
        "remove it, or see temper/config/dialects/roll/table.py for the ROLL keys temper "
        "understands",
    )


def rule_meaning(rule: Rule) -> tuple[tuple[str, ...], str]:
    """What a ROLL table's rule does with its key: (native keys it sets, how)."""
    if isinstance(rule, Map):
        dst = rule.natives
        return dst, "sets " + ", ".join(dst) + (" (converted)" if rule.fn else "")
    if isinstance(rule, Refuse):
        return (), f"refused ({rule.reason}); fix: {rule.fix}"
    return (), describe(rule)


def apply(ctx: Ctx, key: str, value: Any, rule: Rule, stars: list[str]) -> None:
    """Apply ``rule`` to ROLL key ``key`` holding ``value``."""
    ctx.used.append(value)
    if isinstance(rule, Map):
        out = rule.fn(value, ctx) if rule.fn else value
        for dst in rule.natives:
            ctx.out.write(dst.format(*stars), out, key, rule.weak)
    elif isinstance(rule, Note):
        for leaf in paths.leaves(value, key):
            ctx.inert(rule.why, leaf)
    elif isinstance(rule, Refuse):
        if not rule.accepts(value, ctx):
            raise ConfigError(key, f"{value!r} is not supported: {rule.reason}", rule.fix)
        why = rule.why or "the value given is the one temper always uses"
        ctx.note(f"accepted at its inert value ({why})", key)
    elif isinstance(rule, Same):
        other = ctx.get(rule.other, MISSING)
        if other is not MISSING and other != value:
            raise ConfigError(
                key,
                f"{value!r} differs from {rule.other} ({other!r}); {rule.why}",
                f"set {key} to {other!r} or remove it",
            )
        ctx.inert(f"same as {rule.other}; {rule.why}", key)
    elif isinstance(rule, Call):
        rule.fn(value, ctx)
    elif isinstance(rule, Gated):  # a table's mistake, found by the first test that reads it
        raise TypeError(f"{key}: ROLL tables have no Gated rules (use Refuse)")
    # Use: read by the derivation the row names (rule.by), which runs after the walk
