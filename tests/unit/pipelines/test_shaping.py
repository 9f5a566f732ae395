"""The shaping phase composes the algorithm library as the config says, for RLVR samples
and agentic episodes alike (one path: ``temper.pipelines.shaping``)."""

from __future__ import annotations

import pytest
import torch

from temper.algorithms import AdvantageInputs, compute_advantages
from temper.config.schema import (
    ActorConfig,
    AgenticConfig,
    AlgorithmConfig,
    DistillConfig,
    RewardNormalizationConfig,
    TeacherConfig,
)
from temper.data.batch import Batch
from temper.pipelines.shaping import (
    ShapingSettings,
    ShapingState,
    compute_experience,
    place_turn_rewards,
)


def batch(scores, uids, lengths, R=4, **tensors):
    mask = (torch.arange(R)[None] < torch.tensor(lengths)[:, None]).float()
    return Batch.from_dict(
        {"scores": torch.tensor(scores), "response_mask": mask, **tensors},
        {"uid": uids, "truncated": [n == R for n in lengths]},
    )


def shape(b: Batch, algo: AlgorithmConfig, agentic: AgenticConfig | None = None, step: int = 0):
    settings = ShapingSettings(algo, response_length=4, agentic=agentic)
    return compute_experience(b, settings, ShapingState.from_config(algo), step)


def test_grpo_scores_on_last_token_and_group_advantages():
    b = batch([1.0, 0.0, 0.5, 0.5], ["a", "a", "b", "b"], [2, 3, 1, 4])
    out, m = shape(b, AlgorithmConfig(adv_estimator="grpo"))
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
    out, m = shape(b, algo)
    # k1 = old - ref = 0.5 per token; reward_t = score_t - 0.1 × 0.5
    expected = torch.tensor([[-0.05, -0.05, -0.05, 0.95], [-0.05, -0.05, -0.05, -0.05]])
    assert torch.allclose(out["token_level_rewards"], expected)
    assert abs(m["train/kl_in_reward"] - 0.5) < 1e-6


def test_full_kl_in_reward_uses_the_actors_exact_kl():
    full = torch.full((2, 4), 0.25)
    b = batch([1.0, 0.0], ["a", "a"], [4, 4], old_log_probs=torch.zeros(2, 4))
    b["ref_log_probs"], b["full_kl"] = torch.zeros(2, 4), full
    algo = AlgorithmConfig(adv_estimator="grpo", use_kl_in_reward=True, kl_penalty="full")
    algo.kl_ctrl.kl_coef = 0.1
    out, m = shape(b, algo)
    assert torch.allclose(out["token_level_rewards"][1], torch.full((4,), -0.025))
    assert m["train/kl_in_reward"] == pytest.approx(0.25)


def test_max_len_mask_removes_truncated_from_the_loss():
    b = batch([1.0, 0.0], ["a", "a"], [4, 2])
    out, m = shape(b, AlgorithmConfig(adv_estimator="grpo", max_len_mask=True))
    assert out["response_mask"][0].sum() == 0 and out["response_mask"][1].sum() == 2
    assert m["train/loss_masked_frac"] == 0.5


def test_difficulty_mask_masks_the_loss_and_never_empties_the_batch():
    """ROLL's difficulty_mask zeroes the loss of groups outside (low, high); every group
    masked leaves a full batch with no token in the loss (once: 'cannot cut 0 samples')."""
    b = batch([1.0, 1.0, 0.0, 0.0, 1.0, 0.0], ["a", "a", "b", "b", "c", "c"], [2] * 6)
    algo = AlgorithmConfig(adv_estimator="grpo", difficulty_mask=True)
    algo.difficulty_low_threshold, algo.difficulty_high_threshold = 0.1, 0.95
    out, m = shape(b, algo)
    assert len(out) == 6 and out["response_mask"].sum(-1).tolist() == [0, 0, 0, 0, 2, 2]
    assert m["train/difficulty_masked_frac"] == pytest.approx(4 / 6)
    every = batch([1.0, 1.0, 0.0, 0.0], ["a", "a", "b", "b"], [2] * 4)
    out, m = shape(every, algo)
    assert len(out) == 4 and out["response_mask"].sum() == 0
    assert m["train/loss_masked_frac"] == 1.0


def test_difficulty_mask_leaves_groups_of_one_alone():
    b = batch([1.0, 0.0], ["a", "b"], [2, 2])
    out, _ = shape(b, AlgorithmConfig(adv_estimator="grpo", difficulty_mask=True))
    assert out["response_mask"].sum() == 4


def test_sample_mask_of_dynamic_sampling_filler_is_a_loss_mask():
    b = batch([1.0, 0.0, 1.0, 1.0], ["a", "a", "b", "b"], [2] * 4)
    b["sample_mask"] = torch.tensor([1.0, 1.0, 0.0, 0.0])
    out, m = shape(b, AlgorithmConfig(adv_estimator="grpo"))
    assert out["response_mask"].sum(-1).tolist() == [2, 2, 0, 0]
    assert m["train/loss_masked_frac"] == 0.5


def test_loss_weights_by_length_and_difficulty():
    b = batch([1.0, 0.0, 1.0, 1.0], ["a", "a", "b", "b"], [1, 3, 2, 2])
    out, _ = shape(b, AlgorithmConfig(adv_estimator="grpo", length_loss_weight=True))
    w = out["sample_weights"]
    assert w.mean().item() == pytest.approx(1.0) and w[0] > w[2] > w[1]  # shorter: heavier
    out, _ = shape(b, AlgorithmConfig(adv_estimator="grpo", difficulty_loss_weight=True))
    w = out["sample_weights"]  # group a failed half the time, b never: a is heavier
    assert w[0] == w[1] > w[2] == w[3] and w.mean().item() == pytest.approx(1.0)


def test_pf_ppo_resamples_by_score_and_repeats_per_step():
    b = batch([1.0, 0.0, 0.0, 0.0], ["a", "a", "b", "b"], [2] * 4)
    algo = AlgorithmConfig(adv_estimator="grpo", use_pf_ppo=True)
    out, m = shape(b, algo, step=3)
    # pow weights |s|^2: only the score-1 sample has weight (the others 1e-8)
    assert out["scores"].tolist() == [1.0] * 4 and m["train/pf_ppo_unique_frac"] == 0.25
    again, _ = shape(batch([1.0, 0.5, 0.0, 0.2], ["a", "a", "b", "b"], [2] * 4), algo, step=3)
    same, _ = shape(batch([1.0, 0.5, 0.0, 0.2], ["a", "a", "b", "b"], [2] * 4), algo, step=3)
    assert again["scores"].tolist() == same["scores"].tolist()


def test_reward_scaling_divides_by_the_running_std():
    b = batch([4.0, 0.0], ["a", "a"], [1, 1])
    algo = AlgorithmConfig(adv_estimator="reinforce", use_reward_scaling=True)
    out, _ = shape(b, algo)
    std = torch.tensor([4.0, 0.0]).std().item()
    assert out["token_level_scores"][0, 0].item() == pytest.approx(4.0 / (std + 1e-6))
    algo.use_reward_norm = True  # and subtract the running mean
    out, _ = shape(batch([4.0, 0.0], ["a", "a"], [1, 1]), algo)
    assert out["token_level_scores"][:, 0].sum().item() == pytest.approx(0.0, abs=1e-5)


def test_remax_uses_the_greedy_baseline():
    b = batch([1.0, 0.0], ["a", "a"], [2, 2], baseline_scores=torch.tensor([0.25, 0.25]))
    out, _ = shape(b, AlgorithmConfig(adv_estimator="remax"))
    # reward-to-go minus the greedy reward on every valid token
    assert torch.allclose(out["advantages"][:, :2], torch.tensor([[0.75, 0.75], [-0.25, -0.25]]))


def test_gdpo_reads_the_reward_components_and_their_weights():
    comps = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 0.0]])
    # the scores (what other estimators read) must not matter: GDPO reads the components
    b = batch([9.0, -9.0, 3.0, 3.0], ["a", "a", "b", "b"], [1, 1, 1, 1], reward_components=comps)
    algo = AlgorithmConfig(
        adv_estimator="gdpo", gdpo_reward_keys=["acc", "fmt"], gdpo_reward_weights=[1.0, 2.0]
    )
    out, _ = shape(b, algo)
    # a: acc [1, 0] -> ±k, fmt [0, 0] -> 0: s = [k, -k]; b: acc equal -> 0, fmt [1, 0] -> ±k,
    # weight 2: s = [2k, -2k]; whitened (mean 0, unbiased var 10k²/3) -> [1, -1, 2, -2]·√(3/10)
    a = out["advantages"][:, 0]
    torch.testing.assert_close(a, torch.tensor([1.0, -1.0, 2.0, -2.0]) * (3 / 10) ** 0.5)


def test_optimal_token_baseline_reads_the_actors_sum_pi_squared_and_rollout_is():
    """The OTB estimators get the batch's Σπ² and old log-probs; with ``actor.rollout_is``
    on they also get the update's rollout IS weights ρ̄ (verl computes them before the
    advantages), which change the path weights; off, none."""
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 4, generator=g)
    spq = 0.2 + 0.5 * torch.rand(4, 4, generator=g)
    rollout = old + 0.3 * torch.randn(4, 4, generator=g)
    b = batch([1.0, 0.0, 0.3, 1.0], ["a", "a", "a", "b"], [2, 4, 3, 4], old_log_probs=old)
    b["sum_pi_squared"], b["rollout_log_probs"] = spq, rollout
    algo = AlgorithmConfig(adv_estimator="optimal_token_baseline")
    state = ShapingState.from_config(algo)
    plain, _ = compute_experience(b, ShapingSettings(algo, response_length=4), state, 0)
    plain_adv = plain["advantages"].clone()  # the phase fills in the batch it is given
    actor = ActorConfig(rollout_is="token", rollout_is_threshold=1.2)
    settings = ShapingSettings(algo, response_length=4, actor=actor)
    corrected, _ = compute_experience(b, settings, state, 0)
    mask, rewards = plain["response_mask"], plain["token_level_rewards"]
    inputs = dict(response_mask=mask, group_index=["a", "a", "a", "b"], old_log_probs=old)
    want, _ = compute_advantages(
        "optimal_token_baseline",
        AdvantageInputs(token_level_rewards=rewards, sum_pi_squared=spq, **inputs),
    )
    torch.testing.assert_close(plain_adv, want)
    rho = torch.clamp((old - rollout).exp(), max=1.2) * mask
    want_is, _ = compute_advantages(
        "optimal_token_baseline",
        AdvantageInputs(
            token_level_rewards=rewards, sum_pi_squared=spq, rollout_is_weights=rho, **inputs
        ),
    )
    torch.testing.assert_close(corrected["advantages"], want_is)
    assert not torch.allclose(want_is, want)


def test_reward_clip_and_shaping_state_roundtrip():
    b = batch([5.0, -5.0], ["a", "a"], [1, 1])
    algo = AlgorithmConfig(adv_estimator="grpo", reward_clip=2.0, reward_norm="running")
    state = ShapingState.from_config(algo)
    out, m = compute_experience(b, ShapingSettings(algo, response_length=4), state)
    assert m["train/reward_clip_frac"] >= 0.0
    assert out["token_level_scores"].abs().max() <= 2.0
    copy = ShapingState.from_config(algo)
    copy.load_state_dict(state.state_dict())
    assert copy.state_dict() == state.state_dict()


# ------------------------------------------- agentic episodes (the `episodes` fixture: conftest)


def agentic(grouping="batch", method="identity", turns=False):
    return AgenticConfig(
        reward_normalization=RewardNormalizationConfig(grouping=grouping, method=method),
        use_turn_rewards=turns,
    )


def test_episode_return_on_the_last_model_token(episodes):
    out, m = shape(episodes, AlgorithmConfig(adv_estimator="reinforce"), agentic())
    scores = out["token_level_scores"]
    assert scores[0, 6] == 1.0 and scores[0].abs().sum() == 1.0
    assert scores.abs().sum() == 1.0  # the two 0-return episodes add nothing
    assert m["train/score_mean"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("grouping", "method", "expected"),
    [
        ("state", "mean", [0.5, -0.5, 0.0]),  # g0: returns 1, 0; g1 alone
        ("state", "mean_std", [0.7071, -0.7071, 0.0]),  # singleton → 0 (ROLL)
        ("batch", "mean", [2 / 3, -1 / 3, -1 / 3]),
        ("tag", "identity", [1.0, 0.0, 0.0]),
        ("inductive", "mean", [0.5, -0.5, 0.0]),  # same first prompt ⇔ same group here
    ],
)
def test_grouping_times_method(episodes, grouping, method, expected):
    out, _ = shape(episodes, AlgorithmConfig(adv_estimator="reinforce"), agentic(grouping, method))
    got = [out["token_level_scores"][k].sum().item() for k in range(3)]
    assert got == pytest.approx(expected, abs=1e-3)


def test_turn_rewards_are_discounted_per_turn(episodes):
    gamma = 0.5
    scores = place_turn_rewards(episodes, agentic(turns=True), gamma=gamma)
    # episode 2: r = (0.5, 0.5, -1) at turn ends 1, 5, 8; G = (0.5+0.5*0.0, 0.5-0.5, -1)
    g3 = -1.0
    g2 = 0.5 + gamma * g3
    g1 = 0.5 + gamma * g2
    row = scores[2]
    assert row[1].item() == pytest.approx(g1 - g2)
    assert row[5].item() == pytest.approx(g2 - g3)
    assert row[8].item() == pytest.approx(g3)
    # reward-to-go over model tokens equals the per-turn discounted return
    mask = episodes["response_mask"][2].bool()
    to_go = row.flip(0).cumsum(0).flip(0)
    assert to_go[0].item() == pytest.approx(g1) and to_go[4].item() == pytest.approx(g2)
    assert not row[~mask].any()


def test_episodes_with_reinforce_turns_and_grpo(episodes):
    algo = AlgorithmConfig(adv_estimator="reinforce", whiten_advantages=False)
    out, metrics = shape(episodes, algo, agentic(turns=True))
    adv, mask = out["advantages"], out["response_mask"].bool()
    assert not adv[~mask].any()
    assert adv[2, 0].item() == pytest.approx(0.0) and adv[2, 8].item() == pytest.approx(-1.0)
    out, _ = shape(episodes, AlgorithmConfig(adv_estimator="grpo"), agentic())
    a = out["advantages"]
    assert a[0, 0] > 0 > a[1, 0] and a[0, 0] == a[0, 6]  # broadcast over model tokens
    assert "train/advantage_mean" in metrics


def test_length_reward_shapes_episodes_too(episodes):
    algo = AlgorithmConfig(adv_estimator="reinforce", add_len_reward=True)
    out, _ = shape(episodes, algo, agentic())
    # g0: the successful episode is the longer one: λ = 0.5 − 1 = −0.5 for it
    assert out["token_level_scores"][0].sum().item() == pytest.approx(1.0 - 0.5)


# ------------------------------------------- on-policy distillation (distill.teachers)


def distill_batch():
    """Two samples of two tokens: student and two teachers' log-probs, sample 1 routed
    only to teacher ``b``; the first sample's group scores 1, the second 0."""
    return batch(
        [1.0, 0.0],
        ["u", "u"],
        [2, 2],
        R=2,
        old_log_probs=torch.tensor([[-1.0, -1.0], [-2.0, -0.5]]),
        teacher_log_probs=torch.tensor(
            [[[-2.0, -1.5], [-1.0, -3.0]], [[-4.0, -4.0], [-1.0, -0.5]]]
        ),
        teacher_routed=torch.tensor([[True, True], [False, True]]),
    )


def distill(pure, direct_gradient=False):
    teachers = {"a": TeacherConfig(model_path="A", kl_coef=0.3), "b": TeacherConfig("B", 0.7)}
    return DistillConfig(teachers=teachers, pure=pure, direct_gradient=direct_gradient)


def test_pure_distillation_advantage_is_minus_the_weighted_kl():
    algo = AlgorithmConfig(adv_estimator="grpo")
    settings = ShapingSettings(algo, response_length=2, distill=distill(pure=True))
    out, m = compute_experience(distill_batch(), settings, ShapingState.from_config(algo))
    # per token Σ c_t·routed·(log π − log π_t) (tests/unit/algorithms/test_distill.py)
    expected = -torch.tensor([[0.3, 1.55], [-0.7, 0.0]])
    torch.testing.assert_close(out["advantages"], expected)
    torch.testing.assert_close(out["returns"], expected)
    # reverse KL per teacher over the tokens it scored: a (1.0 + 0.5)/2; b (0 + 2 − 1 + 0)/4
    assert m["distill/a/reverse_kl"] == pytest.approx(0.75)
    assert m["distill/b/reverse_kl"] == pytest.approx(0.25)
    assert m["distill/reverse_kl"] == pytest.approx((1.5 + 1.0) / 6)
    assert m["distill/a/samples"] == 1.0 and m["distill/b/samples"] == 2.0
    assert m["train/score_mean"] == 0.5  # the task reward is still reported


def test_mixed_distillation_subtracts_the_kl_from_the_rl_advantage():
    algo = AlgorithmConfig(adv_estimator="grpo")
    plain, _ = compute_experience(
        distill_batch(), ShapingSettings(algo, response_length=2), ShapingState.from_config(algo)
    )
    settings = ShapingSettings(algo, response_length=2, distill=distill(pure=False))
    out, _ = compute_experience(distill_batch(), settings, ShapingState.from_config(algo))
    expected = plain["advantages"] - torch.tensor([[0.3, 1.55], [-0.7, 0.0]])
    torch.testing.assert_close(out["advantages"], expected)


@pytest.mark.parametrize("pure", [True, False])
def test_direct_gradient_distillation_leaves_the_advantage_alone(pure):
    """GKD: the divergence is the actor's loss term; pure: the advantage is 0, mixed: the
    estimator's own; the teachers' metrics are still reported."""
    algo = AlgorithmConfig(adv_estimator="grpo")
    plain, _ = compute_experience(
        distill_batch(), ShapingSettings(algo, response_length=2), ShapingState.from_config(algo)
    )
    settings = ShapingSettings(algo, response_length=2, distill=distill(pure, True))
    out, m = compute_experience(distill_batch(), settings, ShapingState.from_config(algo))
    expected = torch.zeros(2, 2) if pure else plain["advantages"]
    torch.testing.assert_close(out["advantages"], expected)
    assert m["distill/a/reverse_kl"] == pytest.approx(0.75)
