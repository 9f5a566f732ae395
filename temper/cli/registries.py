"""Names every registry accepts, for config validation (``temper check`` says
"unknown adv_estimator 'grpoo', did you mean 'grpo'?" from these)."""

from __future__ import annotations

import importlib


def registry_names() -> dict[str, list[str]]:
    """Config key -> valid names, gathered from the registries of every layer."""
    names: dict[str, list[str]] = {}
    algorithms = importlib.import_module("temper.algorithms")
    names.update({k: list(v) for k, v in algorithms.registry_names().items()})
    try:
        rewards = importlib.import_module("temper.rewards")
        names["reward_function"] = list(rewards.reward_function_names())
    except (ImportError, AttributeError):
        pass
    training = importlib.import_module("temper.training.registry")
    names["strategy"] = sorted(training.ENGINES)
    rollout = importlib.import_module("temper.rollout.registry")
    names["rollout_engine"] = sorted([*rollout.ROLLOUT_ENGINES, "auto"])
    envs = importlib.import_module("temper.envs.registry")
    names["env_type"] = sorted(envs.env_types())
    return names
