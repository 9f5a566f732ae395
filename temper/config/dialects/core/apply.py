"""What a table's rule does with the key it matched, written once for every dialect.

The walk (:mod:`core.walk`) hands each key it finds a rule for to :func:`apply`, with the
value the file holds and the segments its ``*`` matched. The rule's meaning is the same
in verl and ROLL; what differs between the dialects is said by their context
(:class:`context.Context`): which value is a dialect's unset marker (verl's ``???``), how
a mapped value reaches its native field (verl's are converted to the field's type), and
which sections a dialect does not read at all (verl's critic without a critic).

The one refusal wording (:func:`refusal`): ``<key>: <reason> (got <value>). Fix: <fix>``
— the key, the reason, the value the file gave (a section by its keys), the fix; a value
outside a closed list of names (a choice transform's, a logger's) is refused in it too
(:func:`unsupported`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from temper.config.dialects.core import paths
from temper.config.dialects.core.paths import MISSING
from temper.config.dialects.core.rules import (
    ALWAYS,
    Call,
    Gated,
    Map,
    Note,
    Refuse,
    Rule,
    Same,
    Use,
)
from temper.config.errors import ConfigError, did_you_mean


class Applying(Protocol):
    """What applying a rule reads and writes of a dialect's context
    (:class:`context.Context`, which applies its table's rules through this module)."""

    key: str
    UNSET_NOTE: str

    def get(self, path: str, default: Any = None) -> Any: ...

    def note(self, reason: str, key: str | None = None) -> None: ...

    def inert(self, why: str, key: str | None = None) -> None: ...

    def unset(self, value: Any) -> bool: ...

    def unread(self, rule: Rule, value: Any) -> bool: ...

    def put(self, native: str, value: Any, given: Any, weak: bool = False) -> None: ...

    def use(self, rule: Use) -> None: ...


def shown(value: Any) -> str:
    """A value as a one-line message shows it: a section by its keys, not its contents,
    a long list cut (a string, a path or a class, in full: the user looks for it)."""
    if isinstance(value, dict):
        return "a section with " + ", ".join(map(str, value)) if value else "{}"
    text = repr(value)
    return text if len(text) <= 80 or isinstance(value, str) else text[:77] + "..."


def refusal(key: str, reason: str, value: Any, fix: str) -> ConfigError:
    """The refusal of ``key`` at ``value`` (the module docstring's wording)."""
    return ConfigError(key, f"{reason} (got {shown(value)})", fix)


def unsupported(key: str, value: Any, valid: Sequence[str], what: str = "value") -> ConfigError:
    """The refusal of ``value`` at ``key``, which takes one of the names ``valid``
    (``what``: what they name, a logger's)."""
    return refusal(
        key,
        f"this {what} is not supported",
        value,
        f"use one of: {', '.join(valid)}{did_you_mean(str(value), valid)}",
    )


def apply(ctx: Applying, rule: Rule, value: Any, stars: Sequence[str] = ()) -> None:
    """Apply ``rule`` to the key being translated (``ctx.key``), which holds ``value``;
    ``stars``: the segments the row's ``*`` matched (a :class:`Map`'s ``{0}``)."""
    key = ctx.key
    if ctx.unread(rule, value):
        return
    if isinstance(rule, Map):
        _map(ctx, rule, value, stars)
    elif isinstance(rule, Note):
        for leaf in paths.leaves(value, key):
            ctx.inert(rule.why, leaf)
    elif isinstance(rule, Refuse):
        # a dialect's unset marker is inert wherever a row lists the values it accepts
        listed = not callable(rule.ok)
        if not (rule.accepts(value, ctx) or (listed and ctx.unset(value))):
            raise refusal(key, rule.reason, value, rule.fix)
        for leaf in paths.leaves(value, key):  # a section: each of its leaves
            ctx.note(f"accepted at its inert value ({rule.why or ALWAYS})", leaf)
    elif isinstance(rule, Gated):
        _gated(ctx, rule, value)
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
    else:  # Use: read by the derivation the row names (rule.by), which runs after the walk
        assert isinstance(rule, Use)
        ctx.use(rule)


def _map(ctx: Applying, rule: Map, value: Any, stars: Sequence[str]) -> None:
    marker = ctx.unset(value)
    if marker and rule.unset is None:
        ctx.note(f"{ctx.UNSET_NOTE}: the temper default applies")
        return
    if marker:  # the value the marker means here, in native terms
        ctx.note(f"{ctx.UNSET_NOTE}: {rule.native}={rule.unset}")
        out = rule.unset
    else:
        out = rule.fn(value, ctx) if rule.fn else value
    for native in rule.natives:
        ctx.put(native.format(*stars), out, value, rule.weak)


def _gated(ctx: Applying, rule: Gated, value: Any) -> None:
    if value is None:
        ctx.note(f"accepted at its inert value ({rule.why})")
        return
    if not isinstance(value, dict):
        raise ConfigError(ctx.key, f"expected a mapping, got {value!r}", "")
    gate = value.get(rule.gate, rule.off[0])
    if gate not in rule.off:
        raise refusal(f"{ctx.key}.{rule.gate}", rule.reason, gate, rule.fix)
    for leaf in paths.leaves(value, ctx.key):
        ctx.note(f"accepted at its inert value ({rule.why})", leaf)
