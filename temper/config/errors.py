"""The one exception a bad config raises: it names the key, the reason and the fix."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Literal

from temper.registry import UnknownNameError, did_you_mean

__all__ = [
    "BOUND",
    "Bound",
    "ConfigError",
    "did_you_mean",
    "nearest_divisor",
    "unknown_name",
    "unknown_registered",
]

#: Where a fix's :class:`Bound` is written in its text.
BOUND = "{bound}"


def nearest_divisor(n: int, near: int) -> int:
    """The divisor of ``n`` closest to ``near`` (the smaller one on a tie)."""
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return min(divisors, key=lambda d: (abs(d - near), d))


@dataclasses.dataclass(frozen=True)
class Bound:
    """What a fix asks of a size counted in samples (or tokens), kept as numbers: at most
    ``limit``, at least ``limit``, a divisor of ``limit`` (near the refused ``value``), or
    a multiple of ``limit``.

    A dialect that counts the same key in bigger units (verl's ``ppo_mini_batch_size``
    counts prompts of ``rollout.n`` samples each; its token budgets count the tokens of
    one sequence-parallel rank) restates it with :meth:`in_units`, so the number a user
    reads is one they can write (``dialects.in_dialect``).
    """

    relation: Literal["at_most", "at_least", "divisor_of", "multiple_of"]
    limit: int
    value: int

    def text(self) -> str:
        if self.relation == "at_most":
            return f"≤ {self.limit}"
        if self.relation == "at_least":
            return f"≥ {self.limit}"
        if self.relation == "divisor_of":
            return f"a divisor of {self.limit}, e.g. {nearest_divisor(self.limit, self.value)}"
        return f"a multiple of {self.limit}"

    def in_units(self, unit: int) -> Bound | None:
        """The same bound on a count of units of ``unit`` samples each (``x`` units are
        ``x × unit`` samples); None where no count of whole units meets it."""
        if unit < 1 or self.limit < 1:
            return None
        value = max(1, round(self.value / unit))
        if self.relation == "at_most":
            return Bound("at_most", self.limit // unit, value) if self.limit >= unit else None
        if self.relation == "at_least":  # x·unit ≥ L  <=>  x ≥ ⌈L / unit⌉
            return Bound("at_least", -(-self.limit // unit), value)
        if self.relation == "divisor_of":  # x·unit divides L  <=>  x divides L / unit
            return (
                Bound("divisor_of", self.limit // unit, value) if self.limit % unit == 0 else None
            )
        # x·unit is a multiple of L  <=>  x is a multiple of L / gcd(L, unit)
        return Bound("multiple_of", self.limit // math.gcd(self.limit, unit), value)


class ConfigError(ValueError):
    """A configuration problem found before anything heavy runs.

    ``str(err)`` is one line: ``<key>: <reason>. Fix: <fix>``. ``dialect``: the dialect
    the key and fix are told in, once translated (``dialects.in_dialect``); None while
    they are native keys. ``bound``: the numbers of a batch-size fix, written where the
    fix says :data:`BOUND` (``template`` keeps the fix with the placeholder, so a
    translation can restate the bound in its own units).
    """

    def __init__(
        self,
        key: str,
        reason: str,
        fix: str = "",
        dialect: str | None = None,
        bound: Bound | None = None,
    ) -> None:
        self.key = key
        self.reason = reason
        self.template = fix
        self.bound = bound
        fix = fix.replace(BOUND, bound.text()) if bound is not None else fix
        self.fix = fix
        self.dialect = dialect
        msg = f"{key}: {reason}" if key else reason
        if fix:
            msg += f". Fix: {fix}"
        super().__init__(msg)


def unknown_name(key: str, name: str, valid: Iterable[str]) -> ConfigError:
    """Error for a value that must be one of a registry's names."""
    valid = sorted(valid)
    return ConfigError(
        key,
        f"unknown value '{name}'{did_you_mean(name, valid)}",
        f"use one of: {', '.join(valid)}",
    )


def unknown_registered(key: str, err: UnknownNameError) -> ConfigError:
    """The ``ConfigError`` of config ``key`` for a registry's :class:`UnknownNameError`."""
    return unknown_name(key, str(err.name), err.valid)
