"""The one exception a bad config raises: it names the key, the reason and the fix."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration problem found before anything heavy runs.

    ``str(err)`` is one line: ``<key>: <reason>. Fix: <fix>``.
    """

    def __init__(self, key: str, reason: str, fix: str = "") -> None:
        self.key = key
        self.reason = reason
        self.fix = fix
        msg = f"{key}: {reason}" if key else reason
        if fix:
            msg += f". Fix: {fix}"
        super().__init__(msg)


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest choice, or ''."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def unknown_name(key: str, name: str, valid: Iterable[str]) -> ConfigError:
    """Error for a value that must be one of a registry's names."""
    valid = sorted(valid)
    return ConfigError(
        key,
        f"unknown value '{name}'{did_you_mean(name, valid)}",
        f"use one of: {', '.join(valid)}",
    )
