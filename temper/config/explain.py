"""``temper check --explain KEY``: what one key means, in any dialect.

A native key prints its doc, type and default (every schema field has a one-line doc);
a verl or ROLL key prints what it becomes here — the native keys it sets, each
explained, or why it is accepted without effect or refused.
"""

from __future__ import annotations

import json
from typing import Any

from temper.config.catalog import Catalog
from temper.config.dialects.roll.translate import key_meaning as roll_meaning
from temper.config.dialects.verl.translate import key_meaning as verl_meaning
from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.config.typed import FieldInfo, field_info


def _value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False) if value is not None else "null"


def _native_lines(info: FieldInfo, catalog: Catalog, indent: str = "  ") -> list[str]:
    lines = [f"{indent}{info.doc}", f"{indent}type: {info.type}; default: {_value(info.default)}"]
    if info.registry is not None:
        names = ", ".join(catalog.names(info.registry))
        lines.append(f"{indent}values (the {info.registry} registry): {names}")
    return lines


def explain_key(key: str, catalog: Catalog) -> list[str]:
    """The lines ``temper check --explain key`` prints; ConfigError for an unknown key."""
    lines: list[str] = []
    native = field_info(TemperConfig, key)
    if native is not None:
        lines += [f"{key} (temper key)", *_native_lines(native, catalog)]
    for dialect, meaning in (("verl", verl_meaning(key)), ("ROLL", roll_meaning(key))):
        if meaning is None:
            continue
        targets, how = meaning
        lines.append(f"{key} ({dialect} key): {how}")
        for target in targets:
            info = field_info(TemperConfig, target)
            if info is not None:
                lines += [f"  {target}:", *_native_lines(info, catalog, "    ")]
    if not lines:
        raise ConfigError(
            key,
            "not a key of the native schema, nor one verl or ROLL key temper translates",
            "write its full dotted path (actor.clip_ratio_high, "
            "actor_rollout_ref.actor.clip_ratio_high, actor_train.training_args.learning_rate)",
        )
    return lines
