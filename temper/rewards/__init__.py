"""Rewards: rule functions, user functions, reward models, and the reward manager.

Public entry points (imported lazily so reward worker processes stay light):

- ``RewardScorer.from_config(cfg: TemperConfig, device=...)`` → ``scorer``
- ``scorer.score_batch(batch, tokenizer, prefix="train")`` →
  ``RewardOutput(scores (B,), token_level_scores (B, R), metrics, failures)``
- ``scorer.close()``
- ``reward_function_names()``, ``get_reward_function(name)``, ``RewardModel``
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "RewardScorer": "temper.rewards.manager",
    "RewardOutput": "temper.rewards.manager",
    "RewardFailure": "temper.rewards.manager",
    "RewardExecutor": "temper.rewards.executor",
    "RewardCall": "temper.rewards.executor",
    "CallResult": "temper.rewards.executor",
    "FunctionSpec": "temper.rewards.worker",
    "RewardModel": "temper.rewards.model",
    "REWARD_FUNCTIONS": "temper.rewards.registry",
    "get_reward_function": "temper.rewards.registry",
    "register_reward_function": "temper.rewards.registry",
    "reward_function_names": "temper.rewards.registry",
    "load_custom_function": "temper.rewards.custom",
    "place_at_last_token": "temper.rewards.placement",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'temper.rewards' has no attribute {name!r}")
