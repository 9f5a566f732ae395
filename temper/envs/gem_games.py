"""GEM's Guess-the-Number game (``env_type: game:GuessTheNumber-v0``, ROLL's
``qwen3_agentic_gem`` games).

The rules and messages are temper's wording of GEM's. The target is drawn uniformly from ``[min_number, max_number]`` by the reset seed; the
player has ``max_turns`` guesses, each read from the answer's last ``\\boxed{n}`` (the
env reads the whole answer: :attr:`TextEnv.whole_response`). Per guess (GEM's rules and
its :class:`~temper.envs.gem_text.GameReward`):

- no ``\\boxed{n}`` (or ``\\boxed{0}``, which GEM's check also refuses): the game ends,
  reward ``format_error`` (−0.1);
- outside the range, or guessed before: reward ``invalid_action`` (0), the game goes on;
- the target: the game ends won, reward ``success`` (1);
- otherwise a hint ("higher"/"lower"), reward ``internal_step`` (0);
- the last allowed turn without the target: the game ends with
  ``1 − |guess − target| / (max − min)`` for an in-range guess (``invalid_action`` else).

With ``min_number`` or ``max_number`` None, every reset also draws the range
(``min`` in 1..10, ``max`` in ``min + 5 .. min + 50``) and the turn budget
``⌈√(max − min)⌉ + 1``, as GEM does.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from .base import TextEnv
from .gem_text import GAME_REWARD
from .registry import register_env

__all__ = ["GuessTheNumberEnv"]

_GUESS = re.compile(r"\\boxed{(\d+)}")


@register_env("game:GuessTheNumber-v0")
class GuessTheNumberEnv(TextEnv):
    """Guess a number with higher/lower hints (rules in the module docstring)."""

    whole_response = True

    def __init__(
        self, *, min_number: int | None = 1, max_number: int | None = 20, max_turns: int = 20
    ) -> None:
        self._random_range = min_number is None or max_number is None
        if not self._random_range:
            assert min_number is not None and max_number is not None
            if max_number <= min_number:
                raise ValueError(f"max_number ({max_number}) must exceed min_number ({min_number})")
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self.min_number = 1 if min_number is None else int(min_number)
        self.max_number = 20 if max_number is None else int(max_number)
        self.max_turns = int(max_turns)
        self.target = self.min_number
        self.turn = 0
        self.guesses: set[int] = set()
        self.last = ""

    @property
    def action_space_text(self) -> str:
        return ""

    @property
    def instructions(self) -> str:
        return ""  # the first observation states the rules (GEM's)

    def suffix(self) -> str:
        return "Make your next guess."

    def _rules(self) -> str:
        example = (self.min_number + self.max_number) // 2
        return (
            "You are playing Guess The Number.\n"
            f"A secret whole number lies between {self.min_number} and {self.max_number}, "
            f"both included, and you have {self.max_turns} turns to find it.\n"
            "After each guess you are told whether the secret number is higher or lower.\n"
            "Write whatever you like, but put your guess inside \\boxed{}, e.g. "
            f"\\boxed{{{example}}}: only the last boxed number counts.\n"
            "Your earlier guesses and their hints are listed below as the game goes on.\n"
            "Make your first guess.\n"
        )

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        rng = np.random.default_rng(int(seed))
        if self._random_range:
            self.min_number = int(rng.integers(1, 11))
            self.max_number = int(rng.integers(self.min_number + 5, self.min_number + 51))
            self.max_turns = math.ceil(math.sqrt(self.max_number - self.min_number)) + 1
        self.target = int(rng.integers(self.min_number, self.max_number + 1))
        self.turn, self.guesses = 0, set()
        self.last = self._rules()
        return self.last, {"suffix": self.suffix()}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.turn += 1
        found = _GUESS.findall(action_text)
        guess = int(found[-1]) if found else 0
        info: dict[str, Any] = {"suffix": self.suffix(), "success": False}
        last_turn = self.turn >= self.max_turns
        if not guess:  # GEM treats 0 as no guess, too
            self.last = f"Turn {self.turn}: no guess could be read (put it in \\boxed{{}})."
            info["action_is_valid"] = False
            return self.last, GAME_REWARD.format_error, True, last_turn, info
        in_range = self.min_number <= guess <= self.max_number
        if not in_range:
            obs = f"Turn {self.turn}: you guessed {guess}, which is outside the range."
            reward = GAME_REWARD.invalid_action
        elif guess in self.guesses:
            obs = f"Turn {self.turn}: you guessed {guess}, which you had guessed before."
            reward = GAME_REWARD.invalid_action
        elif guess == self.target:
            self.last = f"Correct! The number was {self.target}; you found it in {self.turn} turns."
            info["success"] = True
            return self.last, GAME_REWARD.success, True, False, info
        else:
            self.guesses.add(guess)
            hint = f"lower than {guess}" if guess > self.target else f"higher than {guess}"
            obs = f"Turn {self.turn}: you guessed {guess}; the secret number is {hint}."
            reward = GAME_REWARD.internal_step
        if last_turn:
            self.last = "No turns are left."
            if in_range:
                span = self.max_number - self.min_number
                reward = 1.0 - abs(guess - self.target) / span
            return self.last, reward, True, True, info
        self.last = obs
        return obs, reward, False, False, info

    def render(self, mode: str = "text") -> str:
        if mode != "text":
            raise ValueError("GuessTheNumber renders text only")
        return self.last
