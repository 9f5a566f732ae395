"""The ROLL translation's context (:class:`Ctx`): every key is mapped, noted, refused, or
read by a derivation (``roll.derive``), as :mod:`core.apply` applies the rules of every
dialect; a key the table lacks is a ``ConfigError`` with "did you mean". The walk is
:mod:`core.walk`'s; the RL pipelines' table is ``roll_table.TOP``, the SFT
pipeline's ``roll.sft``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from temper.config.dialects import Translation
from temper.config.dialects.core import paths
from temper.config.dialects.core.context import Context
from temper.config.dialects.core.rules import Gated, Refuse, Rule, Same
from temper.config.dialects.core.walk import KeyTable
from temper.config.errors import ConfigError, did_you_mean
from temper.config.loader import RawConfig


class Ctx(Context):
    """ROLL's context: the walk's :class:`walk.Walker` (the result is written by the
    writer every dialect shares, ``Context.out``). ``unbuilt``: the workers (top-level
    sections) a pipeline builds none of, with why; their keys are not checked."""

    def __init__(self, data: dict[str, Any], unbuilt: dict[str, str] | None = None) -> None:
        super().__init__(data)
        self.used: list[Any] = []  # values of keys read by rules (for definition refs)
        self.unbuilt = unbuilt or {}

    def unread(self, rule: Rule, value: Any) -> bool:
        """A worker the pipeline does not build checks nothing: its refusals, gates and
        agreements with other workers are noted as having no effect (what it maps is still
        written, for the pipeline's own drop to note)."""
        why = self.unbuilt.get(self.path.split(".", 1)[0])
        if why is None or not isinstance(rule, Refuse | Gated | Same):
            return False
        for leaf in paths.leaves(value, self.key):
            self.inert(why, leaf)
        return True

    # ------------------------------------------------------------------ the walk's

    def apply(self, rule: Rule, value: Any, stars: Sequence[str]) -> None:
        self.used.append(value)
        super().apply(rule, value, stars)

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
    ctx.settle()
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
