"""The agentic pipeline's env managers: how played episodes become training samples.

``agentic.env_manager`` names one entry of :data:`ENV_MANAGERS`:

- ``trajectory`` (ROLL's ``TrajEnvManager``): one multi-turn conversation per episode,
  one sample per episode (:class:`temper.pipelines.agentic_rollout.AgenticPlayer`);
- ``step`` (ROLL's ``StepEnvManager``): a fresh prompt per env step, one sample per step
  with its episode, step index, step reward and anchor state
  (:class:`temper.pipelines.agentic_steps.StepPlayer`) — what ``gigpo`` needs;
- ``step_concat`` (ROLL's ``StepConcatEnvManager``, GEM's observation concatenation):
  the step samples of ``step``, each prompt the tag's window of earlier *observations*
  joined by newlines (``{history}``) and the current one with the env's suffix
  (``{current_observation}``) — no answers, rewards or instruction
  (:class:`temper.pipelines.agentic_steps.StepConcatPlayer`);
- ``vl_trajectory`` (ROLL's ``VLTrajEnvManager``): the trajectory manager's one sample
  per episode with each state shown as an image between the tag's ``pre_step_template``
  and ``next_step_template`` — needs a vision-language model
  (:class:`temper.pipelines.agentic_vision.VLPlayer`);
- ``gem_runner`` (ROLL's ``ProxyEnvManager`` with its ``GEMRunner``): the trajectory
  manager's samples, with the env instruction in the system message and every user
  message the tag's template alone
  (:class:`temper.pipelines.agentic_gem_runner.GEMRunnerPlayer`);
- ``agent_native`` (ROLL's ``AgentNativeStepEnvManager``): the step samples of ``step``,
  each prompt the conversation the env writes itself (its system message, its state
  messages, the answers so far) (:class:`temper.pipelines.agentic_native.NativeStepPlayer`).

An entry declares what its samples give the advantage estimators beyond the driver's
inputs (``provides``, ``AdvantageInputs`` field names: an estimator that needs more is
refused at ``temper check``) and the combinations it refuses (``check``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.envs.registry import ENV_TYPES
from temper.pipelines.agentic_gem_runner import GEMRunnerPlayer, check_gem_runner
from temper.pipelines.agentic_native import NativeStepPlayer, check_agent_native
from temper.pipelines.agentic_rollout import AgenticPlayer, Player
from temper.pipelines.agentic_steps import STEP_INPUTS, StepConcatPlayer, StepPlayer, check_step
from temper.pipelines.agentic_vision import VLPlayer
from temper.pipelines.agentic_vision_checks import check_vision_model, check_vl_trajectory
from temper.registry import Registry
from temper.rollout import RolloutEngine


@dataclasses.dataclass(frozen=True)
class EnvManagerKind:
    """An env manager: the player a run builds, what its samples provide, its checks."""

    player: Callable[[TemperConfig, RolloutEngine, Any], Player]
    check: Callable[[TemperConfig], None]
    provides: frozenset[str] = frozenset()
    #: what the manager needs of this machine and its files, for ``temper check`` (the
    #: model's kind, …); None: nothing beyond the env tags
    preflight: Callable[[TemperConfig], None] | None = None
    #: one sample per env step (not per episode): a step's sample count varies
    step_samples: bool = False


def check_trajectory(cfg: TemperConfig) -> None:
    """The trajectory env manager keeps the whole episode in one conversation: a tag's
    window of past steps (``history_length``) would be read by nothing."""
    if cfg.agentic.step_score != "episode":
        raise ConfigError(
            "agentic.step_score",
            f"{cfg.agentic.step_score}: the trajectory env manager makes one sample per "
            "episode, which has no step of its own to score from",
            "set agentic.env_manager: step or step_concat, or step_score: episode",
        )
    for tag, spec in cfg.agentic.custom_envs.items():
        if spec.history_length is not None:
            raise ConfigError(
                f"agentic.custom_envs.{tag}.history_length",
                "the trajectory env manager shows the whole episode; a window of past steps "
                "is the step env manager's",
                "remove it, or set agentic.env_manager: step",
            )


def text_observations(check: Callable[[TemperConfig], None]) -> Callable[[TemperConfig], None]:
    """``check`` of a manager that shows observations as text: the image turn's templates
    (``pre_step_template``, ``next_step_template``) would be read by nothing."""

    def checked(cfg: TemperConfig) -> None:
        for tag, spec in cfg.agentic.custom_envs.items():
            if spec.env_type in ENV_TYPES and ENV_TYPES.get(spec.env_type).image_observations:
                raise ConfigError(
                    f"agentic.custom_envs.{tag}.env_type",
                    f"'{spec.env_type}' shows images in its observations, which the "
                    f"{cfg.agentic.env_manager} env manager would drop (it shows text)",
                    "set agentic.env_manager: vl_trajectory (ROLL's VLTrajEnvManager) and a "
                    "vision-language model",
                )
            for name in ("pre_step_template", "next_step_template"):
                if getattr(spec, name):
                    raise ConfigError(
                        f"agentic.custom_envs.{tag}.{name}",
                        f"read by agentic.env_manager vl_trajectory only (ROLL's "
                        f"VLTrajEnvManager); the {cfg.agentic.env_manager} env manager shows "
                        "text observations",
                        "remove it, or set agentic.env_manager: vl_trajectory",
                    )
        check(cfg)

    return checked


ENV_MANAGERS: Registry[EnvManagerKind] = Registry("env_manager")
ENV_MANAGERS.add("trajectory", EnvManagerKind(AgenticPlayer, text_observations(check_trajectory)))
ENV_MANAGERS.add(
    "step",
    EnvManagerKind(
        StepPlayer, text_observations(check_step), provides=STEP_INPUTS, step_samples=True
    ),
)
ENV_MANAGERS.add(
    "step_concat",
    EnvManagerKind(
        StepConcatPlayer, text_observations(check_step), provides=STEP_INPUTS, step_samples=True
    ),
)
ENV_MANAGERS.add(
    "vl_trajectory",
    EnvManagerKind(VLPlayer, check_vl_trajectory, preflight=check_vision_model),
)
ENV_MANAGERS.add("gem_runner", EnvManagerKind(GEMRunnerPlayer, text_observations(check_gem_runner)))
ENV_MANAGERS.add(
    "agent_native",
    EnvManagerKind(
        NativeStepPlayer,
        text_observations(check_agent_native),
        provides=STEP_INPUTS,
        step_samples=True,
    ),
)
