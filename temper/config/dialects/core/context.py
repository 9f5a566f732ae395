"""What every dialect's translation context is: the file's data as the table's keys
read it (``get``, ``has``), the key being translated (``key``, set as the walk enters
it), refusals that name it (``error``), and the one writer of the result (``out``: a
:class:`result.Result`, whose write, conflict and note policy every dialect shares).
Transforms, predicates, ``Call`` bodies and derivations see this much of any dialect's
context. It applies the table's rules (:mod:`core.apply`, the same for every dialect); a
dialect's conventions are what it overrides: its unset marker (:meth:`Context.unset`),
how a mapped value reaches its native field (:meth:`Context.put`), which rows it leaves
unread (:meth:`Context.unread`).

It keeps what each derivation read in this run (:attr:`Context.derived`), so that a
:class:`rules.Use` row whose derivation did not read its key here is noted with the row's
``idle`` reason (:meth:`Context.settle`, which the dialect's driver calls after its final
pass)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temper.config.dialects.core import apply, derivation, paths
from temper.config.dialects.core.result import Result
from temper.config.dialects.core.rules import Rule, Use
from temper.config.errors import ConfigError


class Context:
    #: what a note says a key held at the dialect's unset marker (:meth:`unset`)
    UNSET_NOTE = "unset"

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.key = ""  # the key being translated, as the user wrote it
        self.path = ""  # the same as the data's keys read it (a dialect may show a prefix)
        self.out = Result()
        self.derived: dict[str, set[str]] = {}  # derivation -> the keys it read in this run
        self.uses: list[tuple[str, str, Use]] = []  # (key, path, rule): Use rows applied

    def get(self, path: str, default: Any = None) -> Any:
        self._read(path)
        return paths.get(self.data, path, default)

    def has(self, path: str) -> bool:
        self._read(path)
        return paths.has(self.data, path)

    def _read(self, path: str) -> None:
        name = derivation.read(path)
        if name is not None:
            self.derived.setdefault(name, set()).add(path)

    @property
    def leaf(self) -> str:
        return self.key.rsplit(".", 1)[-1]

    def error(self, reason: str, fix: str) -> ConfigError:
        """A refusal of the key being translated."""
        return ConfigError(self.key, reason, fix)

    def enter(self, path: str) -> bool:
        """The walk's (:class:`walk.Walker`): ``path`` is translated next."""
        self.key = self.path = path
        return True

    def apply(self, rule: Rule, value: Any, stars: Sequence[str]) -> None:
        """The walk's: apply ``rule`` to the key entered (:func:`apply.apply`)."""
        apply.apply(self, rule, value, stars)

    # ------------------------------------------------------------------ the dialect's

    def unset(self, value: Any) -> bool:
        """Whether ``value`` is the dialect's unset marker (none by default)."""
        return False

    def unread(self, rule: Rule, value: Any) -> bool:
        """Whether the dialect reads nothing of the key entered, which holds ``value`` (its
        leaves are noted here with why); False by default."""
        return False

    def put(self, native: str, value: Any, given: Any, weak: bool = False) -> None:
        """A :class:`rules.Map` row's write of ``value`` (made of the file's ``given``) to
        native field ``native``, as the key entered."""
        self.out.write(native, value, self.key, weak)

    def use(self, rule: Use) -> None:
        """The key entered is read by ``rule.by`` (checked in :meth:`settle`)."""
        self.uses.append((self.key, self.path, rule))

    def settle(self) -> None:
        """After the final pass: a Use row whose derivation did not read its key (nor a
        section above it, nor a key inside it) in this run is noted with its ``idle``
        reason — it has no effect here."""
        for key, path, rule in self.uses:
            if not rule.idle:
                continue  # a row that gives no idle reason is read whenever its derivation runs
            read = self.derived.get(rule.by.name, set())
            hit = any(
                derivation.matches(path, r)
                or derivation.under(r, path)
                or derivation.under(path, r)
                for r in read
            )
            if not hit:
                self.inert(rule.idle, key)

    # ------------------------------------------------------------------ the result

    def write(self, native: str, value: Any, key: str | None = None) -> None:
        """Set native field ``native`` as ``key`` (default: the key being translated)."""
        self.out.write(native, value, key or self.key)

    def replace(self, native: str, value: Any, key: str) -> None:
        """Set ``native`` over what another key set, credited to ``key`` (a final pass)."""
        self.out.replace(native, value, key)

    def native_get(self, native: str, default: Any = None) -> Any:
        """The value written to native field (or section) ``native``."""
        return self.out.get(native, default)

    def note(self, reason: str, key: str | None = None) -> None:
        """Note ``key`` (default: the key being translated) under ``reason``."""
        self.out.note(reason, key or self.key)

    def inert(self, why: str, key: str | None = None) -> None:
        """Note that ``key`` is accepted and has no effect here, and why."""
        self.note(f"no effect here ({why})", key)

    def unnote(self, key: str) -> None:
        self.out.unnote(key)

    def remark(self, line: str) -> None:
        """A note line that says what a derivation did, kept as written."""
        self.out.remark(line)
