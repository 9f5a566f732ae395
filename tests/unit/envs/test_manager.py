"""Env manager (groups, seeds, turns, penalties) and the env registry (tags, ROLL keys)."""

from __future__ import annotations

import pytest

from temper.config.errors import ConfigError
from temper.config.schema import AgenticConfig, EnvManagerConfig, EnvTagConfig
from temper.envs import EnvManager, make_env, resolve_tag, split_groups
from temper.envs.base import TextEnv

ENVS = {
    "SimpleSokoban": EnvTagConfig(
        env_type="sokoban",
        max_turns=3,
        format_penalty=-0.1,
        env_config={"dim_x": 6, "dim_y": 6, "num_boxes": 1},
    ),
    "FrozenLake": EnvTagConfig(
        env_type="frozen_lake",
        max_turns=4,
        env_config={"is_slippery": False, "render_mode": "text"},
    ),
    "Countdown": EnvTagConfig(env_type="countdown_tool", max_turns=2),
}


def manager(mode="train", seed=7, **kw):
    cfg = EnvManagerConfig(
        **{"num_env_groups": 4, "group_size": 3, "tags": ["SimpleSokoban"], "n_groups": None, **kw}
    )
    return EnvManager(cfg, ENVS, seed=seed, mode=mode, max_actions_per_traj=5)


def test_seeds_equal_within_group_and_differ_across():
    m = manager()
    slots = m.reset(step=0)
    assert [s.env_id for s in slots] == list(range(12))
    assert [s.group_id for s in slots] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    for g in range(4):
        group = [s for s in slots if s.group_id == g]
        assert len({s.seed for s in group}) == 1 and len({s.observation for s in group}) == 1
    assert len({s.seed for s in slots}) == 4
    again = manager().reset(step=0)
    assert [s.seed for s in again] == [s.seed for s in slots]  # deterministic
    later = m.reset(step=1)
    assert {s.seed for s in later}.isdisjoint({s.seed for s in slots})
    assert {s.seed for s in m.reset(step=0, round_=1)}.isdisjoint({s.seed for s in slots})


def test_reset_of_some_groups_leaves_the_others_alone():
    """Streaming plays a few env groups at a time: their episodes get the seeds a full
    reset of that step gives them, the other envs keep theirs."""
    m = manager()
    before = {s.env_id: s.seed for s in m.reset(step=1)}
    some = m.reset(step=5, groups=[2, 0])
    assert [s.env_id for s in some] == [0, 1, 2, 6, 7, 8]
    full = {s.env_id: s.seed for s in manager().reset(step=5)}
    assert all(s.seed == full[s.env_id] for s in some)
    assert m.state_dict()["seeds"][3:6] == [before[i] for i in range(3, 6)]


def test_validation_seeds_disjoint_from_training():
    train, val = manager("train"), manager("val")
    train_seeds = {train.seed(step, g) for step in range(50) for g in range(8)}
    val_seeds = {val.seed(step, g) for step in range(50) for g in range(8)}
    assert train_seeds.isdisjoint(val_seeds)
    assert all(s % 2 == 0 for s in train_seeds) and all(s % 2 == 1 for s in val_seeds)
    assert manager("val").reset(0)[0].seed == val.reset(0)[0].seed  # fixed val set


def test_n_groups_split():
    assert split_groups(5, ["a", "b"], None) == ["a", "a", "a", "b", "b"]
    assert split_groups(3, ["a", "b"], [1, 2]) == ["a", "b", "b"]
    with pytest.raises(ValueError):
        split_groups(3, ["a", "b"], [1, 1])
    m = manager(tags=["SimpleSokoban", "FrozenLake"], n_groups=[1, 3])
    tags = [s.tag for s in m.reset(0)]
    assert tags == ["SimpleSokoban"] * 3 + ["FrozenLake"] * 9
    even = manager(tags=["SimpleSokoban", "FrozenLake"])
    assert [s.tag for s in even.reset(0)].count("FrozenLake") == 6
    with pytest.raises(ConfigError, match=r"agentic.train_env_manager.n_groups"):
        manager(tags=["SimpleSokoban", "FrozenLake"], n_groups=[1, 1])


def test_step_turns_penalty_and_truncation():
    m = manager(group_size=1, num_env_groups=2)
    m.reset(0)
    res = m.step([0, 1], ["no tags here", "<answer>Up || Up</answer>"])
    assert res[0].penalty == -0.1 and not res[0].format_ok and res[0].executed == 0
    assert res[0].reward == pytest.approx(-0.1) and not res[0].done
    assert res[1].format_ok and res[1].executed == 2 and res[1].penalty == 0.0
    r = m.step([1], ["<answer>Up || Fly</answer>"])[0]  # unknown piece: penalty, Up still runs
    assert r.executed == 1 and r.penalty == -0.1 and r.info["parse_reason"]
    r = m.step([1], ["<answer>Down||Down||Down</answer>"])[0]  # 5-action cap → truncated
    assert r.executed == 2 and r.truncated and r.done and m.episode_stats(1)["actions"] == 5
    with pytest.raises(ValueError, match="done"):
        m.step([1], ["<answer>Up</answer>"])
    m.step([0], ["<answer>Left</answer>"])
    assert m.step([0], ["<answer>Left</answer>"])[0].truncated  # max_turns=3
    assert m.active() == []


def test_success_and_override_penalty_and_frames():
    cfg = EnvManagerConfig(num_env_groups=1, group_size=1, tags=["FrozenLake"], format_penalty=-0.5)
    envs = {
        "FrozenLake": EnvTagConfig(
            env_type="frozen_lake",
            max_turns=4,
            env_config={"is_slippery": False, "desc": ["SFF", "HHF", "FFG"]},
        )
    }
    m = EnvManager(cfg, envs, seed=1, record_frames=True)
    slot = m.reset(0)[0]
    assert "Reply in the format <answer>" in slot.instruction and "O hole" in slot.instruction
    assert m.step([0], ["<answer>Jump</answer>"])[0].penalty == -0.5
    r = m.step([0], ["<answer>right||RIGHT||down||down</answer>"])[0]
    assert r.success and r.terminated and r.reward == 1.0 and r.executed == 4
    frames = m.frames(0)  # reset + 4 moves, each text then image
    assert len(frames) == 10 and frames[0] == slot.observation
    assert frames[1].shape == (48, 48, 3) and frames[-2].endswith("√")


def test_think_required_by_manager():
    agentic = AgenticConfig(custom_envs=ENVS, enable_think=True)
    agentic.train_env_manager = EnvManagerConfig(num_env_groups=1, group_size=1, tags=["Countdown"])
    m = EnvManager.from_agentic(agentic, "train", seed=0)
    slot = m.reset(0)[0]
    assert "<think>" in slot.instruction and "calculator" in slot.instruction
    assert m.env(0).tool_names() == ["calculator"]
    r = m.step([0], ["<answer>1+1</answer>"])[0]
    assert not r.format_ok and r.executed == 0


def test_max_traj_per_env_bounds_the_one_episode_each_env_plays():
    """Every env instance plays one trajectory per step (ROLL's per-env replays are
    groups here), so -1 and any bound ≥ 1 run the same pool; 0 or < -1 cannot."""
    for limit in (-1, 1, 8):
        m = manager(max_traj_per_env=limit)
        slots = m.reset(step=0)
        assert len(slots) == m.num_envs == 12 and len({s.env_id for s in slots}) == 12
    for limit in (0, -2):
        with pytest.raises(ConfigError) as err:
            manager(max_traj_per_env=limit)
        assert err.value.key == "agentic.train_env_manager.max_traj_per_env"
        assert "-1" in err.value.fix
    with pytest.raises(ConfigError, match="agentic.val_env_manager.max_traj_per_env"):
        agentic = AgenticConfig(
            train_env_manager=EnvManagerConfig(tags=["FrozenLake"]),
            val_env_manager=EnvManagerConfig(tags=["FrozenLake"], max_traj_per_env=0),
            custom_envs=ENVS,
        )
        EnvManager.from_agentic(agentic, "val", seed=0)


def test_registry_errors_and_roll_keys():
    with pytest.raises(
        ConfigError, match=r"agentic.custom_envs.S.env_type.*did you mean 'sokoban'"
    ):
        resolve_tag("S", EnvTagConfig(env_type="sokobn"))
    with pytest.raises(ConfigError, match=r"env_config.num_box.*did you mean 'num_boxes'"):
        resolve_tag("S", EnvTagConfig(env_type="sokoban", env_config={"num_box": 2}))
    with pytest.raises(ConfigError, match=r"agentic.custom_envs.S.env_config"):
        resolve_tag("S", EnvTagConfig(env_type="sokoban", env_config={"dim_x": 2}))
    spec = resolve_tag(
        "S",
        EnvTagConfig(
            env_type="sokoban",
            env_config={
                "dim_room": [7, 8],
                "search_depth": 10,
                "render_mode": "rgb_array",
                "action_pattern": r"\[(.*?)\]",
                "format_penalty": -0.3,
            },
        ),
    )
    assert spec.action_pattern == r"\[(.*?)\]" and spec.format_penalty == -0.3
    assert spec.make().rows == 7 and "render_mode" not in spec.params
    fl = resolve_tag(
        "F",
        EnvTagConfig(env_type="frozen_lake", env_config={"size": 5, "p": 0.7, "is_slippery": True}),
    )
    assert fl.make().size == 5
    assert isinstance(make_env("countdown"), TextEnv)
    with pytest.raises(ConfigError, match="agentic.train_env_manager.tags"):
        manager(tags=["Nope"])


def test_free_form_pattern_and_turn_prompt():
    """A tag with a plain-words action pattern gets no <answer> format line, its question
    follows every observation, and the first direction word is the action."""
    envs = {
        "Lake": EnvTagConfig(
            env_type="frozen_lake",
            max_turns=4,
            env_instruction="Reach G.",
            action_pattern=r"\b(up|down|left|right)\b",
            turn_prompt="Which direction: up, down, left or right?",
            env_config={"is_slippery": False, "desc": ["SFF", "HHF", "FFG"]},
        )
    }
    cfg = EnvManagerConfig(num_env_groups=1, group_size=1, tags=["Lake"])
    m = EnvManager(cfg, envs, seed=1)
    slot = m.reset(0)[0]
    assert "<answer>" not in slot.instruction and slot.instruction.startswith("Reach G.")
    text = m.turn_text(0, slot.observation)
    assert text == f"{slot.observation}\n\nWhich direction: up, down, left or right?"
    r = m.step([0], ["I would go Right, then maybe down"])[0]
    assert r.format_ok and r.actions == ["Right"] and r.executed == 1
    assert not m.step([0], ["no idea"])[0].format_ok
    default = manager().reset(0)[0]  # the default pattern keeps its format line, no question
    assert "Reply in the format <answer>" in default.instruction
    assert manager().turn_text(0, "grid") == "grid"
