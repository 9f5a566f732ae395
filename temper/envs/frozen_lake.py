"""FrozenLake: walk over a frozen lake to the goal without falling into a hole.

The dynamics are gymnasium's ``FrozenLake-v1`` (reimplemented here, a few
lines, so the package does not depend on gymnasium): actions 0 Left, 1 Down,
2 Right, 3 Up; on slippery ice the agent moves in the intended direction or
one of the two perpendicular ones, each with probability 1/3; moves off the
map leave it in place; reaching ``G`` gives reward 1 and ends the episode,
falling into ``H`` ends it with 0.

Maps (ROLL/RAGEN ``FrozenLakeEnvConfig``): ``desc`` (rows of ``S F H G``) fixes
the map; otherwise a random ``size``×``size`` map is drawn per episode from the
reset seed (or from ``map_seed`` when given): each cell frozen with probability
``p``, start and goal at two random cells, redrawn until the goal is reachable.
All randomness (map, slips) comes from ``numpy.random.default_rng(seed)``.

Text (RAGEN symbols; one character per cell, rows on lines):

====  ==================
``P``  player
``_``  frozen ice (the start cell too)
``O``  hole
``G``  goal
``X``  player fallen into a hole
``√``  player on the goal
====  ==================

Actions: ``Left``, ``Down``, ``Right``, ``Up`` (ids 1-4 in that order, as ROLL's
``action_lookup``). ``truncated`` after ``max_steps`` valid steps. An unknown
action string changes nothing and is not counted.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from .base import TextEnv
from .registry import register_env
from .render import render_tiles

__all__ = ["ACTIONS", "FrozenLakeEnv", "random_map"]

ACTIONS = ["Left", "Down", "Right", "Up"]
_DELTAS = [(0, -1), (1, 0), (0, 1), (-1, 0)]
SYMBOLS = {"player": "P", "F": "_", "S": "_", "H": "O", "G": "G", "fell": "X", "won": "√"}
LEGEND = "P player, _ frozen ice, O hole, G goal, X player in a hole, √ player on the goal"
_COLORS = {
    0: (200, 230, 255),
    1: (20, 40, 90),
    2: (80, 200, 80),
    3: (230, 60, 40),
    4: (120, 30, 30),
    5: (250, 210, 40),
}


def _reachable(board: np.ndarray, start: tuple[int, int]) -> bool:
    n_r, n_c = board.shape
    seen, todo = {start}, deque([start])
    while todo:
        r, c = todo.popleft()
        if board[r, c] == "G":
            return True
        for dr, dc in _DELTAS:
            nr, nc = r + dr, c + dc
            if 0 <= nr < n_r and 0 <= nc < n_c and (nr, nc) not in seen and board[nr, nc] != "H":
                seen.add((nr, nc))
                todo.append((nr, nc))
    return False


def random_map(rng: np.random.Generator, size: int, p: float) -> list[str]:
    """A random solvable ``size``×``size`` map (rows of ``S F H G``)."""
    for _ in range(10_000):
        board = np.where(rng.random((size, size)) < p, "F", "H").astype("<U1")
        s, g = rng.choice(size * size, size=2, replace=False)
        start, goal = divmod(int(s), size), divmod(int(g), size)
        board[start], board[goal] = "S", "G"
        if _reachable(board, start):
            return ["".join(row) for row in board]
    raise RuntimeError(f"no solvable {size}x{size} map with p={p}")


@register_env("frozen_lake")
class FrozenLakeEnv(TextEnv):
    """Reach the goal without falling into a hole (rules and legend in the module docstring)."""

    render_modes = ("text", "rgb_array")

    def __init__(
        self,
        *,
        size: int = 4,
        p: float = 0.8,
        is_slippery: bool = True,
        desc: list[str] | None = None,
        map_seed: int | None = None,
        max_steps: int = 100,
    ) -> None:
        if desc is None and size < 2:
            raise ValueError("size must be at least 2")
        if not 0.0 < p <= 1.0:
            raise ValueError(f"p={p} must be in (0, 1] (the probability of a frozen cell)")
        if desc is not None:
            rows = [str(r) for r in desc]
            if len({len(r) for r in rows}) != 1 or set("".join(rows)) - set("SFHG"):
                raise ValueError("desc must be equal-length rows of S, F, H, G")
            if "".join(rows).count("S") != 1 or "G" not in "".join(rows):
                raise ValueError("desc needs one S and at least one G")
        self.size, self.p, self.is_slippery = int(size), float(p), bool(is_slippery)
        self.desc, self.map_seed, self.max_steps = desc, map_seed, int(max_steps)
        self.board = np.array([["S"]], dtype="<U1")
        self.pos = (0, 0)
        self.steps = 0
        self.rng = np.random.default_rng(0)

    def valid_actions(self) -> list[str]:
        return list(ACTIONS)

    @property
    def action_space_text(self) -> str:
        return f"Symbols: {LEGEND}. Actions: {', '.join(ACTIONS)}."

    @property
    def instructions(self) -> str:
        slip = (
            " The ice is slippery: you may move in a direction you did not intend."
            if self.is_slippery
            else ""
        )
        return (
            "You are solving the FrozenLake puzzle: walk to the goal G without falling into "
            f"a hole.{slip}\n{self.action_space_text}"
        )

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.rng = np.random.default_rng(int(seed))
        if self.desc is not None:
            rows = list(self.desc)
        else:
            map_rng = self.rng if self.map_seed is None else np.random.default_rng(self.map_seed)
            rows = random_map(map_rng, self.size, self.p)
        self.board = np.array([list(r) for r in rows], dtype="<U1")
        r, c = np.argwhere(self.board == "S")[0]
        self.pos, self.steps = (int(r), int(c)), 0
        return self.text(), {"seed": int(seed), "map": rows}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        s = " ".join(str(action_text).split()).lower()
        names = [a.lower() for a in ACTIONS]
        if s in names:
            a = names.index(s)
        elif s in {"1", "2", "3", "4"}:
            a = int(s) - 1
        else:
            info: dict[str, Any] = {
                "action_is_valid": False,
                "action_is_effective": False,
                "success": False,
            }
            return self.text(), 0.0, False, False, info
        if self.is_slippery:
            a = (a + int(self.rng.integers(-1, 2))) % 4
        dr, dc = _DELTAS[a]
        r, c = self.pos[0] + dr, self.pos[1] + dc
        moved = 0 <= r < self.board.shape[0] and 0 <= c < self.board.shape[1]
        if moved:
            self.pos = (r, c)
        self.steps += 1
        cell = self.board[self.pos]
        success = cell == "G"
        terminated = success or cell == "H"
        truncated = not terminated and self.steps >= self.max_steps
        info = {
            "action_is_valid": True,
            "action_is_effective": moved,
            "success": bool(success),
            "executed_action": ACTIONS[a],
        }
        return self.text(), 1.0 if success else 0.0, bool(terminated), truncated, info

    def _codes(self) -> np.ndarray:
        codes = np.where(self.board == "H", 1, np.where(self.board == "G", 2, 0))
        cell = self.board[self.pos]
        codes[self.pos] = 4 if cell == "H" else 5 if cell == "G" else 3
        return codes

    def render(self, mode: str = "text") -> str | np.ndarray:
        if mode == "text":
            lines = []
            for r, row in enumerate(self.board):
                out = []
                for c, ch in enumerate(row):
                    if (r, c) == self.pos:
                        out.append({"H": SYMBOLS["fell"], "G": SYMBOLS["won"]}.get(ch, "P"))
                    else:
                        out.append(SYMBOLS[ch])
                lines.append("".join(out))
            return "\n".join(lines)
        if mode == "rgb_array":
            return render_tiles(self._codes(), _COLORS)
        raise ValueError(f"unknown render mode '{mode}' (use 'text' or 'rgb_array')")
