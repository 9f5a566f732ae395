"""What every dialect's translation context is: the file's data as the table's keys
read it (``get``, ``has``), the key being translated (``key``, set as the walk enters
it), and refusals that name it (``error``). Transforms, predicates and ``Call`` bodies
see this much of any dialect's context; how each writes native keys and words its notes
stays its own (verl: weak and strong writes, notes grouped by reason; ROLL: one writer a
field, a note a key)."""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core import paths
from temper.config.errors import ConfigError


class Context:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.key = ""  # the key being translated, as the user wrote it

    def get(self, path: str, default: Any = None) -> Any:
        return paths.get(self.data, path, default)

    def has(self, path: str) -> bool:
        return paths.has(self.data, path)

    @property
    def leaf(self) -> str:
        return self.key.rsplit(".", 1)[-1]

    def error(self, reason: str, fix: str) -> ConfigError:
        """A refusal of the key being translated."""
        return ConfigError(self.key, reason, fix)

    def enter(self, path: str) -> bool:
        """The walk's (:class:`walk.Walker`): ``path`` is translated next."""
        self.key = path
        return True
