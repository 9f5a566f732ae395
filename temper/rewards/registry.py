"""Registry of built-in reward functions, keyed by the ``reward.function`` name.

Every entry has verl's signature ``compute_score(data_source, solution_str,
ground_truth, extra_info=None, **kwargs) -> float | dict``; a dict carries ``"score"``
plus extra fields the manager records as metrics. ``custom`` is not an entry: it names
the user function of ``reward.custom_function`` (see ``temper.rewards.custom``), and
neither is ``llm_judge``: a judge model scores those samples (``temper.rewards.judge``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temper.registry import Registry
from temper.rewards.functions import (
    arithmetic,
    auto,
    code,
    countdown,
    crossthinkqa,
    format_regex,
    gsm8k,
    ifeval,
    math_boxed,
    visual,
)

RewardFunction = Callable[..., Any]

REWARD_FUNCTIONS: Registry[RewardFunction] = Registry("reward function")
REWARD_FUNCTIONS.add("auto", auto.compute_score)
REWARD_FUNCTIONS.add("gsm8k", gsm8k.compute_score)
REWARD_FUNCTIONS.add("math", math_boxed.compute_score)
REWARD_FUNCTIONS.add("arithmetic", arithmetic.compute_score)
REWARD_FUNCTIONS.add("countdown", countdown.compute_score)
REWARD_FUNCTIONS.add("format", format_regex.compute_score)
REWARD_FUNCTIONS.add("crossthinkqa", crossthinkqa.compute_score)
REWARD_FUNCTIONS.add("code", code.compute_score)
REWARD_FUNCTIONS.add("ifeval", ifeval.compute_score)
REWARD_FUNCTIONS.add("visual_color", visual.visual_color_score)
REWARD_FUNCTIONS.add("geo3k", visual.geo3k_score)

CUSTOM = "custom"
# Scored by the LLM judge (temper.rewards.judge) in the driver, not by a worker function.
JUDGE = "llm_judge"
# Functions that run programs: the manager passes them ``sandbox=`` (reward.sandbox*).
SANDBOXED = frozenset({"code", "auto"})


def register_reward_function(name: str, fn: RewardFunction) -> None:
    """Add a built-in under ``name`` (visible to worker processes only if registered at
    import time of a module they import; prefer ``reward.custom_function`` for user code)."""
    if name in (CUSTOM, JUDGE):
        raise ValueError(f"reward function {name!r} is already registered")
    REWARD_FUNCTIONS.add(name, fn)


def reward_function_names() -> list[str]:
    """Valid ``reward.function`` / ``reward.routes.*.function`` values."""
    return sorted([*REWARD_FUNCTIONS, CUSTOM, JUDGE])


def get_reward_function(name: str, key: str = "reward.function") -> RewardFunction:
    """The built-in named ``name``; ``ConfigError`` (with did-you-mean) otherwise."""
    if name in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS.get(name)
    from temper.config.errors import unknown_name

    raise unknown_name(key, name, reward_function_names())
