"""Derivations: the code that reads keys of a dialect file together (a mini-batch from a
per-device size, an accumulation count and a device mapping) — and what each declares it
reads, so that a table's :class:`rules.Use` row names the derivation that honours its key
(``temper check --explain``, ``docs/config.md``) and a test holds both sides to each other
and to what the derivation really reads (``tests/unit/config/test_derivations.py``).

A derivation is declared with :func:`derivation`: the keys it reads, dotted as the table
writes them (``*`` for any one segment: a reward domain's name, an env tag), and
templates with ``{name}`` placeholders expanded over the values given for them — a ROLL
derivation that loops over its roles declares ``"{role}.device_mapping"`` with
``role=ROLES``, the same tuple its loop runs over. A derivation that reads a section whole
(``ctx.get("rewards")``) and looks inside declares the keys it looks at.

A final pass that reads what other keys already wrote to the result (the device count
the trainer's keys set, the policy loss a recipe chose) declares those native fields too
(``fields=``): a field stands for whichever key of the file wrote it.

While a derivation runs, the keys it reads through :class:`context.Context`, the result
fields it reads through :class:`result.Result` and the derivations it calls are recorded
under its name when a :func:`recording` is active (the test's; nothing is kept otherwise).
A context also keeps, for its own run, the keys each derivation read (:func:`read`'s
answer): a :class:`rules.Use` row whose derivation did not read its key in this run is
noted as having no effect here, with the row's ``idle`` reason.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, cast

P = ParamSpec("P")
R = TypeVar("R", covariant=True)


class Derivation(Protocol, Generic[P, R]):
    """A derivation: a function of the translation context, with what it reads."""

    reads: frozenset[str]  # dotted keys, ``*`` for any one segment
    fields: frozenset[str]  # native fields of the result it reads (a section: its fields)
    explains: frozenset[str]  # keys it reads only to word a note (they may be inert)
    name: str  # as the manual names it: ``roll.derive.placement``

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R: ...


@dataclasses.dataclass
class Record:
    """What every derivation read while a :func:`recording` ran, by derivation name: the
    dialect's keys, the result's native fields, the derivations it called."""

    keys: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    fields: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    calls: dict[str, set[str]] = dataclasses.field(default_factory=dict)


_RUNNING: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("running", default=())
_RECORD: contextvars.ContextVar[Record | None] = contextvars.ContextVar("record", default=None)


def expand(template: str, over: dict[str, Iterable[str]]) -> list[str]:
    """The keys a template names: every combination of the values of its placeholders
    (``"{role}.world_size"`` over ``role=("a", "b")`` -> ``a.world_size``, ``b.world_size``)."""
    names = [n for n in over if "{" + n + "}" in template]
    if not names:
        return [template]
    values = [tuple(over[n]) for n in names]
    return [template.format(**dict(zip(names, combo))) for combo in itertools.product(*values)]


#: Every declared derivation, by name (the registry the manual and the tests read).
DECLARED: dict[str, Derivation[..., Any]] = {}


def derivation(
    *keys: str, explains: Iterable[str] = (), fields: Iterable[str] = (), **over: Iterable[str]
) -> Callable[[Callable[P, Any]], Derivation[P, Any]]:
    """Declare a derivation and the keys it reads (module docstring); ``explains``: keys
    it reads only to say in a note how the file's other keys come out (a table may call
    them inert); ``fields``: the native fields of the result it reads (templates too)."""
    explains = tuple(explains)
    reads = frozenset(k for template in (*keys, *explains) for k in expand(template, over))
    natives = frozenset(f for template in fields for f in expand(template, over))

    def wrap(fn: Callable[P, Any]) -> Derivation[P, Any]:
        name = f"{fn.__module__.removeprefix('temper.config.dialects.')}.{fn.__name__}"

        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> Any:
            running, record = _RUNNING.get(), _RECORD.get()
            if record is not None and running:
                record.calls.setdefault(running[-1], set()).add(name)
            token = _RUNNING.set((*running, name))
            try:
                return fn(*args, **kwargs)
            finally:
                _RUNNING.reset(token)

        declared = cast(Any, run)
        declared.reads, declared.name, declared.fields = reads, name, natives
        declared.explains = frozenset(explains)
        DECLARED[name] = declared
        return cast(Derivation[P, Any], declared)

    return wrap


def read(path: str) -> str | None:
    """``path`` was read (``Context.get``/``has``): recorded under the running derivation,
    whose name is returned (None outside every derivation)."""
    record, running = _RECORD.get(), _RUNNING.get()
    if not running:
        return None
    if record is not None:
        record.keys.setdefault(running[-1], set()).add(path)
    return running[-1]


def read_field(native: str) -> None:
    """Native field (or section) ``native`` of the result was read: recorded under the
    running derivation."""
    record, running = _RECORD.get(), _RUNNING.get()
    if record is not None and running:
        record.fields.setdefault(running[-1], set()).add(native)


@contextlib.contextmanager
def recording() -> Iterator[Record]:
    """Record what every derivation reads while the block runs (:class:`Record`)."""
    record = Record()
    token = _RECORD.set(record)
    try:
        yield record
    finally:
        _RECORD.reset(token)


def matches(key: str, pattern: str) -> bool:
    """Whether dotted ``key`` is ``pattern`` (``*`` in either matches any one segment)."""
    a, b = key.split("."), pattern.split(".")
    return len(a) == len(b) and all(x == y or "*" in (x, y) for x, y in zip(a, b))


def under(section: str, pattern: str) -> bool:
    """Whether ``section`` holds keys of ``pattern`` (a derivation that reads a section
    whole reads the keys under it that it declares)."""
    a, b = section.split("."), pattern.split(".")
    return len(a) < len(b) and matches(section, ".".join(b[: len(a)]))
