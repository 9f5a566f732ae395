"""Dynamic sampling and loss masks in real tiny-model runs: DAPO's refill fills the batch
on a task where some prompt groups have no signal; a task where no group has any still
trains (masked) instead of failing on an empty batch (issue 12's "cannot cut 0 samples")."""

from __future__ import annotations

import json

import pytest

from temper.pipelines import run_pipeline
from temper.pipelines.catalog import build_config

pytestmark = pytest.mark.slow

# even answers: every response scores 0 (a group without signal); odd answers: the
# fraction of digits in the response (differs between responses)
HALF_SIGNAL = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if int(ground_truth) % 2 == 0 or not solution_str:
        return 0.0
    return sum(c.isdigit() for c in solution_str) / len(solution_str)
"""
NO_SIGNAL = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 0.0
"""


def config(tmp_path, model_dir, reward: str, steps: int, **over):
    path = tmp_path / "reward.py"
    path.write_text(reward)
    cfg = {
        "experiment": {
            "output_dir": str(tmp_path / "run"),
            "max_steps": steps,
            "seed": 5,
            "trackers": ["jsonl"],
        },
        "model": {"path": str(model_dir)},
        "data": {
            "train_files": ["task:arithmetic?n=64&seed=2"],
            "train_batch_size": 4,
            "max_prompt_length": 96,
        },
        "rollout": {"n": 4, "response_length": 8, "temperature": 1.0},
        "actor": {"mini_batch_size": 8, "micro_batch_size_per_device": 8},
        "algorithm": {"adv_estimator": "grpo"},
        "reward": {"function": "custom", "custom_function": {"path": str(path)}, "num_workers": 1},
    }
    for section, values in over.items():
        cfg.setdefault(section, {}).update(values)
    return build_config(cfg)


def rows(tmp_path) -> list[dict]:
    text = (tmp_path / "run" / "metrics.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_refill_fills_the_batch_with_groups_that_have_signal(tmp_path, tiny_model_dir):
    """DAPO: rounds of 6 prompts (data.gen_batch_size, as ROLL's additional prompts) until
    4 groups with signal; every step trains on the full 16 samples."""
    fg = {"enable": True, "max_num_gen_batches": 0}
    cfg = config(
        tmp_path,
        tiny_model_dir,
        HALF_SIGNAL,
        steps=3,
        data={"gen_batch_size": 6},
        algorithm={"filter_groups": fg},
    )
    run_pipeline(cfg)
    steps = rows(tmp_path)
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:
        assert r["dynamic_sampling/batch_full"] == 1.0 and r["perf/samples"] == 16
        assert r["dynamic_sampling/groups_kept"] >= 4 and r["train/loss_masked_frac"] == 0.0
    assert sum(r["dynamic_sampling/groups_dropped"] for r in steps) > 0  # even answers
    assert max(r["dynamic_sampling/rounds"] for r in steps) >= 2  # a refill happened


def test_no_group_with_signal_trains_masked_instead_of_failing(tmp_path, tiny_model_dir):
    """Every group scores 0: filter_groups stops at max_num_gen_batches and fills the batch
    with masked groups; difficulty_mask masks them too. The step runs, nothing is learned
    from zero advantages, and the metrics say so."""
    fg = {"enable": True, "max_num_gen_batches": 2}
    cfg = config(
        tmp_path,
        tiny_model_dir,
        NO_SIGNAL,
        steps=1,
        algorithm={"filter_groups": fg, "difficulty_mask": True},
    )
    summary = run_pipeline(cfg)
    (r,) = rows(tmp_path)
    assert summary["steps"] == 1 and r["perf/samples"] == 16
    assert r["dynamic_sampling/rounds"] == 2 and r["dynamic_sampling/groups_masked"] == 4
    assert r["train/loss_masked_frac"] == 1.0 and r["train/difficulty_masked_frac"] == 1.0
    assert r["actor/pg_loss"] == 0.0
