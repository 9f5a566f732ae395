"""Typed configuration: schema, YAML loading, dialects, derived values, validation."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from temper.config.catalog import Catalog
from temper.config.derive import Derived
from temper.config.dialects import translate
from temper.config.errors import ConfigError
from temper.config.loader import load_yaml
from temper.config.lora_adapter import take_adapter_config
from temper.config.plan import StepShape
from temper.config.schema import TemperConfig
from temper.config.typed import from_dict, to_dict

__all__ = [
    "Catalog",
    "ConfigError",
    "Derived",
    "LoadedConfig",
    "StepShape",
    "TemperConfig",
    "build_config",
    "load_config",
    "to_dict",
]


@dataclasses.dataclass
class LoadedConfig:
    """A validated native config, its plan, and how it was obtained.

    ``plan`` is the one :class:`~temper.config.derive.Derived` of the run (validation
    computes it; nothing derives it again). ``sources`` / ``table`` map native keys to the
    keys of the file's dialect (see ``dialects.in_dialect``): :meth:`in_dialect` tells a
    later error about the native config (the pre-flight's, the run's) in the user's keys.
    """

    config: TemperConfig
    plan: Derived
    dialect: str
    notes: list[str]
    source: str
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    table: dict[str, str] = dataclasses.field(default_factory=dict)

    def in_dialect(self, err: ConfigError) -> ConfigError:
        from temper.config.dialects.core.in_dialect import in_dialect

        return in_dialect(err, self.dialect, self.sources, self.table, self.config)


def load_config(
    path: str | Path,
    overrides: Sequence[str] | None = None,
    dialect: str = "auto",
    *,
    catalog: Catalog,
    command: str = "train",
) -> LoadedConfig:
    """Load a native, verl or ROLL YAML file into a validated ``TemperConfig`` and plan.

    Every config-only check runs here — the schema's types, each section, registry
    names and the batch arithmetic (``validate``), then what the run's pipeline cannot
    honour in combination (``catalog.check``) — so one translation tells every error in
    the keys of the file the user wrote. Raises ``ConfigError`` (key, reason, fix) before
    anything heavy is imported. ``command`` is the temper command that reads the file
    (``RawConfig.command``: a dialect whose file serves several entry points reads it as
    that command's).
    """
    from temper.config.dialects.core.in_dialect import in_dialect
    from temper.config.validate import validate

    raw = dataclasses.replace(load_yaml(path, list(overrides or [])), command=command)
    if not raw.data:
        raise ConfigError(str(path), "the config is empty", "write a native, verl or ROLL config")
    name, translation = translate(raw, dialect, catalog)
    cfg: TemperConfig | None = None
    try:
        cfg = from_dict(TemperConfig, translation.native)
        translation.notes.extend(take_adapter_config(cfg))  # before the plan: it is LoRA
        plan = validate(cfg, catalog)
        catalog.check(cfg, plan)
    except ConfigError as err:  # told in the file's own keys
        raise in_dialect(err, name, translation.sources, translation.table, cfg) from err
    return LoadedConfig(
        config=cfg,
        plan=plan,
        dialect=name,
        notes=translation.notes,
        source=str(path),
        sources=translation.sources,
        table=translation.table,
    )


def build_config(data: dict, catalog: Catalog) -> TemperConfig:
    """A validated native ``TemperConfig`` from a dict (tests and programmatic use): the
    checks of :func:`load_config`, in native keys."""
    from temper.config.validate import validate

    cfg = from_dict(TemperConfig, data)
    take_adapter_config(cfg)
    catalog.check(cfg, validate(cfg, catalog))
    return cfg
