"""The shaping phase composes the algorithm library as the config says."""

from __future__ import annotations

import torch

from temper.config.schema import AlgorithmConfig, RolloutConfig
from temper.data.batch import Batch
from temper.pipelines.experience import ShapingState, compute_experience


def batch(scores, uids, lengths, R=4, **tensors):
    mask = (torch.arange(R)[None] < torch.tensor(lengths)[:, None]).float()
    return Batch.from_dict(
        {"scores": torch.tensor(scores), "response_mask": mask, **tensors},
        {"uid": uids, "truncated": [n == R for n in lengths]},
    )


def test_grpo_scores_on_last_token_and_group_advantages():
    b = batch([1.0, 0.0, 0.5, 0.5], ["a", "a", "b", "b"], [2, 3, 1, 4])
    algo = AlgorithmConfig(adv_estimator="grpo")
    out, m = compute_experience(b, algo, RolloutConfig(), ShapingState.from_config(algo))
    # score sits on the last valid token of each row
    assert out["token_level_scores"][0].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert out["token_level_scores"][1].tolist() == [0.0, 0.0, 0.0, 0.0]
    # group a: mean 0.5, std (unbiased) = sqrt(0.5) -> ±0.7071; group b: all equal -> 0
    a = out["advantages"]
    assert torch.allclose(a[0, :2], torch.full((2,), 0.5 / 0.5**0.5), atol=1e-4)
    assert torch.allclose(a[1, :3], torch.full((3,), -0.5 / 0.5**0.5), atol=1e-4)
    assert a[2].abs().sum() == 0 and a[3].abs().sum() == 0
    assert a[0, 2:].abs().sum() == 0  # masked tokens carry nothing
    assert m["train/score_mean"] == 0.5


def test_kl_in_reward_subtracts_beta_kl_and_updates_controller():
    old = torch.zeros(2, 4)
    ref = torch.full((2, 4), -0.5)
    b = batch([1.0, 0.0], ["a", "a"], [4, 4], old_log_probs=old, ref_log_probs=ref)
    algo = AlgorithmConfig(adv_estimator="grpo", use_kl_in_reward=True, kl_penalty="kl")
    algo.kl_ctrl.kl_coef = 0.1
    out, m = compute_experience(b, algo, RolloutConfig(), ShapingState.from_config(algo))
    # k1 = old - ref = 0.5 per token; reward_t = score_t - 0.1 × 0.5
    expected = torch.tensor([[-0.05, -0.05, -0.05, 0.95], [-0.05, -0.05, -0.05, -0.05]])
    assert torch.allclose(out["token_level_rewards"], expected)
    assert abs(m["train/kl_in_reward"] - 0.5) < 1e-6


def test_filter_groups_drops_groups_without_signal():
    b = batch([1.0, 1.0, 0.0, 1.0], ["a", "a", "b", "b"], [2, 2, 2, 2])
    algo = AlgorithmConfig(adv_estimator="grpo")
    algo.filter_groups.enable = True
    out, m = compute_experience(b, algo, RolloutConfig(), ShapingState.from_config(algo))
    assert out["uid"] == ["b", "b"] and m["train/kept_samples_frac"] == 0.5


def test_max_len_mask_removes_truncated_from_the_loss():
    b = batch([1.0, 0.0], ["a", "a"], [4, 2])
    algo = AlgorithmConfig(adv_estimator="grpo", max_len_mask=True)
    out, _ = compute_experience(b, algo, RolloutConfig(), ShapingState.from_config(algo))
    assert out["response_mask"][0].sum() == 0 and out["response_mask"][1].sum() == 2


def test_remax_uses_the_greedy_baseline():
    b = batch([1.0, 0.0], ["a", "a"], [2, 2], baseline_scores=torch.tensor([0.25, 0.25]))
    algo = AlgorithmConfig(adv_estimator="remax")
    out, _ = compute_experience(b, algo, RolloutConfig(), ShapingState.from_config(algo))
    # reward-to-go minus the greedy reward on every valid token
    assert torch.allclose(out["advantages"][:, :2], torch.tensor([[0.75, 0.75], [-0.25, -0.25]]))


def test_reward_clip_and_shaping_state_roundtrip():
    b = batch([5.0, -5.0], ["a", "a"], [1, 1])
    algo = AlgorithmConfig(adv_estimator="grpo", reward_clip=2.0, reward_norm="running")
    state = ShapingState.from_config(algo)
    out, m = compute_experience(b, algo, RolloutConfig(), state)
    assert m["train/reward_clip_frac"] >= 0.0
    assert out["token_level_scores"].abs().max() <= 2.0
    copy = ShapingState.from_config(algo)
    copy.load_state_dict(state.state_dict())
    assert copy.state_dict() == state.state_dict()
