"""Countdown: combine the given numbers into an expression equal to the target.

Task (TinyZero / ROLL ``Countdown``): numbers ``[3, 5, 2]``, target ``4`` →
answer ``<answer>2 + 5 - 3</answer>``. The answer must use **each given number
exactly once** (TinyZero's rule; other integers are not allowed), with ``+ - * /``
and parentheses; an ``= value`` suffix is ignored. It is evaluated with the
calculator's safe ``ast`` evaluator, never ``eval``.

Rewards (TinyZero ``compute_score`` defaults): ``score`` (1.0) when correct,
``format_score`` (0.1) for an expression that evaluates but is wrong or uses
the wrong numbers, 0 for one that does not evaluate (then
``action_is_valid=False``, so the env manager adds the format penalty). The
episode ends when correct or after ``max_attempts`` answers.

Puzzles are drawn from the reset seed: ``num_numbers`` integers in
``[1, max_number]`` combined in random order by random operations (division
only when exact) into a positive integer target ``<= max_target``, so every
puzzle has a solution.

``countdown_tool`` is the same task with the ``calculator`` tool offered
(``tool_names()``); the tool-calling loop runs tools between env steps.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from .base import TextEnv
from .registry import register_env
from .tools import ToolError, format_number, safe_eval

__all__ = ["CountdownEnv", "CountdownToolEnv", "check_countdown", "make_countdown"]


def make_countdown(
    rng: np.random.Generator, num_numbers: int, max_number: int, max_target: int
) -> tuple[list[int], int]:
    """A solvable puzzle: ``(numbers, target)``."""
    for _ in range(10_000):
        nums = [int(v) for v in rng.integers(1, max_number + 1, size=num_numbers)]
        order = [nums[i] for i in rng.permutation(num_numbers)]
        value = order[0]
        for v in order[1:]:
            ops = ["+", "-", "*"] + (["/"] if value % v == 0 else [])
            op = ops[int(rng.integers(len(ops)))]
            value = {"+": value + v, "-": value - v, "*": value * v, "/": value // v}[op]
        if 1 <= value <= max_target:
            return nums, int(value)
    raise RuntimeError("could not draw a countdown puzzle; raise max_target")


def check_countdown(answer: str, numbers: list[int], target: int) -> tuple[bool, bool, str]:
    """``(correct, evaluates, reason)`` for an answer expression."""
    expr = answer.split("=")[0].strip()
    try:
        value = safe_eval(expr)
    except ToolError as e:
        return False, False, f"does not evaluate: {e}"
    if re.search(r"\d+\.\d*|\.\d+", expr):
        return False, True, "uses decimal numbers"
    used = sorted(int(n) for n in re.findall(r"\d+", expr))
    if used != sorted(numbers):
        return False, True, f"uses {used}, not each of {sorted(numbers)} once"
    if abs(value - target) > 1e-6:
        return False, True, f"equals {format_number(value)}, not {target}"
    return True, True, ""


@register_env("countdown")
class CountdownEnv(TextEnv):
    """Reach the target with the given numbers (rules in the module docstring)."""

    default_tools: tuple[str, ...] = ()

    def __init__(
        self,
        *,
        num_numbers: int = 3,
        max_number: int = 20,
        max_target: int = 100,
        score: float = 1.0,
        format_score: float = 0.1,
        max_attempts: int = 1,
        tools: list[str] | None = None,
    ) -> None:
        if num_numbers < 2 or max_number < 1 or max_target < 1 or max_attempts < 1:
            raise ValueError("num_numbers >= 2, max_number, max_target, max_attempts >= 1")
        self.num_numbers, self.max_number, self.max_target = num_numbers, max_number, max_target
        self.score, self.format_score, self.max_attempts = score, format_score, max_attempts
        self.tools = list(self.default_tools if tools is None else tools)
        if self.tools:
            from .tools import get_tool

            for name in self.tools:
                try:
                    get_tool(name)
                except KeyError as e:
                    raise ValueError(str(e.args[0])) from None
        self.numbers: list[int] = []
        self.target = 0
        self.attempts = 0
        self.last = ""

    def tool_names(self) -> list[str]:
        return list(self.tools)

    @property
    def action_space_text(self) -> str:
        return (
            "Answer with one expression that uses each given number exactly once, with "
            "+, -, *, / and parentheses, e.g. <answer>(5 - 3) * 2</answer>."
        )

    @property
    def instructions(self) -> str:
        tool = (
            " You may call the calculator tool to check arithmetic before answering."
            if "calculator" in self.tools
            else ""
        )
        return (
            "You are solving the Countdown puzzle: combine the numbers into an equation "
            f"equal to the target.{tool}\n{self.action_space_text}"
        )

    def _obs(self) -> str:
        text = f"Numbers: {self.numbers}\nTarget: {self.target}"
        if self.last:
            text += f"\n{self.last}"
        return text

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        rng = np.random.default_rng(int(seed))
        self.numbers, self.target = make_countdown(
            rng, self.num_numbers, self.max_number, self.max_target
        )
        self.attempts, self.last = 0, ""
        return self._obs(), {"numbers": list(self.numbers), "target": self.target}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        correct, evaluates, reason = check_countdown(str(action_text), self.numbers, self.target)
        self.attempts += 1
        reward = self.score if correct else self.format_score if evaluates else 0.0
        terminated = correct or self.attempts >= self.max_attempts
        self.last = "Correct." if correct else f"Wrong: {action_text.strip()} {reason}."
        info = {
            "action_is_valid": evaluates,
            "action_is_effective": True,
            "success": correct,
            "reason": reason,
        }
        return self._obs(), float(reward), terminated, False, info

    def render(self, mode: str = "text") -> str:
        if mode != "text":
            raise ValueError(f"countdown renders only as text, not '{mode}'")
        return self._obs()


@register_env("countdown_tool")
class CountdownToolEnv(CountdownEnv):
    """Countdown with the ``calculator`` tool offered to the agent."""

    default_tools = ("calculator",)
