"""The ``Catalog`` over every registry of temper: what config validation asks of the
layers above it (:mod:`temper.config.catalog`), answered from the registries themselves.

- ``names(registry)``: the names a registry holds now (a registration made in this
  process — a test's, a plugin's — is selectable by config at once);
- ``needs(registry, name)``: what an entry declares it needs (an estimator's ``values``,
  an engine's way of splitting devices);
- ``step_shape(cfg)`` / ``pipeline_uses(cfg)`` / ``check(cfg, plan)``: the hooks of the
  config's pipeline (a registered name or the user's own by path) — its step's shape, the
  optional parts of a run it uses, and its checks after the driver's own.

:func:`load_config`, :func:`build_config` and :func:`plan` are the config layer's
functions with this catalog: what the CLI, the tests and programmatic users call.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from temper.config import LoadedConfig, TemperConfig
from temper.config import build_config as _build_config
from temper.config import load_config as _load_config
from temper.config.derive import Derived
from temper.config.plan import StepShape
from temper.pipelines.registry import resolve_pipeline


def _registry(module: str, name: str) -> Any:
    """A registry by module attribute, looked up at each call (so a test that swaps the
    module's registry is seen)."""
    return getattr(importlib.import_module(module), name)


def _algorithms(key: str) -> Callable[[], Sequence[str]]:
    return lambda: _registry("temper.algorithms", "REGISTRIES")[key].names()


def _reward_functions() -> Sequence[str]:
    names: Sequence[str] = importlib.import_module("temper.rewards").reward_function_names()
    return names


def _rollout_engines() -> Sequence[str]:
    names: Sequence[str] = importlib.import_module("temper.rollout.registry").rollout_engine_names()
    return names


def _env_types() -> Sequence[str]:
    names: Sequence[str] = importlib.import_module("temper.envs.registry").env_types()
    return names


#: Schema ``registry=`` name -> the names it holds now.
NAMES: dict[str, Callable[[], Sequence[str]]] = {
    **{
        key: _algorithms(key)
        for key in (
            "adv_estimator",
            "policy_loss",
            "kl_penalty",
            "loss_agg_mode",
            "kl_ctrl.type",
            "reward_norm",
            "reward_normalization.method",
            "pf_ppo.reweight_method",
            "rollout_correction.rollout_is",
            "rollout_correction.rollout_rs_stat",
            "rollout_correction.rollout_rs_level",
            "dpo_loss",
            "reward_model_loss",
            "kd_objective",
        )
    },
    "strategy": lambda: _registry("temper.training.registry", "ENGINES").names(),
    "rollout_engine": _rollout_engines,
    "reward_function": _reward_functions,
    "env_type": _env_types,
    "env_manager": lambda: _registry("temper.pipelines.env_managers", "ENV_MANAGERS").names(),
    "tracker": lambda: _registry("temper.tracking", "TRACKERS").names(),
    "lr_scheduler": lambda: _registry("temper.training.schedule", "SCHEDULES").names(),
    "row_format": lambda: _registry("temper.data.row_formats", "ROW_FORMATS").names(),
    "router_replay": lambda: _registry("temper.training.router_replay", "ROUTER_REPLAY").names(),
}

#: Registries whose entries declare needs: name -> the registry (module, attribute).
NEEDS: dict[str, tuple[str, str]] = {
    "adv_estimator": ("temper.algorithms.advantages", "ADV_ESTIMATORS"),
    "strategy": ("temper.training.registry", "ENGINES"),
}


class RegistryCatalog:
    """:class:`temper.config.catalog.Catalog` over temper's registries."""

    def names(self, registry: str) -> Sequence[str]:
        return NAMES[registry]()

    def needs(self, registry: str, name: str) -> frozenset[str]:
        entries = _registry(*NEEDS[registry])
        if name not in entries:
            return frozenset()  # validation reports the unknown name itself
        needs: frozenset[str] = entries.get(name).needs
        return needs

    def step_shape(self, cfg: TemperConfig) -> StepShape:
        return resolve_pipeline(cfg.pipeline).step_shape(cfg)

    def pipeline_uses(self, cfg: TemperConfig) -> frozenset[str]:
        return resolve_pipeline(cfg.pipeline).uses

    def check(self, cfg: TemperConfig, plan: Derived) -> None:
        from temper.pipelines.checks import check_run

        check_run(cfg, plan)
        resolve_pipeline(cfg.pipeline).check(cfg)


CATALOG = RegistryCatalog()


def load_config(
    path: str | Path,
    overrides: Sequence[str] | None = None,
    dialect: str = "auto",
    command: str = "train",
) -> LoadedConfig:
    """A native, verl or ROLL file, validated against every registry, with its plan, as
    ``temper <command>`` reads it (verl's ``ppo_trainer.yaml`` is a generation for
    ``generate``: verl's ``main_generation_server`` composes it)."""
    return _load_config(path, overrides, dialect, catalog=CATALOG, command=command)


def build_config(data: dict[str, Any]) -> TemperConfig:
    """A native config from a dict, validated as :func:`load_config` validates."""
    return _build_config(data, CATALOG)


def plan(cfg: TemperConfig) -> Derived:
    """The plan of a config built in code, after the checks :func:`load_config` runs (a
    loaded config carries its own plan)."""
    from temper.config.validate import validate

    derived = validate(cfg, CATALOG)
    CATALOG.check(cfg, derived)
    return derived
