"""What a dialect file translates to, written once for every dialect: the native fields
its keys set (each with the key that set it) and the notes on its keys.

The write policy (:meth:`Result.write`), the same for verl and ROLL:

- a native field takes the first value written to it, and remembers the key that wrote
  it (errors found later on the native config name that key: ``core.in_dialect``);
- writing the value it holds again changes nothing;
- ``None`` (null) is the weakest value: a key that leaves a field null yields, silently,
  to any key that gives it a value, in either order;
- a *weak* write (a key that only restates what another key sets, e.g. a default that
  an older key carried) yields to a strong one, in either order, and the key that lost
  is noted as overridden;
- two strong writes of different values are a conflict: ``ConfigError`` at the later
  key, naming both keys and both values.

A final pass that derives a field from the whole file (a re-count of devices, a loss's
pinned aggregation) overwrites with :meth:`Result.replace` instead, naming the key it
credits. What it reads of the result it reads through :meth:`Result.get`,
:meth:`Result.written` or :meth:`Result.section`, which a derivation's recording sees
(``core.derivation``: a derivation declares the fields it reads).

The notes policy: a note is a reason and the keys it is about, one line per reason with
every key it covers, keys first (``"key1, key2: <reason>"``: every line ``temper check``
prints, error or note, starts with the keys it is about), in the order the reasons first
came; a key is listed once per reason. A line that says what a derivation did is a
:meth:`Result.remark`, kept as written (it starts with its key too), in order.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from temper.config.dialects.core import derivation, paths
from temper.config.errors import ConfigError


class Written(NamedTuple):
    """One native field's value, the key of the file that set it, whether it was weak."""

    value: Any
    key: str
    weak: bool = False


class Result:
    """The native fields and notes of one translation (the policy: the module docstring)."""

    def __init__(self) -> None:
        self.fields: dict[str, Written] = {}
        self._notes: dict[str, list[str]] = {}  # reason -> its keys
        # the lines in first-seen order: (a reason of _notes, False) or (a remark, True)
        self._lines: list[tuple[str, bool]] = []

    # ------------------------------------------------------------------ native fields

    def write(self, native: str, value: Any, key: str, weak: bool = False) -> None:
        """Set ``native`` to ``value`` as key ``key`` (the policy above)."""
        old = self.fields.get(native)
        if old is None or (old.value is None and value is not None):
            self.fields[native] = Written(value, key, weak)
            return
        if value is None or value == old.value:
            return
        if weak and not old.weak:
            self.note(f"overridden by {old.key} (both set {native})", key)
            return
        if old.weak and not weak:
            self.note(f"overridden by {key} (both set {native})", old.key)
            self.fields[native] = Written(value, key, weak)
            return
        raise ConfigError(
            key,
            f"sets {native} to {value!r} but {old.key} sets it to {old.value!r}",
            f"make {key} and {old.key} agree (temper has one {native})",
        )

    def replace(self, native: str, value: Any, key: str) -> None:
        """Set ``native`` over whatever was written, credited to ``key`` (a final pass)."""
        self.fields[native] = Written(value, key)

    def drop(self, native: str) -> Written | None:
        """Unset ``native`` (what was written there, if anything)."""
        return self.fields.pop(native, None)

    def written(self, native: str, default: Any = None) -> Written:
        """What was written to ``native`` (value, key, weak), or ``default`` set by no key."""
        derivation.read_field(native)
        return self.fields.get(native) or Written(default, "")

    def section(self, *prefixes: str) -> list[tuple[str, Written]]:
        """Every field written under the sections ``prefixes``, in writing order."""
        for prefix in prefixes:
            derivation.read_field(prefix)
        return [
            (k, w) for k, w in self.fields.items() if k.startswith(tuple(p + "." for p in prefixes))
        ]

    def get(self, native: str, default: Any = None) -> Any:
        """The value written to ``native`` — a section's, nested, when only keys under it
        were written — or ``default``."""
        derivation.read_field(native)
        if native in self.fields:
            return self.fields[native].value
        prefix = native + "."
        under = [
            (k[len(prefix) :], w.value) for k, w in self.fields.items() if k.startswith(prefix)
        ]
        return paths.nest(sorted(under)) if under else default

    def source(self, native: str, default: str = "") -> str:
        """The key that set ``native``."""
        derivation.read_field(native)
        written = self.fields.get(native)
        return default if written is None else written.key

    def native(self) -> dict[str, Any]:
        """Every field written, as the nested native config."""
        return paths.nest((k, w.value) for k, w in sorted(self.fields.items()))

    def sources(self) -> dict[str, str]:
        """Native field -> the key of the file that set it."""
        return {native: w.key for native, w in self.fields.items()}

    # ------------------------------------------------------------------ notes

    def note(self, reason: str, key: str) -> None:
        """Note ``key`` under ``reason`` (once)."""
        if reason not in self._notes:
            self._notes[reason] = []
            self._lines.append((reason, False))
        if key not in self._notes[reason]:
            self._notes[reason].append(key)

    def unnote(self, key: str) -> None:
        """Take ``key`` out of every note (a final pass gave it a meaning after all)."""
        for keys in self._notes.values():
            if key in keys:
                keys.remove(key)

    def remark(self, line: str) -> None:
        """A note line kept as written."""
        self._lines.append((line, True))

    def notes(self) -> list[str]:
        """The notes as ``temper check`` lists them."""
        out = []
        for text, remark in self._lines:
            if remark:
                out.append(text)
            elif self._notes[text]:
                out.append(f"{', '.join(self._notes[text])}: {text}")
        return out
