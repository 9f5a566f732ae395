"""End-to-end agentic runs on the tiny random model (CPU): FrozenLake 4×4 trains 3 steps
with validation and rendering; the tool loop runs inside training (Countdown + calculator);
the ROLL-dialect agentic example trains 2 steps with CPU-scale overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from temper.cli.registries import registry_names
from temper.config import build_config, load_config
from temper.pipelines import run_pipeline

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def agentic_config(tmp_path, model_dir, tag_cfg, **over):
    cfg = {
        "pipeline": "agentic",
        "experiment": {
            "output_dir": str(tmp_path / "run"),
            "max_steps": 3,
            "seed": 3,
            "test_freq": 3,
            "trackers": ["jsonl"],
            "render_save_dir": str(tmp_path / "render"),
        },
        "model": {"path": str(model_dir)},
        "data": {"max_prompt_length": 400},
        "rollout": {"response_length": 12, "max_model_len": 1000},
        "actor": {
            "mini_batch_size": 4,
            "micro_batch_size_per_device": 2,
            "optim": {"lr": 1e-3, "weight_decay": 0.0},
        },
        "algorithm": {"adv_estimator": "grpo"},
        "agentic": {
            "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["T"]},
            "val_env_manager": {"num_env_groups": 2, "group_size": 1, "tags": ["T"]},
            "custom_envs": {"T": tag_cfg},
            "reward_normalization": {"grouping": "state", "method": "mean_std"},
        },
    }
    for section, values in over.items():
        cfg.setdefault(section, {}).update(values)
    return build_config(cfg)


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


LAKE = {
    "env_type": "frozen_lake",
    "max_turns": 3,
    "max_tokens_per_turn": 12,
    "env_config": {"size": 4, "is_slippery": False},
}


@pytest.mark.slow
def test_frozen_lake_trains_three_steps(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    before = {
        n: p.detach().clone()
        for n, p in AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters()
    }
    # a random model answers nothing valid: every episode returns 3 × format penalty, so
    # group baselines (GRPO, mean_std) cancel it; plain REINFORCE still gets a gradient
    cfg = agentic_config(
        tmp_path,
        tiny_model_dir,
        LAKE,
        algorithm={"adv_estimator": "reinforce"},
        agentic={"reward_normalization": {"grouping": "batch", "method": "identity"}},
    )
    summary = run_pipeline(cfg)
    metrics = rows(tmp_path / "run")
    train = [r for r in metrics if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    for key in (
        "train/success_rate",
        "env/T/success_rate",
        "env/num_turns_mean",
        "env/invalid_action_rate",
        "actor/pg_loss",
        "actor/grad_norm",
        "rollout/tokenization_mismatch_frac",
        "timing/rollout_s",
    ):
        assert key in train[0], key
    assert all(r["rollout/tokenization_mismatch_frac"] == 0.0 for r in train)
    assert all(1 <= r["env/num_turns_mean"] <= 3 for r in train)
    assert "val/success_rate" in train[-1] and "val/env/T/success_rate" in train[-1]
    assert summary["steps"] == 3 and len(summary["val"]) == 1
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final" / "actor")
    moved = [n for n, p in after.named_parameters() if not torch.equal(p, before[n])]
    assert moved, "no parameter changed"
    rendered = list((tmp_path / "render").rglob("*"))
    assert any(p.suffix == ".png" for p in rendered)
    assert any(p.name.endswith("_dialog.txt") for p in rendered)


@pytest.mark.slow
def test_tool_env_runs_the_tool_loop_in_training(tmp_path, tiny_model_dir):
    countdown = {
        "env_type": "countdown_tool",
        "max_turns": 2,
        "max_tokens_per_turn": 12,
        "env_config": {"num_numbers": 3, "max_number": 9, "max_target": 30},
    }
    cfg = agentic_config(
        tmp_path,
        tiny_model_dir,
        countdown,
        experiment={"max_steps": 2, "test_freq": -1, "render_save_dir": None},
        rollout={
            "response_length": 12,
            "max_model_len": 1400,
            "multi_turn": {"enable": True, "max_user_turns": 3},
        },
        data={"max_prompt_length": 900},
    )
    run_pipeline(cfg)
    train = [r for r in rows(tmp_path / "run") if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert "tools/calls" in train[0] and "tools/error_frac" in train[0]


@pytest.mark.slow
def test_roll_agentic_example_trains_two_steps(tmp_path, tiny_model_dir):
    overrides = [
        f"pretrain={tiny_model_dir}",
        f"output_dir={tmp_path / 'roll'}",
        f"render_save_dir={tmp_path / 'render'}",
        "max_steps=2",
        "eval_steps=2",
        "rollout_batch_size=4",
        "val_batch_size=4",
        "sequence_length=1024",
        "prompt_length=512",
        "max_actions_per_traj=2",
        "train_env_manager.env_groups=2",
        "train_env_manager.group_size=2",
        "train_env_manager.n_groups=[2]",
        "val_env_manager.env_groups=4",
        "val_env_manager.n_groups=[2,2]",
        "actor_infer.generating_args.max_new_tokens=10",
        "actor_infer.strategy_args.strategy_name=hf_infer",
        "~actor_infer.strategy_args.strategy_config",
        "actor_train.training_args.per_device_train_batch_size=2",
        "actor_train.training_args.gradient_accumulation_steps=2",
        "actor_train.model_args.dtype=fp32",
        "actor_infer.model_args.dtype=fp32",
        "reference.model_args.dtype=fp32",
    ]
    loaded = load_config(EXAMPLES / "roll_agentic_sokoban.yaml", overrides, names=registry_names())
    assert loaded.config.pipeline == "agentic"
    run_pipeline(loaded.config)
    train = [r for r in rows(tmp_path / "roll") if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert any("val/env/FrozenLake/success_rate" in r for r in rows(tmp_path / "roll"))
