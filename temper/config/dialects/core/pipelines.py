"""Configs of verl and ROLL pipelines that temper has no loop for, recognised by shape.

temper runs RL — the ``rlvr`` pipeline (PPO, GRPO and relatives, single-turn, verl's
``main_ppo`` and ROLL's RLVR pipeline) and the ``agentic`` one (multi-turn episodes) —
supervised fine-tuning (``sft``: verl's SFT trainers and ROLL's SFT pipeline), DPO
(``dpo``: ROLL's DPO pipeline), offline distillation (``distill``: ROLL's distill
pipeline), on-policy distillation (RL with teachers: ROLL's OPD files) and verl's
generation and evaluation entry points (``generate``, ``eval``), which the dialects
translate, verl's SPPO recipe (an RLVR run with the ``sppo`` estimator and loss:
:mod:`verl.sppo`), its SPIN recipe (``spin``: online DPO, :mod:`verl.spin`) and its PRIME
recipe (``prime``: RL on an implicit PRM, :mod:`verl.prime`); ROLL's agentic rollout runs
are temper's ``agentic_rollout`` pipeline (:mod:`temper.pipelines.episodes`), its RLVR
rollout runs ``temper eval``'s ``rlvr_rollout`` (:mod:`roll.rlvr_rollout`), refused under
the other commands with the command that runs them. ROLL ships other trainers too —
Reward-FL. Their configs reuse many RL keys, so a
key-by-key translation would fail on some key deep inside with "unknown key, did you mean
…", which sends the user after a typo that is not there. Instead such a file is recognised by the
keys only that pipeline has, and refused in one line that names the pipeline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from temper.config.dialects.core import paths
from temper.config.errors import ConfigError

RUNS = (
    "temper runs the rlvr (PPO, GRPO, …), agentic, sft, dpo, spin (online DPO), prime, distill "
    "and reward_model pipelines, and generate, agentic_rollout (episodes, no training), eval "
    "and rlvr_rollout (a validation rollout, no training)"
)


@dataclasses.dataclass(frozen=True)
class Shape:
    """A pipeline temper has no loop for, and the keys that identify its configs."""

    name: str  # what the user would call it
    what: str  # what it trains
    matches: Callable[[dict[str, Any]], str | None]  # -> the key that identifies it
    lacks: str = ""  # what temper lacks of it, where a near pipeline could mislead
    command: str = ""  # the temper command that runs such a file ("" none)


def _any_key(*keys: str, truthy: bool = False) -> Callable[[dict[str, Any]], str | None]:
    """Identified by the first of ``keys`` present (with a true value when ``truthy``)."""

    def match(data: dict[str, Any]) -> str | None:
        for path in keys:
            value = paths.get(data, path)
            present = value is not None or paths.has(data, path)
            if present and (value or not truthy):
                return path
        return None

    return match


def _rollout_only(data: dict[str, Any]) -> str | None:
    """ROLL's rollout pipelines generate (and dump) without training: no actor_train (a
    ``rollout_mock`` dump file trains, and is an RL file: :mod:`roll.mock`). The agentic one
    (env managers) is temper's ``agentic_rollout`` pipeline; the RLVR one is ``temper eval``'s
    ``rlvr_rollout``."""
    if "actor_infer" in data and "actor_train" not in data and "train_env_manager" not in data:
        return "actor_infer"
    return None


def _diffusion(data: dict[str, Any]) -> str | None:
    if paths.get(data, "actor_train.model_args.model_type") == "diffusion_module":
        return "actor_train.model_args.model_type"
    return None


ROLL_SHAPES = (
    Shape("ROLL Reward-FL pipeline", "a diffusion model by reward feedback learning", _diffusion),
    Shape(
        "ROLL RLVR rollout pipeline",
        "generation and scoring of the validation set without training",
        _rollout_only,
        command="eval",
    ),
)
VERL_SHAPES: tuple[Shape, ...] = ()
SHAPES = {"roll": ROLL_SHAPES, "verl": VERL_SHAPES}


def refuse_other_pipelines(data: dict[str, Any], dialect: str, command: str = "train") -> None:
    """``ConfigError`` naming the pipeline when ``data`` is a config of one temper lacks,
    or (read by another ``command``) of one that another temper command runs."""
    for shape in SHAPES.get(dialect, ()):
        key = shape.matches(data)
        if key is not None and shape.command == command:
            continue
        if key is not None and shape.command:
            raise ConfigError(
                key,
                f"this is a {shape.name} config ({shape.what}), which temper {shape.command} "
                f"runs, not temper {command}",
                f"temper {shape.command} CONFIG",
            )
        if key is not None:
            raise ConfigError(
                key,
                f"this is a {shape.name} config ({shape.what}), a pipeline temper has no "
                f"loop for{'; ' + shape.lacks if shape.lacks else ''}; {RUNS}",
                f"run it with {dialect if dialect == 'verl' else 'ROLL'}'s own trainer, or "
                "write an RL, SFT or DPO config (verl main_ppo or an SFT trainer's, ROLL "
                "RLVR, agentic, SFT or DPO)",
            )
