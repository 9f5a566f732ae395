"""Two-armed bandit (ROLL/RAGEN ``Bandit`` tag): one pull, pick the better arm by its name.

The arms carry names (ROLL ``lo_arm_name`` / ``hi_arm_name``, e.g. "Phoenix" and
"Dragon") so the model must reason from the names alone. RAGEN's payoffs: the
low arm pays ``lo_arm_score`` (0.1) always; the high arm pays ``hi_arm_hiscore``
(1.0) with probability ``hi_arm_hiscore_prob`` (0.25), else ``hi_arm_loscore``
(0.0) — so its expectation (0.25) is higher. The order the arms are shown in is
drawn from the reset seed. Actions: the arm names, or ids 1-2 in the shown order.
One pull ends the episode; ``success`` means the arm of higher expected payoff was pulled.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import TextEnv
from .registry import register_env

__all__ = ["BanditEnv"]


@register_env("bandit")
class BanditEnv(TextEnv):
    """Pull one of two named arms (rules in the module docstring)."""

    def __init__(
        self,
        *,
        lo_arm_name: str = "Phoenix",
        hi_arm_name: str = "Dragon",
        lo_arm_score: float = 0.1,
        hi_arm_loscore: float = 0.0,
        hi_arm_hiscore: float = 1.0,
        hi_arm_hiscore_prob: float = 0.25,
    ) -> None:
        if lo_arm_name.strip().lower() == hi_arm_name.strip().lower():
            raise ValueError("the two arms need different names")
        if not 0.0 <= hi_arm_hiscore_prob <= 1.0:
            raise ValueError("hi_arm_hiscore_prob must be in [0, 1]")
        self.lo, self.hi = lo_arm_name.strip(), hi_arm_name.strip()
        self.lo_score, self.hi_lo, self.hi_hi = lo_arm_score, hi_arm_loscore, hi_arm_hiscore
        self.hi_prob = hi_arm_hiscore_prob
        hi_mean = hi_arm_hiscore_prob * hi_arm_hiscore + (1 - hi_arm_hiscore_prob) * hi_arm_loscore
        self.best = self.hi if hi_mean >= lo_arm_score else self.lo
        self.order = [self.lo, self.hi]
        self.rng = np.random.default_rng(0)
        self.pulled: str | None = None

    def valid_actions(self) -> list[str]:
        return list(self.order)

    @property
    def action_space_text(self) -> str:
        return f"Actions: {self.order[0]}, {self.order[1]} (the arm to pull)."

    @property
    def instructions(self) -> str:
        return (
            "You are playing a bandit game: pull one of two slot-machine arms to maximise "
            f"your expected reward.\n{self.action_space_text}"
        )

    def _obs(self) -> str:
        if self.pulled is None:
            return f"Two arms: {self.order[0]} and {self.order[1]}. Which arm do you pull?"
        return f"You pulled {self.pulled}."

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.rng = np.random.default_rng(int(seed))
        self.order = [self.lo, self.hi] if self.rng.random() < 0.5 else [self.hi, self.lo]
        self.pulled = None
        return self._obs(), {"order": list(self.order)}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        s = " ".join(str(action_text).split()).lower()
        names = [a.lower() for a in self.order]
        if s in names:
            arm = self.order[names.index(s)]
        elif s in {"1", "2"}:
            arm = self.order[int(s) - 1]
        else:
            info = {"action_is_valid": False, "action_is_effective": False, "success": False}
            return self._obs(), 0.0, False, False, info
        self.pulled = arm
        if arm == self.hi:
            reward = self.hi_hi if self.rng.random() < self.hi_prob else self.hi_lo
        else:
            reward = self.lo_score
        info = {"action_is_valid": True, "action_is_effective": True, "success": arm == self.best}
        return self._obs(), float(reward), True, False, info

    def render(self, mode: str = "text") -> str:
        if mode != "text":
            raise ValueError(f"bandit renders only as text, not '{mode}'")
        return self._obs()
