"""The verl-style and ROLL-style example configs, pointed at the tiny model, train for 2
steps unchanged apart from command-line overrides (model, data, lengths, engines)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from temper.cli.registries import registry_names
from temper.config import load_config
from temper.pipelines import run_pipeline

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TASK = "task:arithmetic?n=64&seed=5"


def run(path: Path, overrides: list[str]) -> list[dict]:
    loaded = load_config(path, overrides, names=registry_names())
    run_pipeline(loaded.config)
    out = Path(loaded.config.experiment.output_dir)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_verl_example_trains_two_steps(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    rows = run(
        EXAMPLES / "verl_gsm8k_ppo.yaml",
        [
            f"actor_rollout_ref.model.path={tiny_model_dir}",
            f"critic.model.path={tiny_model_dir}",
            f"data.train_files={TASK}",
            f"data.val_files={TASK}",
            "data.max_prompt_length=96",
            "data.max_response_length=12",
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "critic.ppo_micro_batch_size_per_gpu=2",
            "trainer.total_training_steps=2",
            "trainer.test_freq=2",
            "trainer.save_freq=-1",
            f"trainer.default_local_dir={tmp_path / 'verl'}",
        ],
    )
    assert [r["step"] for r in rows if "train/reward_mean" in r] == [1, 2]
    assert all("critic/value_loss" in r for r in rows if "train/reward_mean" in r)
    assert any("val/reward_mean" in r for r in rows)


@pytest.mark.slow
def test_roll_example_trains_two_steps(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    rows = run(
        EXAMPLES / "roll_rlvr.yaml",
        [
            f"pretrain={tiny_model_dir}",
            f"reward_pretrain={tiny_model_dir}",
            f"actor_train.data_args.file_name=[{TASK}]",
            f"validation.data_args.file_name={TASK}",
            "prompt_length=96",
            "response_length=12",
            "rollout_batch_size=4",
            "actor_train.training_args.per_device_train_batch_size=2",
            "actor_train.training_args.gradient_accumulation_steps=4",
            "actor_infer.strategy_args.strategy_name=hf_infer",
            "~actor_infer.strategy_args.strategy_config",
            "max_steps=2",
            "eval_steps=2",
            f"output_dir={tmp_path / 'roll'}",
        ],
    )
    assert [r["step"] for r in rows if "train/reward_mean" in r] == [1, 2]
    assert all("actor/kl" in r for r in rows if "train/reward_mean" in r)
