"""Config dialects: verl and ROLL files translate into the native schema.

A dialect is a function ``translate(raw) -> Translation`` registered under its name.
``detect`` picks one from the file's shape. Translations never drop a key silently:
each key is mapped to a native field, listed in ``notes`` (accepted, with why it has
no effect here), or rejected with a ``ConfigError`` naming the key, reason and fix.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import Any

from temper.config.errors import ConfigError
from temper.config.loader import RawConfig
from temper.config.schema import TemperConfig


@dataclasses.dataclass
class Translation:
    """A dialect's output: a native config dict plus notes for ``temper check``.

    ``sources`` maps native keys to the key of the user's file that set them, and
    ``table`` native keys to the dialect key that sets them in general: errors found on
    the native config are told in the file's dialect with them (``in_dialect``).
    """

    native: dict[str, Any]
    notes: list[str] = dataclasses.field(default_factory=list)
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    table: dict[str, str] = dataclasses.field(default_factory=dict)


Translator = Callable[[RawConfig], Translation]
DIALECTS: dict[str, Translator] = {}
BUILTIN = ("native", "verl", "roll")


def register_dialect(name: str) -> Callable[[Translator], Translator]:
    def wrap(fn: Translator) -> Translator:
        DIALECTS[name] = fn
        return fn

    return wrap


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
def translate_native(raw: RawConfig) -> Translation:
    return Translation(native=dict(raw.data))


def translate(raw: RawConfig, dialect: str = "auto") -> tuple[str, Translation]:
    """Translate ``raw`` with ``dialect`` (or the detected one)."""
    name = detect(raw.data) if dialect == "auto" else dialect
    if name in BUILTIN and name not in DIALECTS:
        # Each dialect module registers itself on import; load only the one used.
        importlib.import_module(f"temper.config.dialects.{name}")
    if name not in DIALECTS:
        raise ConfigError(
            "--dialect", f"unknown dialect '{name}'", f"use one of: auto, {', '.join(BUILTIN)}"
        )
    from temper.config.dialects.pipelines import refuse_other_pipelines

    refuse_other_pipelines(raw.data, name)
    translation = DIALECTS[name](raw)
    translation.notes[:0] = raw.notes  # the loader's (hydra.searchpath, runtime settings)
    return name, translation
