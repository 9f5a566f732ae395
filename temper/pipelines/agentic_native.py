"""The agent-native step env manager (ROLL's ``AgentNativeStepEnvManager``).

The env writes the conversation (:class:`temper.envs.native.NativeChatEnv`): its system
message, then its message for the first state, then, step after step, the model's answer
and its message for the new state. Every env step is a training sample, as with the
``step`` manager (:mod:`temper.pipelines.agentic_steps`): the prompt is the whole
conversation up to that step, rendered with the chat template, the response the step's
answer; its score is the episode's return or the step's return-to-go
(``agentic.step_score``; ROLL's ``step_reinforce``). The tag's ``system_template`` and
``turn_template`` are not read: the env words its own messages.

Where ROLL keys a step's state by the hash of its conversation, ``anchor_index`` here is
the board the step started from, as the ``step`` manager's is.
"""

from __future__ import annotations

from typing import Any

from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.envs import EnvManager, EnvSlot, StepRecord, resolve_tag
from temper.envs.native import NativeChatEnv
from temper.pipelines.agentic_steps import StepPlayer, check_step
from temper.rollout.multiturn import EpisodeSpec

__all__ = ["NativeStepPlayer", "check_agent_native", "native_messages"]


def native_messages(
    env: NativeChatEnv, instruction: str, records: list[StepRecord], current: str
) -> list[dict[str, Any]]:
    """The conversation of the step after ``records``: system, first state, then per
    earlier step its answer and the state it led to (the last one ``current``)."""
    states = [r.observation for r in records] + [current]
    messages = [
        {"role": "system", "content": env.system_text(instruction)},
        {"role": "user", "content": env.state_text(states[0], first=True)},
    ]
    for record, state in zip(records, states[1:]):
        messages.append({"role": "assistant", "content": record.answer})
        messages.append({"role": "user", "content": env.state_text(state, first=False)})
    return messages


class NativeStepPlayer(StepPlayer):
    """:class:`StepPlayer` whose step prompts are the env's conversation (module doc)."""

    def _spec(
        self,
        manager: EnvManager,
        slot: EnvSlot,
        step: int,
        suffix: str,
        records: list[StepRecord],
    ) -> EpisodeSpec:
        spec = super()._spec(manager, slot, step, suffix, records)
        env = manager.env(slot.env_id)
        if not isinstance(env, NativeChatEnv):  # check_agent_native refuses such tags
            raise TypeError(f"env type {type(env).__name__} writes no conversation")
        tag = manager.specs[slot.tag]
        instruction = (
            f"{tag.env_instruction}\n{env.action_space_text}"
            if tag.env_instruction
            else env.instructions
        )
        current = manager.observation(slot.env_id)
        spec.messages = native_messages(env, instruction, records, current)
        return spec


def check_agent_native(cfg: TemperConfig) -> None:
    """The step manager's checks; every played tag's env writes its own conversation."""
    check_step(cfg)
    agentic = cfg.agentic
    for which in ("train_env_manager", "val_env_manager"):
        for tag in getattr(agentic, which).tags:
            spec = agentic.custom_envs.get(tag)
            if spec is None:
                continue
            key = f"agentic.custom_envs.{tag}"
            if not issubclass(resolve_tag(tag, spec).cls, NativeChatEnv):
                raise ConfigError(
                    f"{key}.env_type",
                    f"env type '{spec.env_type}' returns observations, not its own "
                    "conversation; the agent_native env manager plays envs that write it "
                    "(sokoban_native_env)",
                    "use an agent-native env type, or agentic.env_manager: step",
                )
            for name in ("system_template", "turn_template", "turn_prompt"):
                if getattr(spec, name):
                    raise ConfigError(
                        f"{key}.{name}",
                        "the agent_native env manager's env words its own messages",
                        f"remove {name} (set the env's system_template / "
                        "observation_suffix in env_config)",
                    )
            if spec.history_length is not None:
                raise ConfigError(
                    f"{key}.history_length",
                    "the agent_native env manager shows the whole conversation",
                    "remove it",
                )
