"""The one exception a bad config raises: it names the key, the reason and the fix."""

from __future__ import annotations

from collections.abc import Iterable

from temper.registry import UnknownNameError, did_you_mean

__all__ = ["ConfigError", "did_you_mean", "unknown_name", "unknown_registered"]


class ConfigError(ValueError):
    """A configuration problem found before anything heavy runs.

    ``str(err)`` is one line: ``<key>: <reason>. Fix: <fix>``. ``dialect``: the dialect
    the key and fix are told in, once translated (``dialects.in_dialect``); None while
    they are native keys.
    """

    def __init__(self, key: str, reason: str, fix: str = "", dialect: str | None = None) -> None:
        self.key = key
        self.reason = reason
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
