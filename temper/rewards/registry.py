"""Registry of built-in reward functions, keyed by the ``reward.function`` name.

Every entry has verl's signature ``compute_score(data_source, solution_str,
ground_truth, extra_info=None, **kwargs) -> float | dict``; a dict carries ``"score"``
plus extra fields the manager records as metrics. ``custom`` is not an entry: it names
the user function of ``reward.custom_function`` (see ``temper.rewards.custom``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temper.rewards.functions import (
    arithmetic,
    auto,
    countdown,
    crossthinkqa,
    format_regex,
    gsm8k,
    math_boxed,
)

RewardFunction = Callable[..., Any]

REWARD_FUNCTIONS: dict[str, RewardFunction] = {
    "auto": auto.compute_score,
    "gsm8k": gsm8k.compute_score,
    "math": math_boxed.compute_score,
    "arithmetic": arithmetic.compute_score,
    "countdown": countdown.compute_score,
    "format": format_regex.compute_score,
    "crossthinkqa": crossthinkqa.compute_score,
}

CUSTOM = "custom"


def register_reward_function(name: str, fn: RewardFunction) -> None:
    """Add a built-in under ``name`` (visible to worker processes only if registered at
    import time of a module they import; prefer ``reward.custom_function`` for user code)."""
    if name in REWARD_FUNCTIONS or name == CUSTOM:
        raise ValueError(f"reward function {name!r} is already registered")
    REWARD_FUNCTIONS[name] = fn


def reward_function_names() -> list[str]:
    """Valid ``reward.function`` / ``reward.routes.*.function`` values."""
    return sorted([*REWARD_FUNCTIONS, CUSTOM])


def get_reward_function(name: str, key: str = "reward.function") -> RewardFunction:
    """The built-in named ``name``; ``ConfigError`` (with did-you-mean) otherwise."""
    if name in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS[name]
    from temper.config.errors import unknown_name

    raise unknown_name(key, name, reward_function_names())
