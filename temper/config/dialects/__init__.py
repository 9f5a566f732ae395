"""Config dialects: verl and ROLL files translate into the native schema.

A dialect is a function ``translate(raw, catalog) -> Translation`` registered in
:data:`DIALECTS` under its name (the built-in ones lazily: a file loads only its own).
``detect`` picks one from the file's shape. Translations never drop a key silently:
each key is mapped to a native field, listed in ``notes`` (accepted, with why it has
no effect here), or rejected with a ``ConfigError`` naming the key, reason and fix.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

from temper.config.catalog import Catalog
from temper.config.errors import ConfigError
from temper.config.loader import RawConfig
from temper.config.schema import TemperConfig
from temper.registry import Registry


@dataclasses.dataclass
class Translation:
    """A dialect's output: a native config dict plus notes for ``temper check``.

    ``sources`` maps native keys to the key of the user's file that set them, and
    ``table`` native keys to the dialect key that sets them in general: errors found on
    the native config are told in the file's dialect with them (``core.in_dialect``).
    """

    native: dict[str, Any]
    notes: list[str] = dataclasses.field(default_factory=list)
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    table: dict[str, str] = dataclasses.field(default_factory=dict)


Translator = Callable[[RawConfig, Catalog], Translation]
DIALECTS: Registry[Translator] = Registry("dialect")


def register_dialect(name: str) -> Callable[[Translator], Translator]:
    """Decorator registering a translator under dialect ``name`` (``--dialect name``)."""

    def wrap(fn: Translator) -> Translator:
        DIALECTS.add(name, fn)
        return fn

    return wrap


def _builtin(module: str, function: str) -> Callable[[], Translator]:
    def load() -> Translator:
        translator: Translator = getattr(importlib.import_module(module), function)
        return translator

    return load


NATIVE_KEYS = {f.name for f in dataclasses.fields(TemperConfig)}
VERL_MARKERS = {
    "actor_rollout_ref",
    "trainer",
    "custom_reward_function",
    "ray_init",
    "backend_config",
    "reward_model",
    "ray_kwargs",
}
ROLL_MARKERS = {
    "actor_train",
    "actor_infer",
    "rollout_batch_size",
    "pretrain",
    "exp_name",
    "num_return_sequences_in_group",
    "train_env_manager",
    "track_with",
}


def detect(data: dict[str, Any]) -> str:
    """'native', 'verl' or 'roll' from the top-level keys: a dialect's own top-level keys
    (``trainer``, ``actor_train``, …) outvote the section names the native schema shares
    with them (``model``, ``data``, …)."""
    keys = set(data)
    scores = {"verl": len(keys & VERL_MARKERS), "roll": len(keys & ROLL_MARKERS)}
    best = max(scores, key=lambda k: scores[k])
    if scores[best] == 0:
        return "native"
    return best


@register_dialect("native")
def translate_native(raw: RawConfig, catalog: Catalog) -> Translation:
    return Translation(native=dict(raw.data))


DIALECTS.add_lazy("verl", _builtin("temper.config.dialects.verl.translate", "translate_verl"))
DIALECTS.add_lazy("roll", _builtin("temper.config.dialects.roll.translate", "translate_roll"))


def translate(raw: RawConfig, dialect: str, catalog: Catalog) -> tuple[str, Translation]:
    """Translate ``raw`` with ``dialect`` (``auto``: the detected one)."""
    name = detect(raw.data) if dialect == "auto" else dialect
    if name not in DIALECTS:
        raise ConfigError(
            "--dialect",
            f"unknown dialect '{name}'",
            f"use one of: auto, {', '.join(DIALECTS.names())}",
        )
    from temper.config.dialects.core.pipelines import refuse_other_pipelines

    refuse_other_pipelines(raw.data, name, raw.command)
    translation = DIALECTS.get(name)(raw, catalog)
    translation.notes[:0] = raw.notes  # the loader's (hydra.searchpath, runtime settings)
    return name, translation
