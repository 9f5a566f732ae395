"""Reward shaping, sample filters/weights, value loss and the actor-loss terms."""

from __future__ import annotations

import math

import pytest
import torch

from temper.algorithms import (
    LossAggregator,
    RunningMoments,
    actor_loss,
    clip_with_fraction,
    filter_groups_by_mean,
    filter_groups_nonzero_std,
    format_penalty,
    grouped_reward_normalization,
    length_reward,
    masked_whiten,
    normalize_rewards,
    overlong_penalty,
    pf_ppo_resample_indices,
    pf_ppo_weights,
    reward_norm_types,
    sample_loss_weights,
    sft_loss,
    value_loss,
)

T = torch.tensor
R = T([1.0, 3.0, 5.0, 7.0])
G = ["a", "a", "b", "b"]
E = 1e-6


# ----------------------------------------------------------------------------- normalization


def test_reward_norm_types_from_roll_keys() -> None:
    assert reward_norm_types("group") == ("group", "group")
    assert reward_norm_types("batch", reward_shift=True) == ("batch", None)
    assert reward_norm_types("running", reward_scale=True) == (None, "running")
    assert reward_norm_types(None) == (None, None)
    with pytest.raises(ValueError, match="exclusive"):
        reward_norm_types("group", reward_shift=True, reward_scale=True)
    with pytest.raises(KeyError, match="did you mean 'group'"):
        reward_norm_types("grup")


def test_group_and_batch_normalization() -> None:
    # group a = [1, 3]: mean 2, unbiased std sqrt(2); group b = [5, 7]: mean 6, std sqrt(2)
    out = normalize_rewards(R, mean_type="group", std_type="group", group_index=G)
    s2 = math.sqrt(2) + E
    torch.testing.assert_close(out, T([-1 / s2, 1 / s2, -1 / s2, 1 / s2]))
    # mean only (reward_shift): [-1, 1, -1, 1]; std only (reward_scale): r / sqrt(2)
    out = normalize_rewards(R, mean_type="group", std_type=None, group_index=G)
    torch.testing.assert_close(out, T([-1.0, 1.0, -1.0, 1.0]))
    out = normalize_rewards(R, mean_type=None, std_type="group", group_index=G)
    torch.testing.assert_close(out, R / s2)
    # batch: mean 4; unbiased std = sqrt((9 + 1 + 1 + 9)/3) = sqrt(20/3) = 2.581989
    out = normalize_rewards(R, mean_type="batch", std_type="batch")
    torch.testing.assert_close(out, (R - 4) / (math.sqrt(20 / 3) + E))
    # no normalization
    torch.testing.assert_close(normalize_rewards(R, mean_type=None, std_type=None), R)


def test_normalization_edge_cases() -> None:
    # all-equal group -> 0 (std 0); singleton group -> passes through (mean 0, std 1)
    out = normalize_rewards(
        T([2.0, 2.0, 5.0]), mean_type="group", std_type="group", group_index=[0, 0, 1]
    )
    torch.testing.assert_close(out, T([0.0, 0.0, 5.0 / (1 + E)]))
    # a batch of one: mean 0, std 1
    out = normalize_rewards(T([3.0]), mean_type="batch", std_type="batch")
    torch.testing.assert_close(out, T([3.0 / (1 + E)]))
    with pytest.raises(ValueError, match="group_index"):
        normalize_rewards(R, mean_type="group", std_type=None)
    with pytest.raises(ValueError, match="RunningMoments"):
        normalize_rewards(R, mean_type="running", std_type=None)


def test_running_normalization_matches_all_data_seen() -> None:
    rm = RunningMoments()
    out1 = normalize_rewards(R, mean_type="running", std_type="running", running=rm)
    # after [1, 3, 5, 7]: mean 4, unbiased std sqrt(20/3) (same as batch)
    torch.testing.assert_close(out1, (R - 4) / (math.sqrt(20 / 3) + E))
    out2 = normalize_rewards(T([6.0, 6.0]), mean_type="running", std_type="running", running=rm)
    # all seen: [1, 3, 5, 7, 6, 6]: mean 28/6 = 4.666667; unbiased var = 25.333333/5 = 5.066667
    seen = T([1.0, 3.0, 5.0, 7.0, 6.0, 6.0], dtype=torch.float64)
    assert rm.mean == pytest.approx(seen.mean().item())
    assert rm.std == pytest.approx(seen.std().item())
    assert out2[0].item() == pytest.approx((6 - 28 / 6) / (math.sqrt(25.333333 / 5) + E), rel=1e-5)
    # checkpoint round trip
    rm2 = RunningMoments()
    rm2.load_state_dict(rm.state_dict())
    assert (rm2.mean, rm2.std, rm2.count) == (rm.mean, rm.std, rm.count)


def test_agentic_grouped_normalization_methods() -> None:
    x = T([1.0, 3.0, 5.0, 5.0])
    s2 = math.sqrt(2) + E
    # mean_std: group a -> ±1/sqrt(2); group b has std 0 -> zeros (ROLL's rule)
    out = grouped_reward_normalization(x, G, "mean_std")
    torch.testing.assert_close(out, T([-1 / s2, 1 / s2, 0.0, 0.0]))
    torch.testing.assert_close(grouped_reward_normalization(x, G, "mean"), T([-1.0, 1.0, 0.0, 0.0]))
    torch.testing.assert_close(grouped_reward_normalization(x, G, "identity"), x)
    # asym_clip on one group [10]*9 + [0]: mean 9, std sqrt(90/9) = sqrt(10)
    # (10 - 9)/sqrt(10) = 0.316228; (0 - 9)/sqrt(10) = -2.846 -> clamped to -1
    y = T([10.0] * 9 + [0.0])
    out = grouped_reward_normalization(y, None, "asym_clip")
    torch.testing.assert_close(out, T([1 / (math.sqrt(10) + E)] * 9 + [-1.0]))
    # a group of one -> 0 under mean_std
    torch.testing.assert_close(grouped_reward_normalization(T([4.0]), [0], "mean_std"), T([0.0]))


def test_clip_and_whiten() -> None:
    out, frac = clip_with_fraction(T([-3.0, 0.5, 2.0]), 1.0)
    torch.testing.assert_close(out, T([-1.0, 0.5, 1.0]))
    assert frac == pytest.approx(2 / 3)
    same, frac = clip_with_fraction(T([5.0]), None)
    assert same.item() == 5.0 and frac == 0.0
    # whiten over valid entries only: [1, 3] valid (mean 2, unbiased var 2), 100 is padding
    w = masked_whiten(T([[1.0, 3.0, 100.0]]), T([[1.0, 1.0, 0.0]]))
    torch.testing.assert_close(w[0, :2], T([-1.0, 1.0]) / math.sqrt(2 + 1e-8))
    # a single valid element: variance defined as 0, no NaN
    assert torch.isfinite(masked_whiten(T([[4.0, 0.0]]), T([[1.0, 0.0]]))).all()


# ----------------------------------------------------------------------------- reward terms


def test_length_reward_kimi() -> None:
    scores = T([1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0])
    lengths = T([10, 20, 30, 5, 5, 10, 30])
    groups = [0, 0, 0, 1, 1, 2, 2]
    out = length_reward(scores, lengths, groups, coef=1.0)
    # group 0: lambda = 0.5 - (len - 10)/20 = [0.5, 0, -0.5]; the incorrect one gets min(0, -0.5)
    # group 1: equal lengths -> 0
    # group 2: lambda = [0.5, -0.5]; incorrect short one: min(0, 0.5) = 0; correct long: -0.5
    torch.testing.assert_close(out, T([0.5, 0.0, -0.5, 0.0, 0.0, 0.0, -0.5]))


def test_format_and_overlong_penalties() -> None:
    out = format_penalty(T([1.0, 0.5]), T([True, False]), -0.1)
    torch.testing.assert_close(out, T([1.0, 0.4]))
    # max 20, buffer 4 -> expected length 16: penalty = min(0, -(len - 16)/4)
    out = overlong_penalty(T([10, 16, 18, 20]), max_response_length=20, overlong_buffer_len=4)
    torch.testing.assert_close(out, T([0.0, 0.0, -0.5, -1.0]))
    with pytest.raises(ValueError):
        overlong_penalty(T([1]), 10, 0)


# ----------------------------------------------------------------------------- filters / weights


def test_dynamic_sampling_filters() -> None:
    scores = T([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 3.0])
    groups = ["a", "a", "b", "b", "c", "c", "d"]
    # std 0 in a and c -> dropped; d is a singleton -> kept
    keep = filter_groups_nonzero_std(scores, groups)
    assert keep.tolist() == [False, False, True, True, False, False, True]
    # group means a 1, b 0.5, c 0.5, d 3: keep 0.1 < mean < 0.95
    keep = filter_groups_by_mean(scores, groups, low=0.1, high=0.95)
    assert keep.tolist() == [False, False, True, True, True, True, False]


def test_pf_ppo_weights_and_resampling() -> None:
    s = T([-2.0, 1.0, 0.0, 3.0])
    torch.testing.assert_close(pf_ppo_weights(s, "pow", 2.0), T([4.0, 1.0, 0.0, 9.0]) + 1e-8)
    torch.testing.assert_close(pf_ppo_weights(s, "max_min"), T([1.0, 0.0, 0.0, 1.0]) + 1e-8)
    torch.testing.assert_close(pf_ppo_weights(s, "max_random"), T([0.1, 0.1, 0.1, 0.4]) + 1e-8)
    idx = pf_ppo_resample_indices(s, "max_min", generator=torch.Generator().manual_seed(0))
    assert idx.shape == (4,) and set(idx.tolist()) <= {0, 3}
    with pytest.raises(KeyError, match="did you mean 'pow'"):
        pf_ppo_weights(s, "pwo")


def test_difficulty_and_length_loss_weights() -> None:
    mask = T([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    w = sample_loss_weights(
        mask, difficulty=T([0.0, 1.0]), difficulty_loss_weight=True, length_loss_weight=True
    )
    # difficulty: 0.5 + 1.5*[0, 1] = [0.5, 2]; length: 1.5 - (n - 1)/(3 - 1) = [1.5, 0.5]
    # product [0.75, 1.0], rescaled to mean 1: * 2/1.75 -> [0.857143, 1.142857]
    torch.testing.assert_close(w, T([0.75, 1.0]) * 2 / 1.75)
    torch.testing.assert_close(sample_loss_weights(mask), T([1.0, 1.0]))


# ----------------------------------------------------------------------------- value / actor terms


def test_value_loss_clipping_hand_values() -> None:
    v = T([[1.0, 2.0, 0.0]], requires_grad=True)
    returns = T([[1.5, 1.0, 1.0]])
    old = T([[0.5, 1.0, 0.0]])
    mask = torch.ones(1, 3)
    agg = LossAggregator.from_mask("token-mean", mask)
    loss, m = value_loss(v, returns, old, mask, agg, cliprange_value=0.2)
    # token 0: v_c = 0.5 + clip(0.5, ±0.2) = 0.7; max((1-1.5)^2, (0.7-1.5)^2) = max(0.25, 0.64) = 0.64
    # token 1: v_c = 1.2; max((2-1)^2, (1.2-1)^2) = max(1, 0.04) = 1
    # token 2: v_c = 0; max(1, 1) = 1
    # 0.5 * (0.64 + 1 + 1)/3 = 0.44
    assert loss.item() == pytest.approx(0.44, rel=1e-6)
    assert m["vf_clipfrac"].item() == pytest.approx(1 / 3)
    loss.backward()
    # token 0's clipped branch does not depend on v: grad 0; token 1: 0.5*2*(2-1)/3 = 1/3;
    # token 2: both branches equal (v inside the clip range): 0.5*2*(0-1)/3 = -1/3
    torch.testing.assert_close(v.grad, T([[0.0, 1 / 3, -1 / 3]]))
    loss, _ = value_loss(v, returns, old, mask, agg, cliprange_value=None)
    assert loss.item() == pytest.approx(0.5 * (0.25 + 1 + 1) / 3, rel=1e-6)


def test_sft_loss_on_positive_samples() -> None:
    logp = T([[-1.0, -2.0], [-3.0, -4.0]])
    mask = torch.ones(2, 2)
    positive = T([1.0, 0.0])
    agg = LossAggregator.from_mask("token-mean", mask * positive[:, None])
    # -log pi over the positive sample's tokens: (1 + 2)/2 = 1.5
    assert sft_loss(logp, mask, positive, agg).item() == pytest.approx(1.5)
    # ROLL's advantage-weighted variant: (2*1 + 2*2)/2 = 3
    adv = T([[2.0, 2.0], [1.0, 1.0]])
    assert sft_loss(logp, mask, positive, agg, advantages=adv).item() == pytest.approx(3.0)


def test_actor_loss_combination() -> None:
    total = actor_loss(
        T(1.0),
        kl_loss=T(2.0),
        kl_loss_coef=0.1,
        entropy=T(3.0),
        entropy_coef=0.01,
        sft_loss=T(4.0),
        sft_loss_coef=0.5,
        rl_loss_coef=0.9,
    )
    # 0.9 * (1 + 0.1*2) - 0.01*3 + 0.5*4 = 1.08 - 0.03 + 2 = 3.05
    assert total.item() == pytest.approx(3.05)
    assert actor_loss(T(1.5)).item() == 1.5
