"""The GEM agent-runner env manager (ROLL's ``ProxyEnvManager`` driving a ``GEMRunner``).

ROLL's ``GEMRunner`` plays a local gym-like env through an OpenAI-style chat endpoint
that the ``ProxyEnvManager`` serves, and the proxy records the token sequence of the
conversation. What the model sees differs from the ``trajectory`` manager's:

- the system message is ``agent_system_template`` + ``"\\n\\n"`` + the env's instruction
  (just the template when there is no instruction): the instruction is *not* in the
  first user message;
- every user message, the first included, is the tag's ``agent_template`` rendered with
  ``observation``, ``turn_idx`` (1 first), ``actions_left`` (``max_steps`` first, then
  ``max_steps − turns taken``), ``max_response_length`` (the tag's per-turn token budget)
  and ``suffix`` rendered as ``""``; without a template, the observation and the tag's
  ``turn_prompt``;
- an invalid answer gets no note: the next message is the observation alone;
- the env reads the whole answer and the episode ends when the env terminates or
  truncates, or after ``max_steps`` answers.

Samples are ROLL's ``trajectory_mode: traj`` (the default): one per episode, the whole
conversation, scored with the sum of the step rewards at its last token — the trajectory
manager's samples (:func:`temper.pipelines.trajectories.trajectory_batch`).
"""

from __future__ import annotations

from typing import Any

from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.envs import EnvManager, EnvSlot
from temper.pipelines.agentic_rollout import AgenticPlayer, EnvResponder, _tag_tools
from temper.rollout.multiturn import Responder

__all__ = ["GEMRunnerPlayer", "check_gem_runner", "gem_system_message"]


def gem_system_message(system_template: str, instruction: str) -> str:
    """``GEMRunner``'s system message: ``f"{system_template}\\n\\n{instruction}"``, or the
    template alone when ``instruction`` is empty."""
    return f"{system_template}\n\n{instruction}" if instruction else system_template


class GEMRunnerPlayer(AgenticPlayer):
    """:class:`AgenticPlayer` with ``GEMRunner``'s messages (module doc)."""

    def first_messages(self, manager: EnvManager, s: EnvSlot) -> list[dict[str, Any]]:
        system = gem_system_message(manager.system_message(s.tag), s.instruction)
        turn = manager.turn_text(s.env_id, s.observation, "")
        first = [{"role": "system", "content": system}] if system else []
        return [*first, {"role": "user", "content": turn}]

    def responder(self, manager: EnvManager, slots: list[EnvSlot]) -> Responder:
        return EnvResponder(manager, slots, plain=True)


def check_gem_runner(cfg: TemperConfig) -> None:
    """``GEMRunner`` sends no tools and keeps one conversation per episode."""
    if cfg.agentic.step_score != "episode":
        raise ConfigError(
            "agentic.step_score",
            f"{cfg.agentic.step_score}: the gem_runner env manager makes one sample per "
            "episode (ROLL's trajectory_mode traj), which has no step of its own to score from",
            "set agentic.step_score: episode",
        )
    if cfg.rollout.multi_turn.tool_config_path:
        raise ConfigError(
            "rollout.multi_turn.tool_config_path",
            "ROLL's GEMRunner sends the model no tools (its env's tool_wrapper runs them)",
            "remove it, or use agentic.env_manager: trajectory",
        )
    for which in (cfg.agentic.train_env_manager, cfg.agentic.val_env_manager):
        for tag in which.tags:
            if tag in cfg.agentic.custom_envs and _tag_tools(cfg, tag):
                raise ConfigError(
                    f"agentic.custom_envs.{tag}.env_type",
                    f"env type {cfg.agentic.custom_envs[tag].env_type} offers tools through "
                    "the chat template; ROLL's GEMRunner sends the model none",
                    "use agentic.env_manager: trajectory for tool environments",
                )
    for tag, spec in cfg.agentic.custom_envs.items():
        if spec.history_length is not None:
            raise ConfigError(
                f"agentic.custom_envs.{tag}.history_length",
                "the gem_runner env manager shows the whole episode",
                "remove it",
            )
