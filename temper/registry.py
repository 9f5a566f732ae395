"""The one name -> object registry of temper, and its "did you mean".

Every pluggable family is a :class:`Registry` keyed by the name a config file uses:
advantage estimators, policy losses, KL estimators (``temper.algorithms``), training
engines (``temper.training.registry``), rollout engines (``temper.rollout.registry``),
reward functions (``temper.rewards.registry``), environments (``temper.envs.registry``),
tools (``temper.envs.tools``) and pipelines (``temper.pipelines``). ``get`` of an unknown
name raises :class:`UnknownNameError`, whose message lists the valid names and suggests
the closest one; the config layer turns it into a ``ConfigError`` naming the key.

This module is the bottom of the layer table: it imports nothing of temper, so every
layer (``config`` and ``algorithms`` included) may use it.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


def closest(name: object, choices: Iterable[str]) -> str | None:
    """The choice most like ``name`` (difflib ratio ≥ 0.6), or None."""
    close = difflib.get_close_matches(str(name), list(choices), n=1, cutoff=0.6)
    return close[0] if close else None


def did_you_mean(name: object, choices: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest choice, or ``""``."""
    match = closest(name, choices)
    return f" (did you mean '{match}'?)" if match else ""


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
        self.suggestion: str | None = closest(name, valid)
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

    Entries may be *lazy* (:meth:`add_lazy`): a loader called on the first ``get``, for
    entries whose module imports something heavy or optional.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._lazy: dict[str, Callable[[], T]] = {}
        self._canonical: dict[str, str] = {}

    def register(self, name: str, *aliases: str) -> Callable[[T], T]:
        """Decorator registering an object under ``name`` and optional ``aliases``."""

        def decorator(obj: T) -> T:
            self.add(name, obj, *aliases)
            return obj

        return decorator

    def add(self, name: str, obj: T, *aliases: str, replace: bool = False) -> None:
        """Register ``obj`` under ``name`` and ``aliases``; registering another object
        under a taken name raises unless ``replace``."""
        for key in (name, *aliases):
            taken = key in self._lazy or (key in self._items and self._items[key] is not obj)
            if taken and not replace:
                raise ValueError(f"{self.kind} {key!r} is already registered")
            self._lazy.pop(key, None)
            self._items[key] = obj
            self._canonical[key] = name

    def add_lazy(self, name: str, loader: Callable[[], T]) -> None:
        """Register ``name`` whose object ``loader()`` builds on first use."""
        if name in self._items or name in self._lazy:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._lazy[name] = loader
        self._canonical[name] = name

    def get(self, name: str) -> T:
        """The object registered under ``name``; raises :class:`UnknownNameError`."""
        if isinstance(name, str) and name in self._lazy:
            self._items[name] = self._lazy.pop(name)()
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise UnknownNameError(self.kind, name, self.names()) from None

    def canonical(self, name: str) -> str:
        """The primary name for ``name`` (resolves aliases); raises for unknown names."""
        if name not in self:
            raise UnknownNameError(self.kind, name, self.names())
        return self._canonical[name]

    def names(self) -> list[str]:
        """Every valid name, aliases included, sorted."""
        return sorted({*self._items, *self._lazy})

    def primary_names(self) -> list[str]:
        """Primary names only (no aliases), in registration order."""
        return list(dict.fromkeys(self._canonical.values()))

    def aliases(self) -> dict[str, str]:
        """``alias -> primary name`` for every alias."""
        return {k: v for k, v in self._canonical.items() if k != v}

    def copy(self) -> Registry[T]:
        """A registry with the same entries (lazy ones still lazy), to register into
        without touching this one (a test's plugins)."""
        other: Registry[T] = Registry(self.kind)
        other._items = dict(self._items)
        other._lazy = dict(self._lazy)
        other._canonical = dict(self._canonical)
        return other

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._items or name in self._lazy)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"
