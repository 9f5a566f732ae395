"""verl 0.9's new algorithm names end to end: two RLVR steps of a tiny random model with
each new policy loss (``dppo_tv``, ``dppo_kl``, ``dro``) and with the ``gdpo`` estimator
on a reward function that returns named components, and the optimal-token-baseline
estimators (``optimal_token_baseline``, ``tir_optimal_token_baseline``: the actor's
log-prob pass computes Σπ² for them). Each run trains without error, logs finite losses,
and moves every parameter tensor."""

from __future__ import annotations

import math

import pytest
import torch
from test_rlvr_tiny import params, read_metrics, tiny_config  # same folder, on sys.path

from temper.pipelines import run_pipeline as train

COMPONENTS = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Two components: the share of digit characters, and a short answer."""
    digits = sum(c.isdigit() for c in solution_str) / len(solution_str) if solution_str else 0.0
    short = 1.0 if len(solution_str) < 8 else 0.0
    return {"score": digits + 0.5 * short, "digits": digits, "short": short}
'''

CASES = {
    "dppo_tv": {"actor": {"policy_loss": "dppo_tv", "clip_ratio": 0.15, "clip_ratio_c": 10.0}},
    "dppo_kl": {"actor": {"policy_loss": "dppo_kl", "clip_ratio": 0.05, "clip_ratio_c": 10.0}},
    "dro": {"actor": {"policy_loss": "dro", "policy_loss_kwargs": {"dro_beta": 0.1}}},
    "optimal_token_baseline": {"algorithm": {"adv_estimator": "optimal_token_baseline"}},
    "tir_optimal_token_baseline": {
        "algorithm": {"adv_estimator": "tir_optimal_token_baseline"},
        "actor": {"calculate_sum_pi_squared": True},
    },
    "gdpo": {
        "algorithm": {
            "adv_estimator": "gdpo",
            "gdpo_reward_keys": ["digits", "short"],
            "gdpo_reward_weights": [1.0, 0.5],
        }
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_two_steps_train_and_move_every_parameter(name, tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    from transformers import AutoModelForCausalLM

    over = {k: dict(v) for k, v in CASES[name].items()}
    actor = {"mini_batch_size": 8, "micro_batch_size_per_device": 4}
    actor.update({"optim": {"lr": 3e-3, "weight_decay": 0.0}, **over.pop("actor", {})})
    cfg = tiny_config(
        tmp_path,
        tiny_model_dir,
        experiment={"output_dir": str(tmp_path / "run"), "max_steps": 2, "seed": 1},
        actor=actor,
        **over,
    )
    if name == "gdpo":  # a reward function with named components
        (tmp_path / "digits.py").write_text(COMPONENTS)
    before = params(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    train(cfg)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["actor/pg_loss"]) for r in rows), rows
    after = params(AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final" / "actor"))
    unchanged = [n for n in before if torch.equal(before[n], after[n])]
    assert not unchanged, unchanged
    if name == "gdpo":  # the components were scored, and GDPO whitens over the batch
        assert "reward_extra/short" in rows[0] and "reward_extra/digits" in rows[0]
        assert all(abs(r["train/advantage_mean"]) < 1e-5 for r in rows), rows
