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
    """A validated native config and how it was obtained.

    ``sources`` / ``table`` map native keys to the keys of the file's dialect (see
    ``dialects.in_dialect``): :meth:`in_dialect` tells a later error about the native
    config (the pre-flight's) in the user's own keys.
    """

    config: TemperConfig
    dialect: str
    notes: list[str]
    source: str
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    table: dict[str, str] = dataclasses.field(default_factory=dict)

    def in_dialect(self, err: ConfigError) -> ConfigError:
        from temper.config.dialects.in_dialect import in_dialect

        return in_dialect(err, self.dialect, self.sources, self.table)


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
    from temper.config.dialects.in_dialect import in_dialect
    from temper.config.validate import validate

    raw = load_yaml(path, overrides)
    if not raw.data:
        raise ConfigError(str(path), "the config is empty", "write a native, verl or ROLL config")
    name, translation = translate(raw, dialect)
    try:
        cfg = from_dict(TemperConfig, translation.native)
        validate(cfg, names)
    except ConfigError as err:  # told in the file's own keys
        raise in_dialect(err, name, translation.sources, translation.table) from err
    return LoadedConfig(
        config=cfg,
        dialect=name,
        notes=translation.notes,
        source=str(path),
        sources=translation.sources,
        table=translation.table,
    )


def build_config(data: dict, validate_it: bool = True) -> TemperConfig:
    """A ``TemperConfig`` from a native dict (tests and programmatic use)."""
    from temper.config.validate import validate

    cfg = from_dict(TemperConfig, data)
    if validate_it:
        validate(cfg)
    return cfg
