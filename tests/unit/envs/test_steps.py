"""The step-wise env manager's prompt: ROLL's history window and template fields."""

from __future__ import annotations

from temper.envs import EnvManager, StepRecord, history_window, render_step_prompt
from temper.pipelines.catalog import build_config

R = [StepRecord(f"o{k}", f"a{k}", float(k), valid=k != 1) for k in range(4)]


def test_history_window_counts_the_current_step() -> None:
    # ROLL's window history[-n:-1] over the steps so far plus the current one
    assert history_window(R, None) == []
    assert history_window(R, 1) == []
    assert history_window(R, 3) == R[-2:]
    assert history_window(R, 10) == R
    assert history_window(R, 0) == R  # an empty slice start: everything before the current
    assert history_window([], 5) == []


def test_template_fields_and_the_invalid_tip() -> None:
    text = render_step_prompt(
        instruction="Reach G.",
        observation="now",
        records=R,
        history_length=3,
        template=(
            "{env_instruction}|{step_count}|{history_length}|{current_step}|"
            "{current_observation}|{max_response_length}|{unknown}|{history}"
        ),
        max_response_length=64,
    )
    head, history = text.split("|{unknown}|")
    assert head == "Reach G.|4|2|5|now|64"  # 4 steps taken, 2 shown, the 5th is next
    # steps 3 and 4 of the episode (1-based), the window's first numbered 4 - 2 + 1
    assert history == (
        "(step: 3, observation: o2, action: a2, reward: 2), "
        "(step: 4, observation: o3, action: a3, reward: 3)"
    )
    invalid = render_step_prompt(
        instruction="", observation="x", records=R[:2], history_length=0, template="{history}"
    )
    assert "a1 (this answer was not a valid action" in invalid
    assert "a0 (this" not in invalid


def test_manager_renders_the_tags_window(tmp_path) -> None:
    cfg = build_config(
        {
            "pipeline": "agentic",
            "experiment": {"max_steps": 1},
            "model": {"path": str(tmp_path)},
            "algorithm": {"adv_estimator": "gigpo"},
            "agentic": {
                "env_manager": "step",
                "train_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["T"]},
                "val_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["T"]},
                "custom_envs": {
                    "T": {
                        "env_type": "frozen_lake",
                        "history_length": 2,
                        "env_config": {"desc": ["SF", "FG"], "is_slippery": False},
                    }
                },
            },
        }
    )
    manager = EnvManager.from_agentic(cfg.agentic, "train", 0)
    manager.reset(0)
    text = manager.step_text(0, R[:2])
    assert manager.observation(0) in text
    assert "(step: 2, observation: o1" in text and "(step: 1," not in text
