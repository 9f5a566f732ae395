"""Environments that write their own conversation (ROLL's agent-native envs).

ROLL's ``AgentNativeStepEnvManager`` plays envs whose ``reset`` / ``step`` return the
whole chat so far rather than an observation: the env decides the system message and
how each state is put to the model. Here such an env is a :class:`TextEnv` that also
says how it words its messages (:class:`NativeChatEnv`); the ``agent_native`` env
manager (:mod:`temper.pipelines.agentic_native`) builds the conversation from them.

``sokoban_native_env`` (ROLL's ``SokobanNativeEnv``): Sokoban whose system message is its
``system_template``, a blank line and the game's instruction; the first user message
shows the board after a "Here is the current state:" line, later ones after a "Current
state:" line, each followed by a blank line and its ``observation_suffix`` (by default a
reminder of the reply format and the actions, and the question).
"""

from __future__ import annotations

import abc

from .base import TextEnv
from .registry import register_env
from .sokoban import ACTIONS, SokobanEnv

__all__ = ["NativeChatEnv", "SokobanNativeEnv"]

DEFAULT_SYSTEM = "You are a helpful assistant who plays games well and aims for a high reward."


def default_suffix(actions: list[str]) -> str:
    """The reminder after each state: the reply format, the actions, the question."""
    return (
        "\n\nReminder: reply with exactly one action as <answer> [your answer] </answer> and "
        f"no other text, e.g. <answer>{actions[-1]}</answer>.\nThe actions are: "
        f"{', '.join(actions)}.\n\nDecide the next action:\n"
    )


class NativeChatEnv(TextEnv):
    """A :class:`TextEnv` that words its own conversation (module doc)."""

    @abc.abstractmethod
    def system_text(self, instruction: str) -> str:
        """The system message, given the game's instruction."""

    @abc.abstractmethod
    def state_text(self, observation: str, first: bool) -> str:
        """The user message showing ``observation`` (``first``: the episode's first)."""


@register_env("sokoban_native_env")
class SokobanNativeEnv(SokobanEnv, NativeChatEnv):
    """ROLL's ``SokobanNativeEnv`` (module doc): Sokoban with its own messages."""

    def __init__(
        self,
        *,
        dim_x: int = 6,
        dim_y: int = 6,
        dim_room: list[int] | tuple[int, int] | None = None,
        num_boxes: int = 1,
        max_steps: int = 10,
        search_depth: int = 300,
        grid_lookup: dict[int, str] | None = None,
        grid_vocab: dict[str, str] | None = None,
        system_template: str | None = None,
        observation_suffix: str | None = None,
    ) -> None:
        super().__init__(
            dim_x=dim_x,
            dim_y=dim_y,
            dim_room=dim_room,
            num_boxes=num_boxes,
            max_steps=max_steps,
            search_depth=search_depth,
            grid_lookup=grid_lookup,
            grid_vocab=grid_vocab,
        )
        self.system_template = DEFAULT_SYSTEM if system_template is None else system_template
        self.observation_suffix = (
            default_suffix(ACTIONS) if observation_suffix is None else observation_suffix
        )

    def system_text(self, instruction: str) -> str:
        """``f"{system_template}\\n\\n{instruction}"``."""
        return f"{self.system_template}\n\n{instruction}"

    def state_text(self, observation: str, first: bool) -> str:
        """``"Here is the current state:\\n"`` (first) or ``"Current state:\\n"``, the board,
        a blank line, the suffix."""
        head = "Here is the current state:" if first else "Current state:"
        return f"{head}\n{observation}\n\n{self.observation_suffix}"
