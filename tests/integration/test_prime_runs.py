"""PRIME (pipeline prime, verl's PRIME recipe) on a tiny random model: with the recipe's
estimator settings (reward_dpo_coef = reward_gt_coef = 5, token granularity, batch norm,
the PRM updated before it scores, groups of mean accuracy in [0.2, 0.8] preferred among
twice the prompts) the binary toy reward rises, the implicit PRM learns to rank the
responses, and every parameter of the policy and of the PRM moves; and verl's
``run_prime_qwen.sh`` passes ``temper check`` and trains 2 steps with only model, data,
length, device and output overrides."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from test_rlvr_tiny import params, read_metrics  # same folder, on sys.path

from temper.cli.main import main
from temper.pipelines import run_pipeline as train
from temper.pipelines.catalog import build_config

pytestmark = pytest.mark.slow

UPSTREAM = Path(__file__).resolve().parents[1] / "data" / "upstream"
SCRIPT = UPSTREAM / "verl-2025-06-38d9a88" / "recipe" / "prime" / "run_prime_qwen.sh"
#: A binary outcome (PRIME's PRM learns P(correct)): two digits or more in the response.
DIGITS = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """1 when the response has at least two digit characters, else 0."""
    return float(sum(c.isdigit() for c in (solution_str or "")) >= 2)
'''


def _prime(tmp_path: Path, model_dir: Path, steps: int):
    reward_file = tmp_path / "digits.py"
    reward_file.write_text(DIGITS)
    return build_config(
        {
            "pipeline": "prime",
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
            "actor": {
                "mini_batch_size": 8,
                "micro_batch_size_per_device": 4,
                "optim": {"lr": 3e-3, "weight_decay": 0.0},
            },
            "prime": {
                "oversample_factor": 2,
                "filter_accuracy": True,
                "accuracy_lower_bound": 0.2,
                "accuracy_upper_bound": 0.8,
                "prm": {"micro_batch_size_per_device": 4, "optim": {"lr": 1e-3}},
            },
            "reward": {
                "function": "custom",
                "custom_function": {"path": str(reward_file)},
                "num_workers": 1,
            },
        }
    )


def test_prime_raises_reward_trains_the_prm_and_moves_every_parameter(
    tmp_path, tiny_model_dir, monkeypatch
):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from transformers import AutoModelForCausalLM

    before = params(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    summary = train(_prime(tmp_path, tiny_model_dir, steps=12))
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, 13))
    for key in ("reward_model/dpo_loss", "reward_model/grad_norm", "reward_model/dpo_acc"):
        assert all(key in r for r in rows), key
    # 4 of the 8 drawn groups are kept (16 samples), passing ones first
    assert all(r["perf/samples"] == 16.0 for r in rows)
    # seeds 1-3 on CPU: mean of steps 1-3 → 10-12 of 0.07 → 0.71, 0.07 → 0.53, 0.10 → 0.53
    rewards = summary["curve_values"]
    assert summary["curve"] == "train/score_mean"
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.2, rewards
    # the PRM ranks a group's responses as their outcomes do, better than chance
    ranked = [r["reward_model/dpo_acc"] for r in rows[-6:]]
    assert sum(ranked) / len(ranked) > 0.6, ranked
    run = tmp_path / "run"
    actor = params(AutoModelForCausalLM.from_pretrained(run / "final" / "actor"))
    prm_dir = run / "checkpoints" / "global_step_12" / "reward_model"
    prm = params(AutoModelForCausalLM.from_pretrained(prm_dir))  # a causal LM, as verl's
    for name, after in (("actor", actor), ("prm", prm)):
        unchanged = [n for n in before if torch.equal(before[n], after[n])]
        assert not unchanged, (name, unchanged)


def _overrides(model_dir: Path, out: Path) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={model_dir}",  # model
        f"reward_model.model.path={model_dir}",  # the PRM (and its reference: ref_path)
        "data.train_files=task:arithmetic?n=512&seed=5",  # data
        "data.val_files=task:arithmetic?n=4&seed=6&split=test",
        "data.max_prompt_length=96",  # length
        "data.max_response_length=8",
        "trainer.total_training_steps=2",
        "trainer.n_gpus_per_node=1",  # device
        "actor_rollout_ref.rollout.name=hf",
        "trainer.logger=[console]",
        f"trainer.default_local_dir={out}",  # outputs
    ]


def test_verl_run_prime_script_checks_and_trains(tmp_path, tiny_model_dir, monkeypatch, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "config"))
    from upstream_scripts import script_commands

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    (cmd,) = script_commands(SCRIPT, SCRIPT.parents[2])
    out = tmp_path / "run"
    overrides = [*cmd.overrides, *_overrides(tiny_model_dir, out)]
    assert main(["check", str(cmd.config), *overrides]) == 0
    said = capsys.readouterr().out
    assert "prm" in said  # the placement table lists the PRM beside the actor
    assert main(["train", str(cmd.config), *overrides]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "reward_model/dpo_loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    # the file's 64 prompts × oversample 4 drawn, 64 groups of 4 kept; the PRM's
    # mini-batch is 64 samples (4 optimizer steps), its lr the file's 1e-6
    assert all(r["perf/samples"] == 256.0 for r in steps)
    assert all(r["reward_model/lr"] == pytest.approx(1e-6) for r in steps)
    ckpt = out / "checkpoints" / "global_step_2"
    assert (ckpt / "reward_model").is_dir() and (ckpt / "reward_model_train").is_dir()
