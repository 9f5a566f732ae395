"""DPPO (binary TV, binary KL) and DRO against hand-computed values (arithmetic in the
comments). Conventions as ``test_policy_losses.py``: ``log r = log π_θ - log π_old``,
token-mean aggregation unless said otherwise."""

from __future__ import annotations

import math

import pytest
import torch

from temper.algorithms import (
    LossAggregator,
    PolicyLossParamError,
    PolicyLossParams,
    check_policy_loss,
    compute_policy_loss,
)

T = torch.tensor
ln = math.log


def run(
    name: str,
    logp: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    params: PolicyLossParams,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    agg = LossAggregator.from_mask("token-mean", mask)
    return compute_policy_loss(name, logp, old, adv, mask, params, agg, weights)


def probs(new: list[float], old: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """Leaf ``log π_θ`` and ``log π_old`` of one row from probabilities."""
    logp = torch.tensor([[ln(p) for p in new]], requires_grad=True)
    return logp, T([[ln(q) for q in old]])


# ----------------------------------------------------------------------------- dppo_tv

# π_old -> π_θ, advantage, and what PPO's ratio clip (ε = 0.2) would do:
#   token 0: 0.01 -> 0.05, A = +1: r = 5, PPO clips; |Δπ| = 0.04 ≤ 0.15, DPPO keeps it
#   token 1: 0.95 -> 0.78, A = -1: r = 0.821, PPO keeps; Δπ = -0.17 < -0.15, DPPO masks it
#   token 2: 0.5 -> 0.7,   A = +1: Δπ = +0.2 > 0.15: masked
#   token 3: 0.02 -> 0.3,  A = -1: Δπ = +0.28 ≥ -0.15: kept (the update lowers π again);
#            r = 15, its weight truncated at c = 10
TV_NEW, TV_OLD = [0.05, 0.78, 0.7, 0.3], [0.01, 0.95, 0.5, 0.02]
TV_ADV = T([[1.0, -1.0, 1.0, -1.0]])


def test_dppo_tv_masks_by_probability_difference() -> None:
    logp, old = probs(TV_NEW, TV_OLD)
    p = PolicyLossParams(clip_ratio=0.15, clip_ratio_c=10.0)
    loss, m = run("dppo_tv", logp, old, TV_ADV, torch.ones(1, 4), p)
    # L = -A · sg[min(r, c)] · log π_θ on kept tokens:
    #   token 0: -1 · 5 · ln 0.05 = 14.978661;  token 3: +1 · 10 · ln 0.3 = -12.039728
    # token-mean: (14.978661 + 0 + 0 - 12.039728)/4 = 0.734733
    assert loss.item() == pytest.approx((-5 * ln(0.05) + 10 * ln(0.3)) / 4, rel=1e-5)
    assert loss.item() == pytest.approx(0.734733, rel=1e-5)
    assert m["pg_clipfrac"].item() == pytest.approx(0.5)  # tokens 1, 2 masked
    assert m["pg_clipfrac_lower"].item() == pytest.approx(0.25)  # token 3 truncated
    loss.backward()
    # d/dlog π_θ = -A · w / 4 (the weight and the mask are constants):
    #   token 0: -5/4 = -1.25; token 3: +10/4 = 2.5; masked tokens: 0
    torch.testing.assert_close(logp.grad, T([[-1.25, 0.0, 0.0, 2.5]]))


def test_dppo_tv_without_truncation_and_asymmetric_thresholds() -> None:
    logp, old = probs(TV_NEW, TV_OLD)
    loss, m = run(
        "dppo_tv",
        logp,
        old,
        TV_ADV,
        torch.ones(1, 4),
        PolicyLossParams(clip_ratio=0.15, clip_ratio_c=None),
    )
    # clip_ratio_c None: no truncation, token 3 weighs r = 15: (-5 ln 0.05 + 15 ln 0.3)/4
    assert loss.item() == pytest.approx((-5 * ln(0.05) + 15 * ln(0.3)) / 4, rel=1e-5)
    assert m["pg_clipfrac_lower"].item() == 0.0
    # δ_low = 0.2 (token 1's Δπ = -0.17 now inside), δ_high = 0.03 (token 0's 0.04 outside)
    p = PolicyLossParams(clip_ratio=0.15, clip_ratio_low=0.2, clip_ratio_high=0.03)
    loss, m = run("dppo_tv", logp, old, TV_ADV, torch.ones(1, 4), p)
    # kept: token 1 (r = 0.78/0.95, L = +1 · r · ln 0.78) and token 3 (w = c = 3)
    r1 = 0.78 / 0.95
    assert loss.item() == pytest.approx((r1 * ln(0.78) + 3 * ln(0.3)) / 4, rel=1e-5)
    assert m["pg_clipfrac"].item() == pytest.approx(0.5)  # tokens 0, 2


# ----------------------------------------------------------------------------- dppo_kl


def binary_kl(p: float, q: float) -> float:
    e = 1e-8
    return q * ln(q / p) + (1 - q) * ln((1 - q + e) / (1 - p + e))


def test_dppo_kl_masks_by_binary_kl_in_the_advantages_direction() -> None:
    new, old_p = [0.6, 0.8, 0.2, 0.2, 0.8], [0.5] * 5
    logp, old = probs(new, old_p)
    adv = T([[1.0, 1.0, 1.0, -1.0, -1.0]])
    # binary KL from q = 0.5:
    #   p = 0.6: 0.5 ln(0.5/0.6) + 0.5 ln(0.5/0.4) = -0.091161 + 0.111572 = 0.020411
    #   p = 0.8 or 0.2: 0.5 ln(0.625) + 0.5 ln(2.5) = 0.223144
    assert binary_kl(0.6, 0.5) == pytest.approx(0.020411, rel=1e-4)
    assert (
        binary_kl(0.8, 0.5)
        == pytest.approx(binary_kl(0.2, 0.5))
        == pytest.approx(0.223144, rel=1e-5)
    )
    # δ = 0.05: token 0 (A > 0, KL 0.02) kept; token 1 (A > 0, p > q, KL 0.22) masked;
    # token 2 (A > 0, p < q) kept; token 3 (A < 0, p < q, KL 0.22) masked; token 4 (A < 0,
    # p > q) kept
    p = PolicyLossParams(clip_ratio=0.05, clip_ratio_c=3.0)
    loss, m = run("dppo_kl", logp, old, adv, torch.ones(1, 5), p)
    # r = [1.2, 1.6, 0.4, 0.4, 1.6]; L = -A r log π_θ on kept tokens:
    #   -1.2 ln 0.6 = 0.612997; -0.4 ln 0.2 = 0.643775; +1.6 ln 0.8 = -0.357029
    # token-mean over 5: 0.899743/5 = 0.179949
    expected = (-1.2 * ln(0.6) - 0.4 * ln(0.2) + 1.6 * ln(0.8)) / 5
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert loss.item() == pytest.approx(0.179949, rel=1e-4)
    assert m["pg_clipfrac"].item() == pytest.approx(0.4)
    loss.backward()
    # -A r / 5 on kept tokens: -0.24, -0.08, +0.32
    torch.testing.assert_close(logp.grad, T([[-0.24, 0.0, -0.08, 0.0, 0.32]]))


# ----------------------------------------------------------------------------- dro


def test_dro_quadratic_penalty_hand_values() -> None:
    logp = torch.tensor([[-1.0, -0.5, -3.0]], requires_grad=True)
    old = T([[-1.5, -0.5, 0.0]])
    adv = T([[1.0, -2.0, 5.0]])
    mask = T([[1.0, 1.0, 0.0]])  # token 2 is padding
    loss, m = run("dro", logp, old, adv, mask, PolicyLossParams(dro_beta=0.5))
    # token 0: log r = 0.5: L = -(-1·1 - 0.25·0.25) = 1.0625
    # token 1: log r = 0:   L = -(-0.5·-2) = -1
    # token-mean over the 2 valid tokens: 0.0625/2 = 0.03125
    assert loss.item() == pytest.approx(0.03125)
    assert m["ppo_kl"].item() == pytest.approx(-0.25)  # mean(-log r) = -(0.5 + 0)/2
    loss.backward()
    # dL/dlog π_θ = -A + β log r, /2: token 0: (-1 + 0.25)/2 = -0.375; token 1: 2/2 = 1
    torch.testing.assert_close(logp.grad, T([[-0.375, 1.0, 0.0]]))


def test_dro_needs_a_positive_beta_and_says_so_at_check() -> None:
    logp = torch.zeros(1, 1, requires_grad=True)
    for beta in (None, 0.0, -1.0):
        with pytest.raises(PolicyLossParamError, match="dro_beta") as err:
            run(
                "dro",
                logp,
                logp.detach(),
                T([[1.0]]),
                torch.ones(1, 1),
                PolicyLossParams(dro_beta=beta),
            )
        assert err.value.param == "dro_beta"
        with pytest.raises(PolicyLossParamError):
            check_policy_loss("dro", PolicyLossParams(dro_beta=beta))
    check_policy_loss("dro", PolicyLossParams(dro_beta=0.1))
    for name in ("dppo_tv", "dppo_kl", "vanilla", "clip_cov"):  # nothing to refuse
        check_policy_loss(name, PolicyLossParams())


def test_check_policy_loss_leaves_the_rng_alone() -> None:
    torch.manual_seed(3)
    expected = torch.rand(3)
    torch.manual_seed(3)
    check_policy_loss("clip_cov", PolicyLossParams(clip_cov_lb=-1e9, clip_cov_ub=1e9))
    torch.testing.assert_close(torch.rand(3), expected)


def test_rollout_is_weights_multiply_dppo_and_dro() -> None:
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    w = T([[0.5, 2.0]])
    adv = T([[1.0, -1.0]])
    # at π_θ = π_old every token is inside the region, r = 1: L = -A log π_θ · w
    # = [-1·-1·0.5, 1·-2·2] = [0.5, -4] -> mean -1.75 (dro: the penalty is 0 there)
    for name, p in (("dppo_tv", PolicyLossParams()), ("dppo_kl", PolicyLossParams()),
                    ("dro", PolicyLossParams(dro_beta=1.0))):  # fmt: skip
        loss, _ = run(name, logp, logp.detach(), adv, torch.ones(1, 2), p, weights=w)
        assert loss.item() == pytest.approx(-1.75), name
