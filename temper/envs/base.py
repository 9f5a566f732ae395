"""The text-environment interface of the agentic pipeline.

A ``TextEnv`` is a gymnasium-like environment whose observations and actions
are text. One *turn* of the agentic loop is:

1. the model answers with a raw response (``<think>…</think><answer>Up || Left</answer>``);
2. the env manager (``temper.envs.manager.EnvManager``) extracts the actions with
   ``temper.envs.actions.parse_action`` (pattern, ``action_sep``, think rule of the
   tag) and adds the tag's ``format_penalty`` when the answer is unparsable or
   names an action the env does not know;
3. each extracted action string (``"Up"``) goes to ``TextEnv.step`` in order, until
   the episode ends or the per-trajectory action cap is reached;
4. the new observation text is shown to the model in the next turn.

So ``TextEnv.step`` receives *one action string* (already extracted from the
response), never the whole response. An action string the env does not know is
not an error: the state is unchanged, the reward is 0 and
``info["action_is_valid"]`` is False.

``info`` returned by ``step`` carries at least:

- ``"action_is_valid"`` (bool): the action string named a legal action;
- ``"action_is_effective"`` (bool): the action changed the state (a move into a
  wall is valid but not effective);
- ``"success"`` (bool): the goal is reached (meaningful when ``terminated``).

Conventions follow gymnasium: ``terminated`` means the episode reached a
terminal state (solved, fell into a hole, answered), ``truncated`` that it was
cut by the env's own ``max_steps``. The manager also truncates at the tag's
``max_turns`` and reports that in its own result.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from temper.rewards.sandbox_api import SandboxChoice

__all__ = ["EnvSlot", "EnvTurnResult", "JudgeRequest", "TextEnv"]


@dataclass(frozen=True)
class JudgeRequest:
    """One conversation for the LLM judge, and its chat template's keyword arguments."""

    messages: list[dict[str, str]]
    template_kwargs: dict[str, Any] = field(default_factory=dict)


class TextEnv(abc.ABC):
    """A text-in, text-out environment (see the module docstring for the turn protocol).

    Subclasses set ``env_type`` (the registry name) and implement ``reset``,
    ``step``, ``render`` and ``action_space_text``. Construction takes the
    tag's ``env_config`` entries as keyword arguments; randomness comes only
    from the ``seed`` given to ``reset`` (a ``numpy.random.Generator``), so the
    same seed always gives the same episode.
    """

    env_type: ClassVar[str] = ""
    #: the env reads the model's whole answer and scores its own format (GEM's envs:
    #: ``\\boxed{}`` answers, tool calls): the manager neither extracts actions with the
    #: tag's ``action_pattern`` nor adds its ``format_penalty``
    whole_response: ClassVar[bool] = False
    #: the modes ``render`` draws: every env renders ``text``; one that also draws its
    #: state as an image (``rgb_array``) says so here (frames, the VL env manager)
    render_modes: ClassVar[tuple[str, ...]] = ("text",)
    #: the env's observations hold images: its observation text marks each with
    #: ``<image>`` and :meth:`observation_images` returns them, in order (DeepEyes: the
    #: question's image, then each zoomed crop); the VL trajectory env manager shows them
    #: where they are marked instead of a rendered frame of the state
    image_observations: ClassVar[bool] = False
    #: the env grades an episode's end with the run's LLM judge (``reward.judge``): a step
    #: that ends the episode leaves a :meth:`judge_request`, the env manager sends every
    #: request of a turn to the judge in one call and hands each verdict back to
    #: :meth:`judged`, whose reward is added to that step's
    uses_judge: ClassVar[bool] = False
    #: the env plays its game in the run's sandbox (``reward.sandbox``): whoever builds it
    #: for a run hands it the run's choice with :meth:`use_sandbox` before the first reset
    #: (and before :meth:`problem`)
    uses_sandbox: ClassVar[bool] = False

    @abc.abstractmethod
    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        """Start an episode from ``seed``; return ``(observation text, info)``."""

    @abc.abstractmethod
    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply one action string; return ``(obs, reward, terminated, truncated, info)``."""

    @abc.abstractmethod
    def render(self, mode: str = "text") -> str | np.ndarray:
        """The current state: ``"text"`` (str) or ``"rgb_array"`` (uint8 H×W×3) where supported."""

    @property
    @abc.abstractmethod
    def action_space_text(self) -> str:
        """What the prompt shows about the actions and the symbols (legend, valid moves)."""

    def text(self) -> str:
        """The current state as text (``render("text")``)."""
        frame = self.render("text")
        if not isinstance(frame, str):
            raise TypeError(f"{type(self).__name__}.render('text') returned {type(frame).__name__}")
        return frame

    def valid_actions(self) -> list[str] | None:
        """The canonical action names (``["Up", "Down", …]``), or None for free-form answers."""
        return None

    def tool_names(self) -> list[str]:
        """Tools (names in ``temper.envs.tools``) the agent loop may offer in this env."""
        return []

    def problem(self) -> str | None:
        """Why this env cannot run on this machine (a dataset file that is not here, a
        sandbox that cannot start, a retriever that does not answer), or None; asked by
        ``temper check``."""
        return None

    def observation_images(self) -> list[Any]:
        """The current observation's images (PIL), one per ``<image>`` of its text, for an
        env with :attr:`image_observations`; [] otherwise."""
        return []

    def system_prompt(self) -> str:
        """The system message the env's current episode brings (DeepEyes: its row's), ''
        for none: the tag's ``system_template`` applies."""
        return ""

    def judge_request(self) -> JudgeRequest | None:
        """What the judge must answer after the last step (it ended the episode), or None."""
        return None

    def judged(self, verdict: str | None, error: str = "") -> tuple[float, dict[str, Any]]:
        """The reward and info of the pending episode end, from the judge's ``verdict``
        (None, with ``error``, when the judge call failed)."""
        raise TypeError(f"{type(self).__name__} grades with no judge (uses_judge is False)")

    def use_sandbox(self, choice: SandboxChoice) -> None:
        """Play in the sandbox ``choice`` names (for an env with :attr:`uses_sandbox`)."""
        raise TypeError(f"{type(self).__name__} runs in no sandbox (uses_sandbox is False)")

    def suffix(self) -> str:
        """Text shown after the observation each turn (GEM's task suffix, e.g. "Enter your
        next guess."; ROLL's ``{suffix}`` template field); '' by default."""
        return ""

    @property
    def instructions(self) -> str:
        """Default task text shown before the first observation (a tag's env_instruction wins)."""
        return self.action_space_text

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources (none by default)."""


@dataclass
class EnvSlot:
    """One environment instance after ``EnvManager.reset`` (one future trajectory)."""

    env_id: int  # index in the manager's pool, stable across steps
    group_id: int  # episodes of one group share seed and config (GRPO group)
    tag: str  # key of agentic.custom_envs
    seed: int  # the episode seed given to TextEnv.reset
    observation: str  # initial observation text
    instruction: str  # task text: the tag's env_instruction (or the env's) + action legend
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class EnvTurnResult:
    """What one model turn did to one environment (``EnvManager.step``)."""

    env_id: int
    observation: str  # observation after the turn (unchanged if nothing was executed)
    reward: float  # sum of env rewards of the executed actions + format penalty
    terminated: bool  # the env reached a terminal state
    truncated: bool  # cut: env max_steps, tag max_turns or max_actions_per_traj
    done: bool  # terminated or truncated: the trajectory is over
    actions: list[str]  # action strings parsed from the response
    executed: int  # how many of them were applied
    format_ok: bool  # response parsed and every action was valid
    penalty: float  # the format penalty added to reward (0.0 or negative)
    success: bool  # goal reached
    info: dict[str, Any] = field(default_factory=dict)  # last env info + parse reason
