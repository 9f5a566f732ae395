"""A small name -> object registry with helpful errors.

Every algorithm family (advantage estimators, policy losses, KL estimators, …) is a
:class:`Registry` keyed by the name a config file uses. ``get`` of an unknown name raises
:class:`UnknownNameError`, whose message lists the valid names and suggests the closest one,
so the config validator (``temper check``) can say
``unknown adv_estimator 'grpoo', did you mean 'grpo'?``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """Raised for a name that is not registered.

    Attributes:
        kind: what the registry holds, e.g. ``"adv_estimator"``.
        name: the name that was asked for.
        valid: every valid name (aliases included), sorted.
        suggestion: the closest valid name, or ``None``.
    """

    def __init__(self, kind: str, name: object, valid: list[str]) -> None:
        self.kind = kind
        self.name = name
        self.valid = valid
        close = difflib.get_close_matches(str(name), valid, n=1, cutoff=0.6)
        self.suggestion: str | None = close[0] if close else None
        super().__init__(self.message)

    @property
    def message(self) -> str:
        hint = f", did you mean {self.suggestion!r}?" if self.suggestion else "."
        return f"unknown {self.kind} {self.name!r}{hint} Valid names: {', '.join(self.valid)}"

    def __str__(self) -> str:  # KeyError would quote the whole message
        return self.message


class Registry(Generic[T]):
    """Maps config names (and aliases) to objects.

    Example::

        LOSSES: Registry[Callable[..., Tensor]] = Registry("policy_loss")

        @LOSSES.register("vanilla", "ppo")
        def vanilla(...): ...

        LOSSES.get("vanilla") is LOSSES.get("ppo")
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._canonical: dict[str, str] = {}

    def register(self, name: str, *aliases: str) -> Callable[[T], T]:
        """Decorator registering an object under ``name`` and optional ``aliases``."""

        def decorator(obj: T) -> T:
            self.add(name, obj, *aliases)
            return obj

        return decorator

    def add(self, name: str, obj: T, *aliases: str) -> None:
        """Register ``obj`` under ``name`` and ``aliases``; re-registering a name raises."""
        for key in (name, *aliases):
            if key in self._items and self._items[key] is not obj:
                raise ValueError(f"{self.kind} {key!r} is already registered")
            self._items[key] = obj
            self._canonical[key] = name

    def get(self, name: str) -> T:
        """The object registered under ``name``; raises :class:`UnknownNameError`."""
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise UnknownNameError(self.kind, name, self.names()) from None

    def canonical(self, name: str) -> str:
        """The primary name for ``name`` (resolves aliases); raises for unknown names."""
        self.get(name)
        return self._canonical[name]

    def names(self) -> list[str]:
        """Every valid name, aliases included, sorted."""
        return sorted(self._items)

    def primary_names(self) -> list[str]:
        """Primary names only (no aliases), in registration order."""
        return list(dict.fromkeys(self._canonical.values()))

    def aliases(self) -> dict[str, str]:
        """``alias -> primary name`` for every alias."""
        return {k: v for k, v in self._canonical.items() if k != v}

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"
