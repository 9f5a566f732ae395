"""ROLL's env manager classes and GiGPO keys through the ROLL dialect."""

from __future__ import annotations

from typing import Any

import pytest

from temper.config.dialects.roll.gigpo import STEP, TRAJ
from temper.config.dialects.roll.translate import translate_roll
from temper.config.errors import ConfigError
from temper.config.loader import RawConfig
from temper.config.schema import TemperConfig
from temper.config.typed import from_dict


def agentic(**top: Any) -> dict[str, Any]:
    """A minimal step-wise gigpo file: two tags, the step env manager, ROLL's examples'
    normalization."""
    base: dict[str, Any] = {
        "adv_estimator": "gigpo",
        "rollout_batch_size": 4,
        "sequence_length": 1024,
        "actor_infer": {"generating_args": {"max_new_tokens": 128}},
        "actor_train": {"training_args": {"learning_rate": 1e-6}},  # a training file
        "reward_normalization": {"grouping": "traj_group_id", "method": "mean"},
        "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["A"]},
        "val_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["B"]},
        "custom_envs": {
            "A": {"env_type": "sokoban", "env_manager_cls": STEP, "history_length": 3},
            "B": {"env_type": "frozen_lake", "env_manager_cls": STEP},
        },
    }
    base.update(top)
    return base


def run(data: dict[str, Any]) -> tuple[TemperConfig, list[str]]:
    t = translate_roll(RawConfig(data=data, source="<test>", from_defaults=set()))
    return from_dict(TemperConfig, t.native), t.notes


def test_step_env_manager_and_gigpo_keys() -> None:
    cfg, notes = run(agentic(step_reward_gamma=0.9, step_reward_weight=0.5))
    assert cfg.agentic.env_manager == "step"
    assert cfg.agentic.custom_envs["A"].history_length == 3
    assert cfg.agentic.custom_envs["B"].history_length is None
    algo = cfg.algorithm
    assert algo.adv_estimator == "gigpo"
    assert (algo.gigpo_step_gamma, algo.gigpo_step_weight, algo.gigpo_episode_weight) == (
        0.9,
        0.5,
        1.0,
    )
    # method mean: the estimator centres both levels, without dividing by the std, and
    # the pipeline's own normalization stays off (no second pass)
    assert algo.norm_adv_by_std_in_grpo is False
    assert cfg.agentic.reward_normalization.method == "identity"
    assert any("gigpo estimator at both levels" in n for n in notes)
    # a step sample is one prompt and one answer inside sequence_length
    assert cfg.data.max_prompt_length == 1024 - 128


def test_mean_std_divides_by_the_std() -> None:
    data = agentic(reward_normalization={"grouping": "traj_group_id", "method": "mean_std"})
    cfg, _ = run(data)
    assert cfg.algorithm.norm_adv_by_std_in_grpo is True


def test_trajectory_class_and_gigpo_keys_elsewhere_are_noted() -> None:
    data = agentic(adv_estimator="reinforce", step_reward_weight=0.5)
    for tag in data["custom_envs"].values():
        tag["env_manager_cls"] = TRAJ
    cfg, notes = run(data)
    assert cfg.agentic.env_manager == "trajectory"
    assert cfg.agentic.custom_envs["A"].history_length is None
    assert any("custom_envs.A.history_length" in n and "StepEnvManager only" in n for n in notes)
    assert any(n.startswith("step_reward_weight") and "gigpo" in n for n in notes)
    assert cfg.algorithm.gigpo_step_weight == 1.0


@pytest.mark.parametrize(
    ("change", "key", "words"),
    [
        (
            {"custom_envs": {"A": {"env_type": "sokoban", "env_manager_cls": "my.Manager"}}},
            "custom_envs.A.env_manager_cls",
            "custom ROLL env manager class",
        ),
        (
            {
                "custom_envs": {
                    "A": {"env_type": "sokoban", "env_manager_cls": STEP},
                    "B": {"env_type": "frozen_lake"},
                }
            },
            "custom_envs.A.env_manager_cls",
            "A: step, B: trajectory",
        ),
        (
            {"reward_normalization": {"grouping": "batch", "method": "mean"}},
            "reward_normalization.grouping",
            "env group",
        ),
        (
            {"reward_normalization": {"grouping": "traj_group_id", "method": "identity"}},
            "reward_normalization.method",
            "the same way",
        ),
        (
            {
                "reward_normalization": {
                    "grouping": "traj_group_id",
                    "method": "mean",
                    "norm_std_type": "group",
                }
            },
            "reward_normalization.method",
            "the same way",
        ),
        (
            {"custom_envs": {"A": {"env_type": "webshop", "env_manager_cls": STEP}}},
            "custom_envs.A.env_type",
            "million products",
        ),
    ],
)
def test_refusals_name_the_key(change: dict[str, Any], key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        run(agentic(**change))
    assert err.value.key == key and words in str(err.value), str(err.value)
    assert err.value.fix


def test_sokoban_sandbox_plays_here_and_its_rock_service_url_is_noted() -> None:
    """ROLL's SokobanSandbox runs in temper's own sandbox: the ROCK service keys leave
    the env_config with one note line; the game's own keys stay."""
    envs = {
        "A": {
            "env_type": "sokoban_sandbox",
            "env_config": {"base_url": "http://localhost:8080", "max_steps": 7},
        },
        "B": {"env_type": "sokoban_sandbox"},  # the ROLL default url: nothing to note
    }
    cfg, notes = run(
        agentic(custom_envs=envs, adv_estimator="grpo", reward_normalization={"method": "mean"})
    )
    assert cfg.agentic.custom_envs["A"].env_type == "sokoban_sandbox"
    assert cfg.agentic.custom_envs["A"].env_config == {"max_steps": 7}
    assert cfg.agentic.custom_envs["B"].env_config == {}
    lines = [n for n in notes if "base_url" in n]
    assert len(lines) == 1 and "temper's own sandbox (reward.sandbox)" in lines[0], notes
