"""Typed configuration: schema, YAML loading, dialects, derived values, validation."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

from temper.config.dialects import translate
from temper.config.errors import ConfigError
from temper.config.loader import load_yaml
from temper.config.schema import TemperConfig
from temper.config.typed import from_dict, to_dict

__all__ = ["ConfigError", "LoadedConfig", "TemperConfig", "load_config", "to_dict"]


@dataclasses.dataclass
class LoadedConfig:
    """A validated native config and how it was obtained."""

    config: TemperConfig
    dialect: str
    notes: list[str]
    source: str


def load_config(
    path: str | Path,
    overrides: list[str] | None = None,
    dialect: str = "auto",
    names: Mapping[str, Sequence[str]] | None = None,
) -> LoadedConfig:
    """Load a native, verl or ROLL YAML file into a validated ``TemperConfig``.

    ``names`` (registry name lists from higher layers) lets validation reject
    unknown estimator/loss/reward names. Raises ``ConfigError`` (key, reason, fix)
    before anything heavy is imported.
    """
    from temper.config.validate import validate

    raw = load_yaml(path, overrides)
    name, translation = translate(raw, dialect)
    cfg = from_dict(TemperConfig, translation.native)
    validate(cfg, names)
    return LoadedConfig(config=cfg, dialect=name, notes=translation.notes, source=str(path))


def build_config(data: dict, validate_it: bool = True) -> TemperConfig:
    """A ``TemperConfig`` from a native dict (tests and programmatic use)."""
    from temper.config.validate import validate

    cfg = from_dict(TemperConfig, data)
    if validate_it:
        validate(cfg)
    return cfg
