"""Errors found after translation, told in the dialect of the file the user wrote.

Validation and derived-value checks run on the native config, so their errors name
native keys (``actor.mini_batch_size``, ``resources.backend``). A verl or ROLL user
cannot write those keys in their file — a fix that says ``resources.backend=local``
makes a verl file fail with "unknown verl key". So an error raised on a translated
config is rewritten before it is shown: its key becomes the key of the user's file that
set that native field, and every native key named in its fix becomes the dialect key
that sets it — the one this file used, else the dialect's key for that field — with the
unit conversion said where the dialect counts differently (verl's
``ppo_mini_batch_size`` counts prompts, temper's ``mini_batch_size`` samples). A native
key with no counterpart in the dialect is named as a native key, marked as such.

A batch-size fix carries its numbers in samples (``ConfigError.bound``); where the
dialect counts the key in bigger units (:data:`SCALES`) the numbers are restated in
them — a verl user whose ``ppo_mini_batch_size: 32`` exceeds 16 prompts reads "≤ 16",
not the 32 samples those 16 prompts make.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from collections.abc import Callable
from typing import Any

from temper.config.errors import BOUND, ConfigError
from temper.config.schema import TemperConfig

#: How the dialects count differently: native key -> (dialect -> note after its key).
UNITS: dict[str, dict[str, str]] = {
    "actor.mini_batch_size": {
        "verl": " (in prompts: temper's samples ÷ rollout.n)",
        "roll": " (via per_device_train_batch_size × gradient_accumulation_steps × "
        "data-parallel size)",
    },
    "critic.mini_batch_size": {
        "verl": " (in prompts: temper's samples ÷ rollout.n)",
        "roll": " (via per_device_train_batch_size × gradient_accumulation_steps × "
        "data-parallel size)",
    },
}


def _sequence_parallel_size(role: str) -> Callable[[TemperConfig], str]:
    """The native key of ``role``'s sequence-parallel size as verl's token budgets count
    it: the context-parallel size of a Megatron role, else the Ulysses size."""

    def key(cfg: TemperConfig) -> str:
        if getattr(cfg, role).strategy == "megatron":
            return f"{role}.megatron.context_parallel_size"
        return f"{role}.ulysses_sequence_parallel_size"

    return key


#: Keys a dialect counts in units of several samples (or tokens): native key -> (dialect
#: -> (the native key whose value is the size of a unit, or a function of the config
#: naming it; the unit's name; what the native key counts)). A fix's bound is restated
#: in them.
SCALES: dict[str, dict[str, tuple[str | Callable[[TemperConfig], str], str, str]]] = {
    "actor.mini_batch_size": {"verl": ("rollout.n", "prompts", "samples")},
    "critic.mini_batch_size": {"verl": ("rollout.n", "prompts", "samples")},
    # verl's *_max_token_len_per_gpu count one sequence-parallel rank's tokens
    # (the verl dialect multiplies them by the role's size; ``verl.py``)
    **{
        f"{role}.max_token_len_per_device": {
            "verl": (_sequence_parallel_size(role), "tokens per sequence-parallel rank", "tokens")
        }
        for role in ("actor", "critic")
    },
}
#: Native keys that no dialect key sets directly, with what to write instead.
PHRASES: dict[str, dict[str, str]] = {
    "model.path": {"verl": "actor_rollout_ref.model.path", "roll": "pretrain"},
    "data.train_files": {"verl": "data.train_files", "roll": "actor_train.data_args.file_name"},
    "data.val_files": {"verl": "data.val_files", "roll": "validation.data_args.file_name"},
    "critic.model_path": {"verl": "critic.model.path", "roll": "reward_pretrain"},
    "rollout.response_length": {
        "verl": "data.max_response_length",
        "roll": "response_length (or actor_infer.generating_args.max_new_tokens)",
    },
    "resources.backend": {
        "verl": "one device (trainer.nnodes=1 and trainer.n_gpus_per_node=1: one process; "
        "more devices run on Ray)",
        "roll": "one device in every device_mapping (one process; more devices run on Ray)",
    },
    # a value's own phrase (``key=value`` in a fix): the dialects pick Ray by device count
    "resources.backend=ray": {
        "verl": "more than one device (trainer.nnodes × trainer.n_gpus_per_node > 1: Ray)",
        "roll": "more than one device in the device_mappings (more devices run on Ray)",
    },
    "reference.enable": {
        "verl": "actor_rollout_ref.actor.use_kl_loss / algorithm.use_kl_in_reward (a KL term "
        "turns the reference on)",
        "roll": "use_kl_loss / add_token_level_kl (a KL term turns the reference on)",
    },
    "agentic.train_env_manager": {"roll": "train_env_manager"},
    "agentic.custom_envs": {"roll": "custom_envs"},
    "resources.devices_per_node": {
        "verl": "trainer.n_gpus_per_node",
        "roll": "num_gpus_per_node",
    },
    # neither framework has the key: temper's flag sets it for a file of any dialect
    "experiment.overwrite": {
        "verl": "the --overwrite flag of temper train",
        "roll": "the --overwrite flag of temper train",
    },
}


#: Native value names the dialects spell differently (training strategies).
SPELLING: dict[str, dict[str, str]] = {
    "roll": {
        "fsdp2": "fsdp2_train",
        "torch": "hf_train",
        "deepspeed": "deepspeed_train",
        "megatron": "megatron_train",
    },
    "verl": {"torch": "fsdp (one device)"},
}
# the valid values an error lists for a training strategy (``unknown_name``'s fix)
_VALID = re.compile(r"(use one of: )([\w, ]+)")


@functools.cache
def native_keys() -> frozenset[str]:
    """Every dotted path of the native schema (sections and fields)."""
    out: set[str] = set()

    def walk(cls: Any, prefix: str) -> None:
        for f in dataclasses.fields(cls):
            path = f"{prefix}{f.name}"
            out.add(path)
            tp = typing.get_type_hints(cls)[f.name]
            if dataclasses.is_dataclass(tp):
                walk(tp, f"{path}.")

    walk(TemperConfig, "")
    return frozenset(out)


#: Native values the dialects spell differently, per native key: ``key=value`` in a fix
#: is written with the dialect's value.
VALUES: dict[str, dict[str, dict[str, str]]] = {
    "rollout.engine": {"roll": {"hf": "hf_infer"}},
    "experiment.resume_mode": {"roll": {"auto": "true", "disable": "false"}},
    **{
        f"{role}.strategy": {"roll": SPELLING["roll"], "verl": SPELLING["verl"]}
        for role in ("actor", "critic")
    },
}

#: Dialect keys that set a native boolean inverted: ``key=value`` in a fix names the
#: dialect key with the opposite value (verl's ``bypass_mode: true`` is
#: ``actor.recompute_old_log_prob: false``).
INVERTED: frozenset[str] = frozenset({"algorithm.rollout_correction.bypass_mode"})
_OPPOSITE = {"true": "false", "false": "true", "True": "False", "False": "True"}

_TOKEN = re.compile(r"(?<![\w.])([a-z_]+(?:\.[a-z_]+)+)(?![\w.])(=[^\s,;)]+)?")


def in_dialect(
    err: ConfigError,
    dialect: str,
    sources: dict[str, str],
    table: dict[str, str],
    config: TemperConfig | None = None,
) -> ConfigError:
    """``err`` with its key and fix in ``dialect`` terms (see the module doc).

    ``sources``: native key -> the dialect key of this file that set it; ``table``: native
    key -> the dialect key that sets it in general (from the dialect's key table);
    ``config``: the native config, whose values scale a bound (None before it exists).
    """
    if dialect == "native" or err.dialect is not None:  # native, or told already
        return err
    # the schema's paths, and entries of its mappings the dialect writes
    # (``actor.policy_loss_kwargs.dro_beta``)
    keys = native_keys() | set(table) | set(sources)

    def dialect_key(native: str) -> str | None:
        return sources.get(native) or table.get(native)

    def word(m: re.Match[str]) -> str:
        native, value = m.group(1), m.group(2) or ""
        if native not in keys:
            return m.group(0)
        # a phrase first: a source that set a derived key (resources.backend from
        # n_gpus_per_node) does not take the native value
        found = None if native in PHRASES else dialect_key(native)
        if found is not None:
            spelled = VALUES.get(native, {}).get(dialect, {})
            if found in INVERTED:
                spelled = _OPPOSITE
            if value:
                value = "=" + spelled.get(value[1:], value[1:])
            return found + value + UNITS.get(native, {}).get(dialect, "")
        phrase = PHRASES.get(native + value, PHRASES.get(native, {})).get(dialect)
        if phrase is not None:  # a phrase says what to write; the native value does not fit it
            return phrase if " " in phrase or not value else phrase + value
        return f"{m.group(0)} (a temper key)"

    key = err.key
    if key in sources:
        key = f"{sources[key]} (temper: {err.key})"
    elif key in keys:
        found = dialect_key(key) or PHRASES.get(key, {}).get(dialect)
        if found is None:
            # the nearest section this file set (``actor.megatron`` -> its role's key)
            parent = key
            while "." in parent and found is None:
                parent = parent.rsplit(".", 1)[0]
                found = sources.get(parent)
        key = f"{found} (temper: {err.key})" if found else f"{err.key} (a temper key)"
    reason, fix = _bound_in_units(err, dialect, config)
    fix = _TOKEN.sub(word, fix) if fix else fix
    if err.key.endswith(".strategy"):  # engine names as the dialect spells them
        spelling = SPELLING.get(dialect, {})
        fix = _VALID.sub(
            lambda m: m.group(1) + ", ".join(spelling.get(v, v) for v in m.group(2).split(", ")),
            fix,
        )
    return ConfigError(key, reason, fix, dialect=dialect)


def _bound_in_units(err: ConfigError, dialect: str, config: TemperConfig | None) -> tuple[str, str]:
    """The reason and fix of ``err`` with its bound in the dialect's units (:data:`SCALES`;
    the reason says what the refused value is in them), else as they are."""
    scale = SCALES.get(err.key, {}).get(dialect)
    if err.bound is None or scale is None or config is None:
        return err.reason, err.fix
    where, name, counted = scale
    path = where(config) if callable(where) else where
    unit: Any = config
    for part in path.split("."):
        unit = getattr(unit, part)
    bound = err.bound.in_units(int(unit))
    if bound is None:
        return err.reason, err.fix
    value = err.bound.value
    reason = err.reason
    if unit > 1 and value % unit == 0:
        reason += f" ({value} {counted} = {value // unit} {name} × {path} {unit})"
    return reason, err.template.replace(BOUND, bound.text())
