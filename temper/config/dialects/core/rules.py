"""The rule kinds of every dialect's key table (verl's ``verl_sections.TABLE``, ROLL's
``roll_table.TOP``, …): what one key (a dotted path; a ROLL table's ``*`` matches any
one segment) becomes.

- :class:`Map` — the value arrives at a native field, optionally through a transform;
- :class:`Note` — accepted whatever its value, listed in the notes with why it has no
  effect here (only for keys that change speed or memory, never results);
- :class:`Refuse` — accepted with a note at the values it lists (``ok``), refused with
  a reason and a fix otherwise (at every value when it lists none);
- :class:`Gated` — a whole section that is inert while its gate key is off (profilers,
  sandboxes, …): every leaf is noted, and switching the gate on is refused;
- :class:`Call` — custom handling (collects state for the translator's final pass);
- :class:`Use` — read by a derivation (``by``: a :func:`derivation.derivation`, which
  declares the keys it reads), together with other keys; where the derivation reads it in
  some modes only, ``idle`` says why it has no effect in the others (noted when the
  derivation did not read it in the run);
- :class:`Same` — must repeat another key's value (one setting temper keeps once).

Transforms and predicates have one signature, ``fn(value, ctx)``: ``ctx`` is the
dialect's translation context (``ctx.get(key, default)`` reads the file, ``ctx.key`` is
the key being translated).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from temper.config.dialects.core.derivation import Derivation

Transform = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class Map:
    native: str
    fn: Transform | None = None
    weak: bool = False  # yields (with a note) to another key that sets the same field
    # the value verl's mandatory-value marker (``???``, unset) means here; None: the
    # temper default applies
    unset: Any = None
    also: tuple[str, ...] = ()  # more native fields that take the same value

    @property
    def natives(self) -> tuple[str, ...]:
        return (self.native, *self.also)


@dataclass(frozen=True)
class Note:
    why: str


@dataclass(frozen=True)
class Refuse:
    reason: str  # why another value is refused
    fix: str
    # the values accepted (a predicate ``fn(value, ctx)``, or the values themselves)
    ok: tuple[Any, ...] | Callable[[Any, Any], bool] = ()
    why: str = ""  # why an accepted value has no effect here (the note)

    def accepts(self, value: Any, ctx: Any) -> bool:
        return self.ok(value, ctx) if callable(self.ok) else value in self.ok


@dataclass(frozen=True)
class Gated:
    gate: str
    off: tuple[Any, ...]
    why: str
    reason: str
    fix: str


@dataclass(frozen=True)
class Call:
    fn: Callable[[Any, Any], None]


@dataclass(frozen=True)
class Use:
    what: str  # what the derivation makes of the key (the native keys it sets)
    by: Derivation[..., Any]  # the derivation that reads it (and declares that it does)
    # why the key has no effect in a run whose derivation did not read it (a mode that
    # does not read it): noted "no effect here (<idle>)"; "": the derivation always reads it
    idle: str = ""


@dataclass(frozen=True)
class Same:
    other: str
    why: str


Rule = Map | Note | Refuse | Gated | Call | Use | Same


#: What a :class:`Refuse` row's accepted value notes when the row says no more.
ALWAYS = "the value given is the one temper always uses"


def meaning(rule: Rule) -> tuple[tuple[str, ...], str]:
    """What a rule does with its key, in every dialect: (native keys it sets, how) —
    ``temper check --explain`` and the manual."""
    if isinstance(rule, Map):
        return rule.natives, "sets " + ", ".join(rule.natives) + (" (converted)" if rule.fn else "")
    return (), describe(rule)


def describe(rule: Rule) -> str:
    """How :func:`meaning` says what a rule does with its key."""
    if isinstance(rule, Map):
        return meaning(rule)[1]
    if isinstance(rule, Refuse):
        refused = f"refused: {rule.reason}. Fix: {rule.fix}"
        if rule.ok == ():
            return refused
        return f"accepted at its inert value(s) ({rule.why or ALWAYS}); otherwise {refused}"
    if isinstance(rule, Note):
        return f"accepted, no effect here: {rule.why}"
    if isinstance(rule, Gated):
        return (
            f"inert while {rule.gate} is off ({rule.why}); otherwise refused: {rule.reason}. "
            f"Fix: {rule.fix}"
        )
    if isinstance(rule, Use):
        idle = f"; where it does not read it, no effect ({rule.idle})" if rule.idle else ""
        return f"read by the derivation {rule.by.name}: {rule.what}{idle}"
    if isinstance(rule, Same):
        return f"must equal {rule.other}: {rule.why}"
    # a Call's docstring says what it does with the key (its first paragraph)
    doc = " ".join((rule.fn.__doc__ or "").split("\n\n")[0].split())
    return doc or "read by the translation's own rule together with related keys"
