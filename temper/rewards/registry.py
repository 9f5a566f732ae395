"""Registry of built-in reward functions, keyed by the ``reward.function`` name.

Every entry has verl's signature ``compute_score(data_source, solution_str,
ground_truth, extra_info=None, **kwargs) -> float | dict``; a dict carries ``"score"``
plus extra fields the manager records as metrics. ``custom`` is not an entry: it names
the user function of ``reward.custom_function`` (see ``temper.rewards.custom``), and
neither is ``llm_judge``: a judge model scores those samples (``temper.rewards.judge``).

An entry may declare *needs*: inputs beyond the four columns that the reward manager
passes, as keyword arguments of these names, to that entry only —

- ``model_type``: the policy model's ``config.model_type`` (None when unreadable);
- ``image_sizes``: the sample's images as the model saw them, ``[(width, height), ...]``
  (empty for a text prompt);
- ``progress``: the training step over the run's total steps (0 outside training).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from temper.registry import Registry
from temper.rewards.functions import (
    arithmetic,
    auto,
    code,
    countdown,
    crossthinkqa,
    detection,
    format_regex,
    gsm8k,
    ifeval,
    math_boxed,
    video_r1,
    visual,
)

RewardFunction = Callable[..., Any]

# The needs an entry may declare (module doc).
MODEL_TYPE = "model_type"
IMAGE_SIZES = "image_sizes"
PROGRESS = "progress"
REWARD_INPUTS = frozenset({MODEL_TYPE, IMAGE_SIZES, PROGRESS})


@dataclasses.dataclass(frozen=True)
class RewardEntry:
    """A built-in reward function, the inputs it needs (of :data:`REWARD_INPUTS`), and
    ``check``: what its keyword arguments must be (raises ``ValueError`` naming the
    argument), run by ``temper check`` and again when the scorer is built."""

    fn: RewardFunction
    needs: frozenset[str] = frozenset()
    check: Callable[[Mapping[str, Any]], None] | None = None

    def __post_init__(self) -> None:
        unknown = self.needs - REWARD_INPUTS
        if unknown:
            raise ValueError(
                f"unknown reward inputs {sorted(unknown)} (known: {sorted(REWARD_INPUTS)})"
            )


REWARD_FUNCTIONS: Registry[RewardEntry] = Registry("reward function")
REWARD_FUNCTIONS.add("auto", RewardEntry(auto.compute_score))
REWARD_FUNCTIONS.add("gsm8k", RewardEntry(gsm8k.compute_score))
REWARD_FUNCTIONS.add("math", RewardEntry(math_boxed.compute_score))
REWARD_FUNCTIONS.add("arithmetic", RewardEntry(arithmetic.compute_score))
REWARD_FUNCTIONS.add("countdown", RewardEntry(countdown.compute_score))
REWARD_FUNCTIONS.add("format", RewardEntry(format_regex.compute_score))
REWARD_FUNCTIONS.add("crossthinkqa", RewardEntry(crossthinkqa.compute_score))
REWARD_FUNCTIONS.add("code", RewardEntry(code.compute_score))
REWARD_FUNCTIONS.add("ifeval", RewardEntry(ifeval.compute_score))
REWARD_FUNCTIONS.add("visual_color", RewardEntry(visual.visual_color_score))
REWARD_FUNCTIONS.add("geo3k", RewardEntry(visual.geo3k_score))
# ROLL's VideoR1RewardWorker: accuracy by problem type + the think/answer format
REWARD_FUNCTIONS.add("video_r1", RewardEntry(video_r1.compute_score))
# ROLL's DetectionRewardWorker: Qwen2.5 models answer in pixels of the shown image
REWARD_FUNCTIONS.add(
    "detection",
    RewardEntry(
        detection.compute_score,
        frozenset({MODEL_TYPE, IMAGE_SIZES, PROGRESS}),
        detection.check_kwargs,
    ),
)

CUSTOM = "custom"
# Scored by the LLM judge (temper.rewards.judge) in the driver, not by a worker function.
JUDGE = "llm_judge"
# Functions that run programs: the manager passes them ``sandbox=`` (reward.sandbox*).
SANDBOXED = frozenset({"code", "auto"})


def register_reward_function(
    name: str, fn: RewardFunction, needs: frozenset[str] = frozenset()
) -> None:
    """Add a built-in under ``name`` with its ``needs`` (module doc); visible to worker
    processes only if registered at import time of a module they import (prefer
    ``reward.custom_function`` for user code)."""
    if name in (CUSTOM, JUDGE):
        raise ValueError(f"reward function {name!r} is already registered")
    REWARD_FUNCTIONS.add(name, RewardEntry(fn, needs))


def reward_function_names() -> list[str]:
    """Valid ``reward.function`` / ``reward.routes.*.function`` values."""
    return sorted([*REWARD_FUNCTIONS, CUSTOM, JUDGE])


def get_reward_function(name: str, key: str = "reward.function") -> RewardFunction:
    """The built-in named ``name``; ``ConfigError`` (with did-you-mean) otherwise."""
    return _entry(name, key).fn


def reward_function_needs(name: str, key: str = "reward.function") -> frozenset[str]:
    """What built-in ``name`` needs besides the four columns (module doc)."""
    return _entry(name, key).needs


def check_reward_kwargs(name: str, kwargs: Mapping[str, Any], key: str) -> None:
    """``ConfigError`` on ``key`` (where ``kwargs`` are set) when built-in ``name``'s
    check refuses them; nothing for an entry without a check."""
    check = _entry(name, key).check
    if check is None:
        return
    try:
        check(kwargs)
    except ValueError as err:
        from temper.config.errors import ConfigError

        raise ConfigError(key, str(err), f"give {name} the arguments it takes") from err


def _entry(name: str, key: str) -> RewardEntry:
    if name in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS.get(name)
    from temper.config.errors import unknown_name

    raise unknown_name(key, name, reward_function_names())
