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
    """ROLL's context: the native keys written (``set`` refuses two keys that set one
    field to different values), the notes; the walk's :class:`walk.Walker`."""

    def __init__(self, data: dict[str, Any]) -> None:
        super().__init__(data)
        self.native: dict[str, Any] = {}
        self.src: dict[str, str] = {}
        self.notes: list[str] = []
        self.used: list[Any] = []  # values of keys read by rules (for definition refs)

    def set(self, dst: str, value: Any, src: str) -> None:
        if dst in self.src and self.native_get(dst) != value:
            raise ConfigError(
                src,
                f"sets {dst} to {value!r}, but {self.src[dst]} set it to {self.native_get(dst)!r}",
                f"make {src} and {self.src[dst]} agree",
            )
        paths.put(self.native, dst, value)
        self.src[dst] = src

    def native_get(self, dst: str, default: Any = None) -> Any:
        return paths.get(self.native, dst, default)

    def note(self, why: str, key: str | None = None) -> None:
        self.notes.append(f"{key or self.key}: accepted, no effect here: {why}")

    # ------------------------------------------------------------------ the walk's

    def apply(self, rule: Rule, value: Any, stars: list[str]) -> None:
        apply(self, self.key, value, rule, stars)

    def null_section(self) -> None:
        self.note("empty section", self.key)

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
        ctx.notes.append(
            "ROLL defaults applied for keys the file omits: "
            + ", ".join(f"{k}={v!r}" for k, v in applied.items())
        )
    return Translation(
        native=ctx.native,
        notes=[named(n) for n in ctx.notes],
        sources={k: named(v) for k, v in ctx.src.items()},
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
            ctx.set(dst.format(*stars), out, key)
    elif isinstance(rule, Note):
        ctx.notes.append(
            f"{', '.join(paths.leaves(value, key))}: accepted, no effect here: {rule.why}"
        )
    elif isinstance(rule, Refuse):
        if not rule.accepts(value, ctx):
            raise ConfigError(key, f"{value!r} is not supported: {rule.reason}", rule.fix)
        ctx.note(rule.why or "the value given is the one temper always uses", key)
    elif isinstance(rule, Same):
        other = ctx.get(rule.other, MISSING)
        if other is not MISSING and other != value:
            raise ConfigError(
                key,
                f"{value!r} differs from {rule.other} ({other!r}); {rule.why}",
                f"set {key} to {other!r} or remove it",
            )
        ctx.note(f"same as {rule.other}; {rule.why}", key)
    elif isinstance(rule, Call):
        rule.fn(value, ctx)
    elif isinstance(rule, Gated):  # a table's mistake, found by the first test that reads it
        raise TypeError(f"{key}: ROLL tables have no Gated rules (use Refuse)")
    # Use: read by a derivation in roll_derive.
