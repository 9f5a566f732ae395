"""ROLL's env tool wrapper (GEM's ``ToolEnvWrapper``): tools between the model and an env.

A tag's ``tool_wrapper`` (:class:`temper.config.schema.EnvToolWrapperConfig`) wraps each
of its envs. The first observation gets the tools' instructions appended (after
``"Available tools:"`` when there are several). Each answer is offered to the tools in
order while fewer than ``max_tool_uses`` calls were made; the first tool whose call ran
without error takes it (when none did, the outcome is the last tool's, as in GEM). Then:

- a call was found: the turn's reward is ``tool_reward``, plus ``tool_success_reward``
  when it ran without error; the episode goes on with the tool's output as the next
  observation (at the last allowed call followed by a line asking for the final answer);
- no call (or no calls left): the answer goes to the env, which scores it.

So with ``tool_reward = a``, ``tool_success_reward = b``, an episode of one successful
call, one failed call and a correct final answer returns ``(a + b) + a + 1``. The wrapper
reads the whole answer, so it wraps only envs that do too (GEM's:
:attr:`temper.envs.TextEnv.whole_response`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temper.config.errors import ConfigError, did_you_mean
from temper.config.schema import EnvToolWrapperConfig

from .base import TextEnv
from .env_tools import ENV_TOOLS, REFUSED_TOOLS, EnvTool, ToolOutcome
from .registry import params_of

__all__ = ["LAST_CALL_NOTE", "ToolEnvWrapper", "build_tools", "check_tools"]

#: appended to the observation of the last call ``max_tool_uses`` allows
LAST_CALL_NOTE = "\n\nReached the maximum number of tool use. Please output final answer directly."


def check_tools(wrapper: EnvToolWrapperConfig, key: str) -> None:
    """Every tool id is registered and its arguments are the tool's (``ConfigError``)."""
    if wrapper.max_tool_uses is not None and wrapper.max_tool_uses < 0:
        raise ConfigError(
            f"{key}.max_tool_uses", "cannot be negative", "set 0 or more, or null (no limit)"
        )
    for tool_id, args in wrapper.tools.items():
        where = f"{key}.tools.{tool_id}"
        if tool_id in REFUSED_TOOLS:
            raise ConfigError(
                where,
                f"the {tool_id} tool cannot run here: {REFUSED_TOOLS[tool_id]}",
                f"remove {tool_id}; use one of: {', '.join(ENV_TOOLS.names())}",
            )
        if tool_id not in ENV_TOOLS:
            raise ConfigError(
                where,
                f"unknown env tool '{tool_id}'{did_you_mean(tool_id, ENV_TOOLS.names())}",
                f"use one of: {', '.join(ENV_TOOLS.names())}",
            )
        cls = ENV_TOOLS.get(tool_id)
        accepted = params_of(cls)
        for name in args or {}:
            if name not in accepted:
                raise ConfigError(
                    f"{where}.{name}",
                    f"unknown argument of the {tool_id} tool{did_you_mean(name, sorted(accepted))}",
                    f"use one of: {', '.join(sorted(accepted))}",
                )
        try:
            cls(**(args or {}))
        except (TypeError, ValueError) as e:
            raise ConfigError(where, str(e), f"fix the {tool_id} tool's arguments") from e


def build_tools(wrapper: EnvToolWrapperConfig) -> list[EnvTool]:
    """The wrapper's tools, in order."""
    return [ENV_TOOLS.get(tool_id)(**(args or {})) for tool_id, args in wrapper.tools.items()]


class ToolEnvWrapper(TextEnv):
    """An env with tools in front of it (module docstring)."""

    whole_response = True

    def __init__(
        self,
        env: TextEnv,
        tools: Sequence[EnvTool],
        *,
        tool_reward: float = 0.0,
        tool_success_reward: float = 0.0,
        max_tool_uses: int | None = 10,
    ) -> None:
        if not env.whole_response:
            raise ValueError(
                f"a tool wrapper reads the whole answer; env type {env.env_type} reads "
                "actions the manager extracts (use a GEM env: roll_math, roll_qa, …)"
            )
        self.env, self.tools = env, list(tools)
        self.tool_reward, self.tool_success_reward = float(tool_reward), float(tool_success_reward)
        self.max_tool_uses = max_tool_uses
        self.uses = self.successes = 0

    @property
    def action_space_text(self) -> str:
        return self.env.action_space_text

    @property
    def instructions(self) -> str:
        return self.env.instructions

    def suffix(self) -> str:
        return self.env.suffix()

    def problem(self) -> str | None:
        for p in (self.env.problem(), *(t.problem() for t in self.tools)):
            if p:
                return p
        return None

    def _counters(self) -> dict[str, int]:
        return {"tool_use_counter": self.uses, "tool_success_counter": self.successes}

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.uses = self.successes = 0
        obs, info = self.env.reset(seed)
        text = "\n".join(t.instruction() for t in self.tools)
        if len(self.tools) > 1:
            text = f"Available tools:\n{text}"
        return f"{obs}\n{text}", {**info, **self._counters()}

    def _offer(self, action: str) -> ToolOutcome | None:
        """The call the tools make of ``action`` (None: no call, or no calls left)."""
        if self.max_tool_uses is not None and self.uses >= self.max_tool_uses:
            return None
        outcome = None
        for tool in self.tools:
            outcome = tool.execute(action)
            if outcome.parsed and not outcome.error:
                break
        return outcome if outcome is not None and outcome.parsed else None

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        outcome = self._offer(action_text)
        if outcome is None:
            obs, reward, terminated, truncated, info = self.env.step(action_text)
            return obs, reward, terminated, truncated, {**info, **self._counters()}
        self.uses += 1
        obs = outcome.observation
        if self.max_tool_uses is not None and self.uses == self.max_tool_uses:
            obs += LAST_CALL_NOTE
        reward = self.tool_reward
        if not outcome.error:
            self.successes += 1
            reward += self.tool_success_reward
        info = {"tool_call": True, "tool_error": outcome.error, "success": False}
        return obs, reward, False, False, {**info, **self._counters()}

    def render(self, mode: str = "text") -> str | Any:
        return self.env.render(mode)

    def close(self) -> None:
        self.env.close()
