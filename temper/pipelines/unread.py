"""Keys a pipeline reads nothing of, refused with why: a pipeline that is not RL (SFT,
DPO, generation, evaluation) lists the sections and keys of the shared schema its run
never reads, so a setting there is told rather than ignored."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.config.typed import diff_from_default


def first_leaf(diff: dict[str, Any], prefix: str) -> str:
    """The dotted key of the first value set in ``diff`` (a section's diff from default)."""
    key, value = next(iter(diff.items()))
    if isinstance(value, dict) and value:
        return first_leaf(value, f"{prefix}.{key}")
    return f"{prefix}.{key}"


_UNSET = object()


def _set_value(cfg: TemperConfig, key: str) -> Any:
    """How dotted ``key`` differs from its default (a nested section: its diff), or
    ``_UNSET``."""
    *parents, leaf = key.split(".")
    node: Any = cfg
    for part in parents:
        node = getattr(node, part)
    return diff_from_default(node).get(leaf, _UNSET)


def is_set(cfg: TemperConfig, key: str) -> bool:
    """Whether dotted ``key`` differs from its default."""
    return _set_value(cfg, key) is not _UNSET


def refuse_unread(
    cfg: TemperConfig, pipeline: str, sections: Mapping[str, str], keys: Mapping[str, str]
) -> None:
    """``ConfigError`` for the first key set in one of ``sections`` or among ``keys``
    (each mapped to why the pipeline reads nothing of it)."""
    for section, why in sections.items():
        diff = diff_from_default(getattr(cfg, section))
        if diff:
            key = first_leaf(diff, section)
            raise ConfigError(key, f"{why} (pipeline {pipeline})", f"remove {key}")
    for key, why in keys.items():
        value = _set_value(cfg, key)
        if value is not _UNSET:
            leaf = first_leaf(value, key) if isinstance(value, dict) and value else key
            raise ConfigError(leaf, f"{why} (pipeline {pipeline})", f"remove {leaf}")


def refuse_run_keys(
    cfg: TemperConfig, pipeline: str, why: str, reads: Mapping[str, tuple[str, ...]]
) -> None:
    """``ConfigError`` for the first ``experiment`` or ``resources`` key set that the
    pipeline does not read (``reads``: section -> the keys it reads): a pipeline that
    writes one file has no run directory, steps, checkpoints, trackers or placement."""
    for section in ("experiment", "resources"):
        allowed = reads.get(section, ())
        diff = diff_from_default(getattr(cfg, section))
        diff = {k: v for k, v in diff.items() if k not in allowed}
        if diff:
            key = first_leaf(diff, section)
            raise ConfigError(key, f"{why} (pipeline {pipeline})", f"remove {key}")
