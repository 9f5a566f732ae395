"""``sokoban_sandbox``: the game program's numpy-exact generator, the same game as the
in-process ``sokoban`` through the sandbox, and failed runs ending episodes."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from temper.config.errors import ConfigError
from temper.config.schema import EnvManagerConfig, EnvTagConfig, TemperConfig
from temper.envs import EnvManager, make_env
from temper.envs import sokoban_program as game
from temper.envs.sokoban_sandbox import SokobanSandboxEnv
from temper.pipelines.agentic import MANAGERS, check_env_tags
from temper.pipelines.catalog import build_config
from temper.rewards.sandbox import sandbox_problem
from temper.rewards.sandbox_api import Limits, SandboxChoice

FAST = Limits(wall_time_s=1.0, cpu_time_s=1.0, memory_mb=256)
BOXES = ["bwrap", "none"] if sandbox_problem("bwrap") is None else ["none"]


@pytest.mark.parametrize("seed", [0, 1, 42, 2**32 + 7, 2**70 + 3])
def test_generator_draws_what_numpy_default_rng_draws(seed: int) -> None:
    ref, ours = np.random.default_rng(seed), game.Pcg64(seed)
    for k in range(200):
        op = k % 5
        if op == 0:
            assert ref.integers(1, 5) == ours.integers(1, 5)
        elif op == 1:
            assert ref.integers(4) == ours.integers(4)
        elif op == 2:
            assert ref.random() == ours.random()
        elif op == 3:
            assert ref.permutation(k % 23).tolist() == ours.permutation(k % 23)
        else:  # a range whose rejection threshold is not 0
            assert ref.integers(0, 1_000_003) == ours.integers(0, 1_000_003)


#: rooms the in-process env dealt when it drew from numpy's ``default_rng(seed)`` itself
#: (before it took its generation from the program): the program deals the same
NUMPY_ROOMS = {
    (6, 6, 1, 0): "######/#PXO_#/#_#_##/#_#_##/#___##/######",
    (6, 6, 1, 2**70 + 3): "######/##_###/#P_#_#/#X_#_#/#O___#/######",
    (8, 8, 2, 0): "########/#______#/#_#__###/#_#_√###/#_##O###/#_#__XP#/#______#/########",
    (8, 8, 2, 2**70 + 3): "########/###___##/###____#/#PX__O_#/#_#_##_#/#_#_##√#/#______#/########",
    (7, 9, 3, 0): "#########/#_______#/#_##__###/#_##√_###/#√#____##/#PXO___##/#########",
    (7, 9, 3, 2**70 + 3): "#########/###_#___#/#___#PXO#/#_#√#_#_#/#_#_###_#/#√______#/#########",
}


@pytest.mark.parametrize("room", list(NUMPY_ROOMS))
def test_the_program_deals_the_rooms_numpy_dealt(room: tuple[int, int, int, int]) -> None:
    rows, cols, boxes, seed = room
    want = NUMPY_ROOMS[room].replace("/", "\n")
    _, cells = game.generate(seed, rows, cols, boxes, 30)
    assert game.render(cells, list("#_O√XPS")) == want
    env = make_env("sokoban", dim_x=rows, dim_y=cols, num_boxes=boxes)
    assert env.reset(seed)[0] == want


def test_the_program_answers_a_request_on_stdin(capsys, monkeypatch) -> None:
    cfg = {"rows": 6, "cols": 6, "num_boxes": 1, "max_steps": 5, "search_depth": 30}
    cfg["symbols"] = list("#_O√XPS")
    monkeypatch.setattr(
        "sys.stdin",
        __import__("io").StringIO(json.dumps({"op": "reset", "seed": 3, "config": cfg})),
    )
    game.main()
    reply = json.loads(capsys.readouterr().out)
    assert reply["observation"] == make_env("sokoban").reset(3)[0]
    assert reply["state"]["steps"] == 0


def _pair(box: str, **params) -> tuple[SokobanSandboxEnv, object]:
    env = SokobanSandboxEnv(**params)
    env.use_sandbox(SandboxChoice(box))
    return env, make_env("sokoban", **params)


@pytest.mark.parametrize("box", BOXES)
def test_same_game_as_in_process_sokoban(box: str) -> None:
    """Same room for a seed, same observations, rewards, flags and info for the same
    actions (walls, pushes, unknown actions, truncation at max_steps, a solve)."""
    rng = np.random.default_rng(0)
    moves = ["Up", "Down", "Left", "Right", "3", "jump"]
    for seed, params in ((5, {}), (11, {"dim_x": 7, "dim_y": 7, "num_boxes": 2})):
        sandboxed, local = _pair(box, max_steps=12, **params)
        assert sandboxed.reset(seed) == local.reset(seed)
        for _ in range(40):
            a = moves[int(rng.integers(len(moves)))]
            got, want = sandboxed.step(a), local.step(a)
            assert got == want, a
            assert sandboxed.render("text") == local.render("text")
            if want[2] or want[3]:
                break
        assert want[3]  # truncated at max_steps
    assert sandboxed.errors == 0


def test_a_solved_level_pays_the_same() -> None:
    """A level played to its solution by search: +10 and terminated in both."""
    sandboxed, local = _pair("none")
    local.reset(8)
    sandboxed.reset(8)
    path = _solve(local)
    local.reset(8)
    for a in path:
        got, want = sandboxed.step(a), local.step(a)
        assert got == want
    assert want[2] and want[4]["success"] and want[1] == pytest.approx(-0.1 + 1.0 + 10.0)


def _solve(env) -> list[str]:
    """Breadth-first search over (player, boxes) states of ``env``'s current level."""
    from collections import deque

    start = env.state.copy()
    seen = {start.tobytes()}
    queue = deque([(start, [])])
    while queue:
        state, path = queue.popleft()
        for a in game.ACTIONS:
            env.state = state.copy()
            _, _, done, _, info = env.step(a)
            if done and info["success"]:
                return [*path, a]
            if env.state.tobytes() not in seen:
                seen.add(env.state.tobytes())
                queue.append((env.state.copy(), [*path, a]))
    raise AssertionError("no solution")


FAILURES = {
    "crash": "raise SystemExit('boom')",
    "timeout": "import time; time.sleep(30)",
    "bad JSON": "print('not json')",
    "wrong shape": "import json; print(json.dumps({'observation': 'x', 'info': {}, "
    "'state': {'fixed': [[0]], 'cells': [[0]], 'steps': 0}}))",
}


@pytest.mark.parametrize("why", list(FAILURES))
def test_a_failed_reset_ends_the_episode_at_its_first_step(why: str) -> None:
    env = SokobanSandboxEnv()
    env.use_sandbox(SandboxChoice("none", limits=FAST))
    env.program = FAILURES[why]
    obs, info = env.reset(3)
    assert obs.startswith("Error: the Sokoban game in the sandbox failed")
    assert info["env_error"] and env.errors == 1
    obs, reward, terminated, truncated, info = env.step("Up")
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert info["env_error"] and info["action_is_valid"] and not info["success"]
    assert env.errors == 1  # one failure, reported at reset and where it ends the episode


def test_a_failed_step_ends_the_episode_and_the_manager_counts_it(caplog) -> None:
    tag = EnvTagConfig(env_type="sokoban_sandbox", env_config={"max_steps": 10})
    mgr_cfg = EnvManagerConfig(num_env_groups=1, group_size=2, tags=["S"])
    manager = EnvManager(mgr_cfg, {"S": tag}, sandbox=SandboxChoice("none", limits=FAST))
    assert all(manager.env(i).choice.name == "none" for i in range(2))
    manager.reset(step=0)
    broken = manager.env(1)
    assert isinstance(broken, SokobanSandboxEnv)
    broken.program = FAILURES["bad JSON"]
    results = manager.step([0, 1], ["<answer>Up</answer>", "<answer>Up</answer>"])
    assert "env_error" not in results[0].info
    assert results[1].done and results[1].terminated and results[1].reward == 0.0
    assert "not JSON" in results[1].info["env_error"]
    assert results[1].format_ok  # the env failed, not the answer: no format penalty
    assert manager.episode_stats(1)["env_errors"] == 1
    assert manager.episode_stats(0)["env_errors"] == 0
    assert "failed, its episode ends" in caplog.text
    assert "reward.sandbox: none: the envs of S run their programs with NO isolation" in caplog.text


def _run_config(**reward: Any) -> TemperConfig:
    tag = {"env_type": "sokoban_sandbox", "env_config": {"max_steps": 5}}
    return build_config(
        {
            "pipeline": "agentic",
            "experiment": {"max_steps": 1},
            "model": {"path": "unused"},  # check_env_tags reads no model
            "reward": reward,
            "agentic": {
                "train_env_manager": {"num_env_groups": 1, "group_size": 2, "tags": ["S"]},
                "val_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["S"]},
                "custom_envs": {"S": tag},
            },
        }
    )


def test_temper_check_plays_in_reward_sandbox_and_warns_without_one() -> None:
    notes: list[str] = []
    check_env_tags(_run_config(sandbox="none"), MANAGERS, notes)
    assert len(notes) == 1 and "reward.sandbox: none" in notes[0] and "NO isolation" in notes[0]
    notes.clear()
    check_env_tags(_run_config(), MANAGERS, notes)  # bwrap (where it runs) or its refusal
    assert notes == []
    with pytest.raises(ConfigError) as err:
        check_env_tags(_run_config(sandbox="sandbox_fusion"), MANAGERS, notes)
    assert err.value.key == "reward.sandbox_url" and "sokoban_sandbox" in str(err.value)


def test_the_resets_of_one_room_run_the_sandbox_once(monkeypatch) -> None:
    """A group's envs share their seed: the first reset runs the game, the others take its
    reply (a seed's room is the same every time); each env then plays on its own."""
    runs: list[str] = []
    real = SokobanSandboxEnv._run

    def counted(self: SokobanSandboxEnv, request: dict) -> dict:
        runs.append(request["op"])
        return real(self, request)

    monkeypatch.setattr(SokobanSandboxEnv, "_run", counted)
    envs = [SokobanSandboxEnv() for _ in range(3)]
    for env in envs:
        env.use_sandbox(SandboxChoice("none", limits=FAST))
    seed = 918_273  # a seed no other test resets
    dealt = [env.reset(seed) for env in envs]
    assert runs == ["reset"] and dealt[1] == dealt[0] == dealt[2]
    assert all(np.array_equal(env.state, envs[0].state) for env in envs)
    envs[1].step("Up")
    assert runs == ["reset", "step"]
    assert np.array_equal(envs[2].state, envs[0].state)  # the others' rooms untouched
    other = SokobanSandboxEnv(dim_x=7, dim_y=7)  # another room, another run
    other.use_sandbox(SandboxChoice("none", limits=FAST))
    other.reset(seed)
    assert runs == ["reset", "step", "reset"]
