"""A saved LoRA adapter to train on from (``model.lora.adapter_path``).

The adapter's own ``adapter_config.json`` says what it is — rank, alpha, dropout, the
modules it adapts and those it leaves out — so those become ``model.lora``'s before the
config is validated: the plan (the reference as the base under the adapters, the random
draws of LoRA dropout) and every engine then see the adapter that will be loaded, as
verl's FSDP workers take ``PeftModel.from_pretrained``'s config over ``lora_rank``.
A directory that is not there yet leaves the section as written; the model pre-flight
(:func:`check_adapter_dir`) refuses it before anything trains.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from temper.config.errors import ConfigError
from temper.config.schema import LoraConfig, TemperConfig

ADAPTER_CONFIG = "adapter_config.json"
#: peft's saved weights, in either format it writes.
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
#: ``adapter_config.json`` keys -> ``model.lora`` fields.
SAVED_FIELDS = {
    "r": "rank",
    "lora_alpha": "alpha",
    "lora_dropout": "dropout",
    "target_modules": "target_modules",
    "exclude_modules": "exclude_modules",
}
KEY = "model.lora.adapter_path"


def saved_config(path: str) -> dict[str, Any] | None:
    """The adapter's ``adapter_config.json`` (None when the directory has none)."""
    file = Path(path).expanduser() / ADAPTER_CONFIG
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(
            KEY,
            f"{file} is not readable JSON ({err})",
            "point it at a peft adapter saved by save_pretrained",
        ) from err
    if not isinstance(data, dict) or data.get("peft_type", "LORA") != "LORA":
        raise ConfigError(
            KEY,
            f"{file} is not a LoRA adapter's config (peft_type {data.get('peft_type')!r})"
            if isinstance(data, dict)
            else f"{file} does not hold a JSON object",
            "point it at a LoRA adapter saved by peft's save_pretrained",
        )
    return data


def take_adapter_config(cfg: TemperConfig) -> list[str]:
    """Write the saved adapter's settings onto ``cfg.model.lora``; the notes say which
    values of the file's own section they replaced."""
    lora = cfg.model.lora
    if not lora.adapter_path:
        return []
    saved = saved_config(lora.adapter_path)
    if saved is None:
        return []
    notes = []
    defaults = LoraConfig()
    for saved_key, field in SAVED_FIELDS.items():
        value = saved.get(saved_key)
        if saved_key == "target_modules" and isinstance(value, list):
            value = sorted(value)  # peft saves a set: its order is not the adapter's
        if value is None and saved_key != "exclude_modules":
            continue
        mine = getattr(lora, field)
        if mine != value and mine != getattr(defaults, field):
            notes.append(
                f"model.lora.{field}: {mine!r} -> {value!r} (the adapter at "
                f"{lora.adapter_path} was saved with it)"
            )
        setattr(lora, field, value)
    return notes


def check_adapter_dir(lora: LoraConfig) -> None:
    """Pre-flight: an adapter directory with its config and weights."""
    if not lora.adapter_path:
        return
    where = Path(lora.adapter_path).expanduser()
    if saved_config(lora.adapter_path) is None:
        raise ConfigError(
            KEY,
            f"no {ADAPTER_CONFIG} in {where} (not a saved peft adapter)",
            "point it at the directory peft's save_pretrained wrote (a checkpoint's "
            "adapter export), or remove it to start fresh adapters",
        )
    if not any((where / name).is_file() for name in ADAPTER_WEIGHTS):
        raise ConfigError(
            KEY,
            f"{where} has {ADAPTER_CONFIG} but no adapter weights ({' or '.join(ADAPTER_WEIGHTS)})",
            "save the adapter again with save_pretrained",
        )
