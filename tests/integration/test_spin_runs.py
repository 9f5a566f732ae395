"""Online DPO (pipeline spin, verl's SPIN recipe) on a tiny random model: pairs of its
own responses ranked by the learnable toy reward (fraction of digit characters) raise the
implicit-reward margin and the reward, every parameter moves, each refresh makes the
reference the policy (the step's loss is log 2 again); and verl's ``run_spin.sh`` passes
``temper check`` and trains 2 steps with only model, data, length, device and output
overrides."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from test_rlvr_tiny import REWARD, params, read_metrics  # same folder, on sys.path

from temper.cli.main import main
from temper.pipelines import run_pipeline as train
from temper.pipelines.catalog import build_config

pytestmark = pytest.mark.slow

UPSTREAM = Path(__file__).resolve().parents[1] / "data" / "upstream"
SCRIPT = UPSTREAM / "verl-2025-06-38d9a88" / "recipe" / "spin" / "run_spin.sh"


def _spin(tmp_path: Path, model_dir: Path, freq: int, steps: int):
    reward_file = tmp_path / "digits.py"
    reward_file.write_text(REWARD)
    return build_config(
        {
            "pipeline": "spin",
            "experiment": {
                "output_dir": str(tmp_path / "run"),
                "max_steps": steps,
                "seed": 1,
                "trackers": ["jsonl"],
            },
            "model": {"path": str(model_dir)},
            "data": {
                "train_files": ["task:arithmetic?n=64&seed=3"],
                "train_batch_size": 4,
                "max_prompt_length": 96,
            },
            "rollout": {"n": 4, "response_length": 12, "temperature": 1.0},
            "actor": {"micro_batch_size_per_device": 4, "optim": {"lr": 3e-3}},
            "spin": {"beta": 0.5, "ref_update_freq": freq},
            "reward": {
                "function": "custom",
                "custom_function": {"path": str(reward_file)},
                "num_workers": 1,
            },
        }
    )


def test_online_dpo_raises_margin_and_reward_and_moves_every_parameter(
    tmp_path, tiny_model_dir, monkeypatch
):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from transformers import AutoModelForCausalLM

    before = params(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    summary = train(_spin(tmp_path, tiny_model_dir, freq=0, steps=12))
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert all(r["train/pairs"] == 8.0 and r["spin/ref_refreshed"] == 0.0 for r in rows)
    # step 1: the policy is the reference, every implicit reward 0, the loss log 2
    assert rows[0]["train/loss"] == pytest.approx(math.log(2), abs=1e-5)
    # each step's pairs are new samples, so the margin (before the step's update) is how
    # the learnt preference carries to them; seeds 1-3 on CPU: last 4 steps beat the first
    # 4 by 0.19, 0.18, 0.11 (margin) and 0.055, 0.014, 0.0 (reward) — seed 1 is checked
    margins = [r["train/rewards/margin"] for r in rows]
    assert sum(margins[-4:]) / 4 > sum(margins[:4]) / 4 + 0.1, margins
    rewards = summary["curve_values"]
    assert summary["curve"] == "train/score_mean"
    assert sum(rewards[-4:]) / 4 > sum(rewards[:4]) / 4 + 0.02, rewards
    after = params(AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final" / "actor"))
    unchanged = [n for n in before if torch.equal(before[n], after[n])]
    assert not unchanged, unchanged


def test_each_refresh_makes_the_reference_the_policy(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    train(_spin(tmp_path, tiny_model_dir, freq=2, steps=5))
    rows = read_metrics(tmp_path / "run")
    assert [r["spin/ref_refreshed"] for r in rows] == [0.0, 1.0, 0.0, 1.0, 0.0]
    for r in rows:  # a step that starts with a refresh scores against the policy itself
        if r["step"] in (1, 2, 4):
            assert r["train/rewards/margin"] == pytest.approx(0.0, abs=1e-6), r
            assert r["train/loss"] == pytest.approx(math.log(2), abs=1e-5), r
        else:  # one update past the reference
            assert r["train/rewards/margin"] != pytest.approx(0.0, abs=1e-6), r


def _overrides(model_dir: Path, out: Path) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={model_dir}",  # model
        "data.train_files=task:arithmetic?n=64&seed=5",  # data
        "data.val_files=task:arithmetic?n=4&seed=6&split=test",
        "data.train_batch_size=8",  # the file: 1024 prompts
        "data.max_prompt_length=96",  # length
        "data.max_response_length=8",
        "trainer.total_training_steps=2",
        "trainer.n_gpus_per_node=1",  # device
        "actor_rollout_ref.rollout.name=hf",
        f"trainer.default_local_dir={out}",  # outputs
    ]


def test_verl_run_spin_script_checks_and_trains(tmp_path, tiny_model_dir, monkeypatch, capsys):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "config"))
    from upstream_scripts import script_commands

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    (cmd,) = script_commands(SCRIPT, SCRIPT.parents[2])
    out = tmp_path / "run"
    overrides = [*cmd.overrides, *_overrides(tiny_model_dir, out)]
    assert main(["check", str(cmd.config), *overrides]) == 0
    said = capsys.readouterr().out
    assert "pairs compare responses to two different prompts" in said  # rollout.n 1
    assert main(["train", str(cmd.config), *overrides]) == 0
    rows = read_metrics(out)
    steps = [r for r in rows if "train/loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # ref_update_freq=1: every step starts from a reference equal to the policy, and
    # the file's 8 prompts × 1 response make 4 pairs, one optimizer step (verl's actor)
    assert all(r["spin/ref_refreshed"] == 1.0 and r["train/pairs"] == 4.0 for r in steps)
    assert all(r["train/loss"] == pytest.approx(math.log(2), abs=1e-5) for r in steps)
    assert all(math.isfinite(r["actor/grad_norm"]) for r in steps)  # lr: warmup of 15 steps
    assert any(r.get("val/reward_mean") is not None for r in rows)  # test_freq=1
