"""FrozenLake: text legend, deterministic maps, non-slippery path to the goal, slips."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from temper.envs.frozen_lake import ACTIONS, FrozenLakeEnv

DELTAS = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}


def shortest_path(rows: list[str]) -> list[str]:
    start = next((r, c) for r, row in enumerate(rows) for c, ch in enumerate(row) if ch == "S")
    prev = {start: None}
    todo = deque([start])
    while todo:
        node = todo.popleft()
        if rows[node[0]][node[1]] == "G":
            path = []
            while prev[node] is not None:
                node, move = prev[node]
                path.append(move)
            return path[::-1]
        for move, (dr, dc) in DELTAS.items():
            r, c = node[0] + dr, node[1] + dc
            inside = 0 <= r < len(rows) and 0 <= c < len(rows[0])
            if inside and rows[r][c] != "H" and (r, c) not in prev:
                prev[(r, c)] = (node, move)
                todo.append((r, c))
    raise AssertionError("no path")


def test_fixed_map_text_and_path_to_goal():
    desc = ["SFFF", "FHFH", "FFFH", "HFFG"]  # gymnasium's 4x4 map
    env = FrozenLakeEnv(desc=desc, is_slippery=False)
    obs, _ = env.reset(0)
    assert obs == "P___\n_O_O\n___O\nO__G"
    assert "O hole" in env.action_space_text and env.valid_actions() == ACTIONS
    moves = ["Down", "Down", "Right", "Right", "Down", "Right"]
    for k, m in enumerate(moves):
        obs, r, term, trunc, info = env.step(m)
        assert info["action_is_valid"] and not trunc
        assert term == (k == len(moves) - 1)
    assert r == 1.0 and info["success"]
    assert obs == "____\n_O_O\n___O\nO__√"


def test_hole_edge_and_invalid():
    env = FrozenLakeEnv(desc=["SH", "FG"], is_slippery=False)
    env.reset(0)
    _, r, term, _, info = env.step("up")  # off the map: stays
    assert not info["action_is_effective"] and not term and r == 0.0
    _, r, term, _, info = env.step("fly")
    assert not info["action_is_valid"] and env.steps == 1
    obs, r, term, _, info = env.step("3")  # id 3 = Right → the hole
    assert term and r == 0.0 and not info["success"] and obs.splitlines()[0] == "_X"


@pytest.mark.parametrize("seed", range(10))
def test_random_maps_deterministic_and_solvable(seed):
    env = FrozenLakeEnv(size=5, p=0.7, is_slippery=False)
    obs, info = env.reset(seed)
    assert FrozenLakeEnv(size=5, p=0.7, is_slippery=False).reset(seed)[0] == obs
    rows = info["map"]
    assert len(rows) == 5 and "".join(rows).count("S") == 1
    for m in shortest_path(rows):
        _, r, term, _, info = env.step(m)
    assert term and info["success"] and r == 1.0


def test_slippery_is_seeded_and_slips():
    env = FrozenLakeEnv(
        desc=["SFFFFFFF"] + ["FFFFFFFF"] * 6 + ["FFFFFFFG"], is_slippery=True, max_steps=300
    )

    def run(seed):
        env.reset(seed)
        return [env.step("Right")[4]["executed_action"] for _ in range(60)]

    a = run(1)
    assert a == run(1) and set(a) >= {"Right", "Up", "Down"}
    assert env.render("rgb_array").shape == (128, 128, 3)


def test_truncation_and_map_seed():
    env = FrozenLakeEnv(desc=["SF", "FG"], is_slippery=False, max_steps=2)
    env.reset(0)
    env.step("Left")
    assert env.step("Up")[3] is True
    fixed = FrozenLakeEnv(size=4, map_seed=7)
    assert fixed.reset(1)[1]["map"] == fixed.reset(2)[1]["map"]
    assert np.array(fixed.reset(1)[1]["map"]).shape == (4,)
