"""ROLL's StepConcatEnvManager (``agentic.env_manager: step_concat``) with a scripted
policy on GEM's Guess-the-Number: one sample per env step, each prompt the episode's
observations so far, and step_reinforce's return-to-go scores."""

from __future__ import annotations

import pytest
from doubles import ScriptedEngine

from temper.config import ConfigError
from temper.envs import EnvManager
from temper.pipelines.agentic_steps import StepConcatPlayer, returns_to_go
from temper.pipelines.catalog import build_config
from temper.rollout.base import SamplingParams

TEMPLATE = "Observation:\n{history}\n{current_observation}\nAnswer in \\boxed{{}}."


def config(tiny_dir, **agentic):
    tag = {
        "env_type": "game:GuessTheNumber-v0",
        "max_turns": 3,
        "history_length": 3,
        "turn_template": TEMPLATE,
        "env_config": {"min_number": 1, "max_number": 20, "max_turns": 3},
    }
    return build_config(
        {
            "pipeline": "agentic",
            "experiment": {"max_steps": 1},
            "model": {"path": str(tiny_dir)},
            "rollout": {"response_length": 32, "max_model_len": 1024},
            "data": {"max_prompt_length": 990},
            "algorithm": {"adv_estimator": "reinforce"},
            "agentic": {
                "env_manager": "step_concat",
                "step_score": "return_to_go",
                "step_score_gamma": 0.5,
                "train_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["G"]},
                "val_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["G"]},
                "custom_envs": {"G": tag},
                **agentic,
            },
        }
    )


def test_returns_to_go_by_hand() -> None:
    # G_t = r_t + γ G_{t+1}: [0 + 0.5(0 + 0.5·1), 0 + 0.5·1, 1]
    assert returns_to_go([0.0, 0.0, 1.0], 0.5) == pytest.approx([0.25, 0.5, 1.0])
    assert returns_to_go([-0.1, 2.0], 1.0) == pytest.approx([1.9, 2.0])
    assert returns_to_go([], 0.9) == []


def test_step_concat_sample_layout(tiny_dir, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    cfg = config(tiny_dir)
    manager = EnvManager.from_agentic(cfg.agentic, "train", 0)
    manager.reset(1)
    target = manager.env(0).target  # the seed of step 1 fixes it; play_round resets alike
    low, high = (1, 20) if target not in (1, 20) else (2, 19)
    answers = iter([f"\\boxed{{{low}}}", f"\\boxed{{{high}}}", f"\\boxed{{{target}}}"])
    engine = ScriptedEngine(tok, lambda text: next(answers))
    played = StepConcatPlayer(cfg, engine, tok).play_round(manager, 1, SamplingParams())
    b = played.batch
    assert len(b) == 3 and b["step_index"].tolist() == [0, 1, 2]
    # rewards 0 (hint), 0 (hint), 1 (the target); γ = 0.5 return-to-go as scores
    assert b["step_rewards"].tolist() == [0.0, 0.0, 1.0]
    assert b["scores"].tolist() == pytest.approx([0.25, 0.5, 1.0])
    prompts = [tok.decode(b["prompt_ids"][k][b["prompt_mask"][k].bool()]) for k in range(3)]
    # step 1: the rules and the suffix; step 3: the two earlier observations (window 3)
    # joined by newlines, then the current one and the suffix — no answers, no rewards
    assert "Observation:\n\nYou are playing Guess The Number." in prompts[0]
    assert "Make your next guess.\nAnswer in \\boxed{}." in prompts[0]
    third = prompts[2].split("Observation:\n", 1)[1]
    first_hint = f"Turn 1: you guessed {low}; the secret number is higher than {low}."
    second_hint = f"Turn 2: you guessed {high}; the secret number is lower than {high}."
    assert third.startswith("You are playing Guess The Number.")
    assert f"\n{first_hint}\n{second_hint}\nMake your next guess.\nAnswer in" in third
    assert "boxed{1}" not in third.replace("boxed{}", "")  # the model's answers are not shown
    # each sample trains its answer only
    assert (
        b["response_mask"].sum(-1).tolist()
        == b["attention_mask"][:, b["prompt_ids"].shape[1] :].sum(-1).tolist()
    )
    assert played.episodes["success"] == [True]


def test_return_to_go_needs_a_step_manager(tiny_dir):
    with pytest.raises(ConfigError, match="agentic.step_score"):
        config(tiny_dir, env_manager="trajectory")
