"""Advantage estimators against hand-computed values (arithmetic in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from temper.algorithms import (
    ADV_ESTIMATORS,
    AdvantageInputs,
    AdvantageParams,
    compute_advantages,
    discounted_returns,
    group_stats,
)

T = torch.tensor


def outcome(
    scores: list[float], lengths: list[int], width: int = 3
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rewards with the score on the last valid token, and the prefix mask."""
    B = len(scores)
    rewards = torch.zeros(B, width)
    mask = torch.zeros(B, width)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = 1
        if n:
            rewards[i, n - 1] = s
    return rewards, mask


def adv_of(name: str, inp: AdvantageInputs, **kw: object) -> tuple[torch.Tensor, torch.Tensor]:
    return compute_advantages(name, inp, AdvantageParams(**kw))  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- grpo


def test_grpo_hand_values_all_equal_singleton_and_empty_rows() -> None:
    # group a: scores [1, 0, 0]; group b: [0.5, 0.5] (all equal); group c: [2] (singleton)
    # group a also holds a zero-length response (score 0, mask all 0).
    rewards, mask = outcome([1, 0, 0, 0.5, 0.5, 2, 0], [3, 2, 1, 3, 2, 1, 0])
    index = ["a", "a", "a", "b", "b", "c", "a"]
    adv, ret = adv_of("grpo", AdvantageInputs(rewards, mask, index))
    # group a = [1, 0, 0, 0]: mean 1/4; unbiased var = ((3/4)^2 + 3(1/4)^2)/3 = (9/16+3/16)/3 = 1/4
    # std = 1/2 -> A = (1 - 1/4)/(1/2 + 1e-6) = 1.5, (0 - 1/4)/(1/2) = -0.5
    e = 1e-6
    a_hi, a_lo = 0.75 / (0.5 + e), -0.25 / (0.5 + e)
    # group b: std 0 -> (0.5-0.5)/(0+eps) = 0; group c singleton: mean 0, std 1 -> 2/(1+eps)
    expected = torch.tensor(
        [
            [a_hi, a_hi, a_hi],
            [a_lo, a_lo, 0],
            [a_lo, 0, 0],
            [0, 0, 0],
            [0, 0, 0],
            [2 / (1 + e), 0, 0],
            [0, 0, 0],  # zero-length response: nothing to credit
        ]
    )
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected)
    assert torch.isfinite(adv).all()


def test_dr_grpo_no_std_division() -> None:
    rewards, mask = outcome([1, 0, 0], [2, 2, 2])
    adv, _ = adv_of(
        "grpo", AdvantageInputs(rewards, mask, [7, 7, 7]), norm_adv_by_std_in_grpo=False
    )
    # mean 1/3 -> 1 - 1/3 = 2/3, 0 - 1/3 = -1/3
    torch.testing.assert_close(adv[:, 0], torch.tensor([2 / 3, -1 / 3, -1 / 3]))


def test_group_index_tensor_and_strings_agree() -> None:
    rewards, mask = outcome([1, 0, 3, 5], [1, 1, 1, 1])
    a1, _ = adv_of("grpo", AdvantageInputs(rewards, mask, torch.tensor([10, 10, 3, 3])))
    a2, _ = adv_of("grpo", AdvantageInputs(rewards, mask, ["x", "x", "y", "y"]))
    torch.testing.assert_close(a1, a2)


# ----------------------------------------------------------------------------- rloo / opo / gpg


def test_rloo_hand_values() -> None:
    rewards, mask = outcome([1, 0, 0, 2], [2, 1, 3, 1])
    adv, _ = adv_of("rloo", AdvantageInputs(rewards, mask, [0, 0, 0, 1]))
    # group 0 (n = 3): A_1 = 1 - (0+0)/2 = 1; A_2 = 0 - (1+0)/2 = -0.5; A_3 = -0.5
    # group 1 is a singleton: no leave-one-out baseline -> A = 2
    expected = torch.tensor([[1, 1, 0], [-0.5, 0, 0], [-0.5, -0.5, -0.5], [2, 0, 0]])
    torch.testing.assert_close(adv, expected)


def test_opo_length_weighted_baseline() -> None:
    rewards, mask = outcome([1, 0, 4], [2, 4, 3], width=4)
    adv, _ = adv_of("opo", AdvantageInputs(rewards, mask, ["g", "g", "s"]))
    # b = (2*1 + 4*0)/(2+4) = 1/3 -> A = [2/3, -1/3]; singleton "s": b = 0 -> A = 4
    expected = torch.tensor([[2 / 3, 2 / 3, 0, 0], [-1 / 3, -1 / 3, -1 / 3, -1 / 3], [4, 4, 4, 0]])
    torch.testing.assert_close(adv, expected)


def test_gpg_alpha_scaling() -> None:
    rewards, mask = outcome([1, 0, 0, 1, 0, 0], [1] * 6, width=1)
    adv, _ = adv_of("gpg", AdvantageInputs(rewards, mask, [0, 0, 1, 1, 2, 2]))
    # B = 6, nonzero scores = 2 -> alpha = 3; group means 0.5, 0.5, 0
    # A = 3 * [0.5, -0.5, -0.5, 0.5, 0, 0]
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.5, -1.5, -1.5, 1.5, 0, 0]))


# ----------------------------------------------------------------------------- passk


def test_grpo_passk_only_best_gets_advantage() -> None:
    rewards, mask = outcome([0.2, 0.9, 0.5, 1, 1], [1, 2, 1, 1, 1])
    inp = AdvantageInputs(rewards, mask, [0, 0, 0, 1, 1])
    adv, _ = adv_of("grpo_passk", inp, norm_adv_by_std_in_grpo=False)
    # group 0: best 0.9, second 0.5 -> 0.4 on sample 1 only; group 1: tie -> 1 - 1 = 0
    expected = torch.zeros(5, 3)
    expected[1, :2] = 0.4
    torch.testing.assert_close(adv, expected)
    adv_n, _ = adv_of("grpo_passk", inp)
    # std([0.2, 0.9, 0.5]): mean 0.5333; squares 0.11111 + 0.13444 + 0.00111 = 0.24667;
    # /2 -> 0.123333; sqrt -> 0.351188 -> 0.4 / (0.351188 + 1e-6) = 1.138990
    std = math.sqrt(((0.2 - 1.6 / 3) ** 2 + (0.9 - 1.6 / 3) ** 2 + (0.5 - 1.6 / 3) ** 2) / 2)
    assert adv_n[1, 0].item() == pytest.approx(0.4 / (std + 1e-6), rel=1e-5)
    assert adv_n[1, 0].item() == pytest.approx(1.138990, rel=1e-5)


def test_grpo_passk_singleton_group_raises() -> None:
    rewards, mask = outcome([1, 0, 1], [1, 1, 1])
    with pytest.raises(ValueError, match=">= 2 responses"):
        adv_of("grpo_passk", AdvantageInputs(rewards, mask, [0, 0, 1]))


# ----------------------------------------------------------------------------- reinforce family


def test_reinforce_discounted_return_and_masked_carry() -> None:
    r = T([[1.0, 0.0, 2.0]])
    # gamma 0.5: G2 = 2, G1 = 0 + 0.5*2 = 1, G0 = 1 + 0.5*1 = 1.5
    adv, ret = adv_of("reinforce", AdvantageInputs(r, T([[1.0, 1.0, 1.0]])), gamma=0.5)
    torch.testing.assert_close(adv, T([[1.5, 1.0, 2.0]]))
    torch.testing.assert_close(ret, adv)
    # an observation token in the middle carries G through without a discount step:
    # G2 = 2, (t=1 masked: 0, carry 2), G0 = 1 + 0.5*2 = 2
    adv, _ = adv_of("reinforce", AdvantageInputs(T([[1.0, 5.0, 2.0]]), T([[1, 0, 1]])), gamma=0.5)
    torch.testing.assert_close(adv, T([[2.0, 0.0, 2.0]]))


def test_reinforce_plus_plus_whitened_returns() -> None:
    r = T([[0.0, 1.0], [0.0, 3.0]])
    adv, ret = adv_of("reinforce_plus_plus", AdvantageInputs(r, torch.ones(2, 2)), gamma=1.0)
    # returns [[1, 1], [3, 3]]; mean 2; unbiased var = 4*1/3 = 4/3 -> A = ±1/sqrt(4/3) = ±0.866025
    torch.testing.assert_close(ret, T([[1.0, 1.0], [3.0, 3.0]]))
    k = 1 / math.sqrt(4 / 3 + 1e-8)
    torch.testing.assert_close(adv, T([[-k, -k], [k, k]]))


def test_reinforce_plus_plus_baseline() -> None:
    rewards, mask = outcome([1, 3, 5], [2, 2, 1], width=2)
    adv, _ = adv_of("reinforce_plus_plus_baseline", AdvantageInputs(rewards, mask, [0, 0, 1]))
    # group 0 mean 2 -> a = [-1, 1]; singleton -> a = 5. Valid tokens: -1, -1, 1, 1, 5
    # mean = 5/5 = 1; unbiased var = (4+4+0+0+16)/4 = 6 -> whiten = (a - 1)/sqrt(6)
    s6 = math.sqrt(6 + 1e-8)
    expected = T([[-2 / s6, -2 / s6], [0.0, 0.0], [4 / s6, 0.0]])
    torch.testing.assert_close(adv, expected)


def test_remax_greedy_baseline() -> None:
    r = T([[0.0, 0.5, 1.0], [0.0, 2.0, 9.0]])
    mask = T([[1, 1, 1], [1, 1, 0]])
    inp = AdvantageInputs(r, mask, baseline_rewards=T([0.7, 1.0]))
    adv, ret = adv_of("remax", inp)
    # row 0: reward-to-go [1.5, 1.5, 1.0], minus 0.7 -> [0.8, 0.8, 0.3]
    # row 1: the 9 is on padding and ignored: to-go [2, 2, 0] -> [1, 1, 0]
    torch.testing.assert_close(ret, T([[1.5, 1.5, 1.0], [2.0, 2.0, 0.0]]))
    torch.testing.assert_close(adv, T([[0.8, 0.8, 0.3], [1.0, 1.0, 0.0]]))


def test_remax_requires_baseline() -> None:
    with pytest.raises(ValueError, match="baseline_rewards"):
        adv_of("remax", AdvantageInputs(torch.zeros(1, 2), torch.ones(1, 2)))


# ----------------------------------------------------------------------------- gae


def test_gae_hand_values() -> None:
    r = T([[0.0, 0.0, 1.0]])
    v = T([[0.5, 0.4, 0.6]])
    adv, ret = adv_of(
        "gae", AdvantageInputs(r, torch.ones(1, 3), values=v), gamma=0.9, lam=0.8, gae_whiten=False
    )
    # t=2: d = 1 + 0.9*0 - 0.6 = 0.4;               A2 = 0.4
    # t=1: d = 0 + 0.9*0.6 - 0.4 = 0.14;            A1 = 0.14 + 0.72*0.4 = 0.428
    # t=0: d = 0 + 0.9*0.4 - 0.5 = -0.14;           A0 = -0.14 + 0.72*0.428 = 0.16816
    torch.testing.assert_close(adv, T([[0.16816, 0.428, 0.4]]))
    # returns = A + V = [0.66816, 0.828, 1.0]
    torch.testing.assert_close(ret, T([[0.66816, 0.828, 1.0]]))


def test_gae_observation_tokens_carry_recursion() -> None:
    # same response with an observation token (masked) inserted at t=1: its value and reward
    # must not enter the recursion, and its advantage is 0.
    r = T([[0.0, 7.0, 0.0, 1.0]])
    v = T([[0.5, 9.0, 0.4, 0.6]])
    mask = T([[1, 0, 1, 1]])
    adv, ret = adv_of(
        "gae", AdvantageInputs(r, mask, values=v), gamma=0.9, lam=0.8, gae_whiten=False
    )
    torch.testing.assert_close(adv, T([[0.16816, 0.0, 0.428, 0.4]]))
    torch.testing.assert_close(ret, T([[0.66816, 0.0, 0.828, 1.0]]))


def test_gae_whiten_and_empty_rows() -> None:
    r = T([[0.0, 1.0], [0.0, 0.0]])
    v = T([[0.0, 0.0], [0.3, 0.3]])
    mask = T([[1, 1], [0, 0]])
    adv, _ = adv_of("gae", AdvantageInputs(r, mask, values=v), gamma=1.0, lam=1.0)
    # row 0 raw A = [1, 1] (gamma = lam = 1, V = 0); whitened over its 2 tokens: var 0 -> 0
    torch.testing.assert_close(adv, torch.zeros(2, 2))
    with pytest.raises(ValueError, match="values"):
        adv_of("gae", AdvantageInputs(r, mask))


def test_discounted_returns_matches_loop() -> None:
    g = torch.Generator().manual_seed(0)
    r = torch.randn(3, 5, generator=g)
    out = discounted_returns(r, torch.ones(3, 5), 0.9)
    for i in range(3):
        acc = 0.0
        for t in reversed(range(5)):
            acc = r[i, t].item() + 0.9 * acc
            assert out[i, t].item() == pytest.approx(acc, rel=1e-5, abs=1e-6)


# ----------------------------------------------------------------------------- all estimators


@pytest.mark.parametrize("name", ADV_ESTIMATORS.names())
def test_every_estimator_masks_and_handles_empty_rows(name: str) -> None:
    rewards, mask = outcome([1.0, 0.0, 1.0, 0.0, 0.0], [3, 2, 3, 0, 1])
    inp = AdvantageInputs(
        rewards,
        mask,
        group_index=[0, 0, 1, 1, 1],
        values=torch.full((5, 3), 0.25),
        baseline_rewards=torch.full((5,), 0.5),
        reward_components=torch.tensor(
            [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [0.0, 1.0]]
        ),
        old_log_probs=torch.full((5, 3), -0.5),
        sum_pi_squared=torch.full((5, 3), 0.4),
        step_rewards=torch.tensor([0.0, 1.0, 1.0, 0.0, -0.1]),
        episode_index=["a", "a", "b", "c", "c"],
        step_index=torch.tensor([0, 1, 0, 0, 1]),
        anchor_index=["s0", "s1", "s0", "s0", "s1"],
    )
    adv, ret = compute_advantages(name, inp, AdvantageParams(gamma=0.95, lam=0.9))
    assert adv.shape == ret.shape == (5, 3)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert (adv[mask == 0] == 0).all(), "advantages must be 0 on masked tokens"
    assert (adv[3] == 0).all(), "a zero-length response gets no advantage"
    assert not adv.requires_grad


@pytest.mark.parametrize("name", ["grpo", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline"])
def test_all_equal_group_gives_zero(name: str) -> None:
    rewards, mask = outcome([0.7, 0.7, 0.7, 0.7], [1, 2, 3, 3])
    adv, _ = compute_advantages(name, AdvantageInputs(rewards, mask, [1, 1, 1, 1]))
    torch.testing.assert_close(adv, torch.zeros(4, 3))


def test_group_stats_conventions() -> None:
    st = group_stats(T([1.0, 3.0, 5.0]), ["a", "a", "b"])
    torch.testing.assert_close(st.mean, T([2.0, 2.0, 0.0]))  # singleton: mean 0
    torch.testing.assert_close(st.std, T([math.sqrt(2.0), math.sqrt(2.0), 1.0]))  # singleton: 1
    torch.testing.assert_close(st.count, T([2.0, 2.0, 1.0]))


def test_missing_group_index_raises() -> None:
    with pytest.raises(ValueError, match="group_index"):
        compute_advantages("grpo", AdvantageInputs(torch.zeros(2, 2), torch.ones(2, 2)))
