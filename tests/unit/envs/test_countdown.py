"""Countdown task env: puzzles are solvable, answers are checked safely."""

from __future__ import annotations

import itertools

import numpy as np

from temper.envs.countdown_tool import (
    CountdownEnv,
    CountdownToolEnv,
    check_countdown,
    make_countdown,
)


def brute_force(numbers: list[int], target: int) -> bool:
    def values(nums: tuple[float, ...]) -> set[float]:
        if len(nums) == 1:
            return {nums[0]}
        out: set[float] = set()
        for i, j in itertools.permutations(range(len(nums)), 2):
            rest = tuple(n for k, n in enumerate(nums) if k not in (i, j))
            a, b = nums[i], nums[j]
            for v in {a + b, a - b, a * b} | ({a / b} if b else set()):
                out |= values((*rest, v))
        return out

    return any(abs(v - target) < 1e-9 for v in values(tuple(float(n) for n in numbers)))


def test_puzzles_solvable_and_deterministic():
    for seed in range(15):
        nums, target = make_countdown(np.random.default_rng(seed), 3, 20, 100)
        assert (nums, target) == make_countdown(np.random.default_rng(seed), 3, 20, 100)
        assert 1 <= target <= 100 and brute_force(nums, target)


def test_check_answers():
    assert check_countdown("2 + 5 - 3", [3, 5, 2], 4) == (True, True, "")
    assert check_countdown("(5 - 3) * 2 = 4", [3, 5, 2], 4)[0]
    assert check_countdown("5 - 3 + 2", [3, 5, 2], 2)[:2] == (False, True)  # wrong value
    assert check_countdown("5 - 1", [3, 5, 2], 4)[:2] == (False, True)  # wrong numbers
    assert check_countdown("5 + 5 - 3 - 3", [3, 5, 2], 4)[:2] == (False, True)
    assert check_countdown("__import__('os')", [3, 5, 2], 4)[:2] == (False, False)


def test_env_rewards():
    env = CountdownEnv(max_attempts=2)
    obs, info = env.reset(3)
    assert f"Target: {info['target']}" in obs
    _, r, term, _, inf = env.step("1 +")
    assert r == 0.0 and not term and not inf["action_is_valid"]
    _, r, term, _, inf = env.step(" + ".join(map(str, info["numbers"])) + " + 1000")
    assert r == 0.1 and term and not inf["success"]
    env.reset(3)
    assert env.tool_names() == [] and CountdownToolEnv().tool_names() == ["calculator"]


def test_bandit():
    from temper.envs import make_env

    env = make_env("bandit", lo_arm_name="Trader", hi_arm_name="Librarian")
    orders = {tuple(env.reset(s)[1]["order"]) for s in range(20)}
    assert len(orders) == 2  # shown order drawn from the seed
    obs, _ = env.reset(0)
    assert "Trader" in obs and env.step("dance")[4]["action_is_valid"] is False
    _, r, term, _, info = env.step(" trader ")
    assert term and r == 0.1 and not info["success"]
    pays = []
    for s in range(200):
        env.reset(s)
        _, r, _, _, info = env.step("Librarian")
        pays.append(r)
        assert info["success"]
    assert set(pays) == {0.0, 1.0} and 0.15 < np.mean(pays) < 0.35
