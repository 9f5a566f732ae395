"""Policy losses against hand-computed values (arithmetic in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from temper.algorithms import (
    POLICY_LOSSES,
    LossAggregator,
    PolicyLossParams,
    compute_policy_loss,
    roll_dual_clip_constant,
    rollout_is_weights,
)
from temper.algorithms.rollout_correction import batch_normalized

T = torch.tensor
ln = math.log


def token_mean(mask: torch.Tensor) -> LossAggregator:
    return LossAggregator.from_mask("token-mean", mask)


def leaf(values: list[list[float]]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


def run(
    name: str,
    logp: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    params: PolicyLossParams | None = None,
    agg: LossAggregator | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    # every sample in topr_score's positive set (the other losses take no extra input)
    positive = {"sample_positive": torch.ones(logp.shape[0])}
    return compute_policy_loss(
        name,
        logp,
        old,
        adv,
        mask,
        params or PolicyLossParams(),
        agg or token_mean(mask),
        weights,
        positive,
    )


# ----------------------------------------------------------------------------- vanilla PPO

RATIOS = [1.5, 0.5, 1.1, 5.0]
ADV = T([[1.0, 1.0, -1.0, -1.0]])
MASK4 = torch.ones(1, 4)


def vanilla_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    logp = leaf([[0.0, 0.0, 0.0, 0.0]])
    old = T([[-ln(r) for r in RATIOS]])  # log r = logp - old
    return logp, old


def test_vanilla_verl_dual_clip_hand_values() -> None:
    logp, old = vanilla_inputs()
    loss, m = run(
        "vanilla", logp, old, ADV, MASK4, PolicyLossParams(clip_ratio=0.2, clip_ratio_c=3.0)
    )
    # token 0: r=1.5, A=+1: max(-1.5, -1.2) = -1.2 (clipped)
    # token 1: r=0.5, A=+1: max(-0.5, -0.8) = -0.5
    # token 2: r=1.1, A=-1: max(1.1, 1.1) = 1.1; dual: min(1.1, 3) = 1.1
    # token 3: r=5.0, A=-1: max(5.0, 1.2) = 5.0; dual: min(5.0, 3) = 3 (dual-clipped)
    # token-mean: (-1.2 - 0.5 + 1.1 + 3) / 4 = 0.6
    assert loss.item() == pytest.approx(0.6, rel=1e-6)
    assert m["pg_clipfrac"].item() == pytest.approx(0.25)  # token 0
    assert m["pg_clipfrac_lower"].item() == pytest.approx(0.25)  # token 3
    # ppo_kl = mean(-log r) = -(ln1.5 + ln0.5 + ln1.1 + ln5)/4
    assert m["ppo_kl"].item() == pytest.approx(-sum(map(ln, RATIOS)) / 4, rel=1e-5)
    loss.backward()
    # d/dlogp of -A r is -A r (unclipped tokens only), /4 for token-mean:
    # token 1: -0.5/4 = -0.125; token 2: +1.1/4 = 0.275; tokens 0 and 3 are clipped -> 0
    torch.testing.assert_close(logp.grad, T([[0.0, -0.125, 0.275, 0.0]]))


def test_vanilla_roll_dual_clip_and_no_dual_clip() -> None:
    logp, old = vanilla_inputs()
    roll = PolicyLossParams.from_roll(0.2, dual_clip_loss=True)
    assert roll.clip_ratio_c == pytest.approx(1.4) == roll_dual_clip_constant(0.2)
    loss, _ = run("vanilla", logp, old, ADV, MASK4, roll)
    # ROLL c = 1 + 2*0.2 = 1.4: token 3 -> min(5, 1.4) = 1.4; token 2 min(1.1, 1.4) = 1.1
    # (-1.2 - 0.5 + 1.1 + 1.4) / 4 = 0.2
    assert loss.item() == pytest.approx(0.2, rel=1e-6)
    off = PolicyLossParams.from_roll(0.2, dual_clip_loss=False)
    assert off.clip_ratio_c is None
    loss, m = run("vanilla", logp, old, ADV, MASK4, off)
    # no dual clip: (-1.2 - 0.5 + 1.1 + 5.0) / 4 = 1.1
    assert loss.item() == pytest.approx(1.1, rel=1e-6)
    assert m["pg_clipfrac_lower"].item() == 0.0


def test_vanilla_asymmetric_clip() -> None:
    logp, old = vanilla_inputs()
    p = PolicyLossParams(
        clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=None
    )
    loss, _ = run("vanilla", logp, old, ADV, MASK4, p)
    # token 0 now clipped at 1.28: -1.28; others as without dual clip: -0.5, 1.1, 5.0
    assert loss.item() == pytest.approx((-1.28 - 0.5 + 1.1 + 5.0) / 4, rel=1e-6)
    roll = PolicyLossParams.from_roll(
        0.2, use_pg_clip_range=True, pg_clip_low=0.1, pg_clip_high=0.3
    )
    assert (roll.low, roll.high) == (0.1, 0.3)


def test_dual_clip_constant_validated() -> None:
    with pytest.raises(ValueError, match="clip_ratio_c"):
        PolicyLossParams(clip_ratio_c=1.0)


# ----------------------------------------------------------------------------- gspo / cispo / gpg


def test_gspo_sequence_ratio_and_gradient() -> None:
    logp = leaf([[0.0, 0.0]])
    old = T([[-ln(1.5), -ln(0.6)]])
    loss, m = run(
        "gspo",
        logp,
        old,
        T([[1.0, 1.0]]),
        torch.ones(1, 2),
        PolicyLossParams(loss_agg_mode_override="seq-mean-token-mean"),
    )
    # s = exp((ln1.5 + ln0.6)/2) = sqrt(0.9) = 0.948683 inside [0.8, 1.2] -> loss = -A s
    s = math.sqrt(0.9)
    assert loss.item() == pytest.approx(-s, rel=1e-6)
    assert m["pg_clipfrac"].item() == 0.0
    loss.backward()
    # grad of -s_i = -s * d(mean_t log pi)/dlogp_t = -s/2 per token (paper's sequence gradient)
    torch.testing.assert_close(logp.grad, T([[-s / 2, -s / 2]]))


def test_gspo_clips_the_sequence_ratio() -> None:
    logp = leaf([[0.0, 0.0]])
    old = T([[-ln(2.0), -ln(2.0)]])  # s = 2 -> clipped to 1.2 for A > 0
    loss, m = run("gspo", logp, old, T([[1.0, 1.0]]), torch.ones(1, 2))
    assert loss.item() == pytest.approx(-1.2, rel=1e-6)
    assert m["pg_clipfrac"].item() == 1.0
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.zeros(1, 2))


def test_cispo_stop_gradient_clipped_weight() -> None:
    logp = leaf([[-1.0, -2.0]])
    old = T([[-1.0 - ln(1.5), -2.0 - ln(0.5)]])  # r = [1.5, 0.5]
    loss, m = run("cispo", logp, old, T([[1.0, -1.0]]), torch.ones(1, 2))
    # w = clip(r, 0.8, 1.2) = [1.2, 0.8]; L = -w A log pi = [-1.2*1*(-1), -0.8*(-1)*(-2)] = [1.2, -1.6]
    # token-mean = (1.2 - 1.6)/2 = -0.2
    assert loss.item() == pytest.approx(-0.2, rel=1e-6)
    assert m["pg_clipfrac"].item() == 1.0
    loss.backward()
    # dL/dlogp = -w A / 2 = [-0.6, 0.4]  (the weight is not differentiated)
    torch.testing.assert_close(logp.grad, T([[-0.6, 0.4]]))


def test_cispo_unified_mask_drops_tokens_pushed_past_the_clip() -> None:
    logp = leaf([[-1.0, -2.0, -0.5, -1.0]])
    old = T([[-1.0 - ln(1.5), -2.0 - ln(0.5), -0.5 - ln(1.5), -1.0 - ln(0.5)]])
    adv = T([[1.0, -1.0, -1.0, 1.0]])  # r = [1.5, 0.5, 1.5, 0.5]
    params = PolicyLossParams(cispo_unified_mask=True)
    loss, _ = run("cispo", logp, old, adv, torch.ones(1, 4), params)
    # M = 0 for token 0 (A>0, r=1.5>1.2) and token 1 (A<0, r=0.5<0.8); tokens 2, 3 kept:
    # w = clip(r, 0.8, 1.2) = [., ., 1.2, 0.8]; L = [0, 0, -1.2*(-1)*(-0.5), -0.8*1*(-1)]
    #   = [0, 0, -0.6, 0.8]; token-mean over all 4 tokens = 0.2/4 = 0.05
    assert loss.item() == pytest.approx(0.05, rel=1e-6)
    loss.backward()
    # dL/dlogp = -M w A / 4 = [0, 0, 1.2/4, -0.8/4]
    torch.testing.assert_close(logp.grad, T([[0.0, 0.0, 0.3, -0.2]]))
    plain, _ = run("cispo", logp.detach(), old, adv, torch.ones(1, 4))
    # without the mask: [1.2, -1.6, -0.6, 0.8] -> -0.2/4 = -0.05
    assert plain.item() == pytest.approx(-0.05, rel=1e-6)


def test_gpg_plain_policy_gradient() -> None:
    logp = leaf([[-1.0, -3.0]])
    loss, _ = run("gpg", logp, logp.detach(), T([[2.0, -1.0]]), torch.ones(1, 2))
    # -A log pi = [2, -3] -> mean -0.5
    assert loss.item() == pytest.approx(-0.5)
    loss.backward()
    torch.testing.assert_close(logp.grad, T([[-1.0, 0.5]]))


# ----------------------------------------------------------------------------- sapo / topr / geo_mean


def test_sapo_soft_gate() -> None:
    logp = leaf([[0.0, 0.0, 0.0]])
    old = T([[0.0, 0.0, -ln(2.0)]])  # r = [1, 1, 2]
    loss, _ = run("sapo", logp, old, T([[1.0, -1.0, 1.0]]), torch.ones(1, 3))
    # f(r) = sigmoid(tau (r - 1)) * 4/tau
    # token 0: r=1, tau_pos=1 -> f = 0.5*4 = 2 -> L = -2
    # token 1: r=1, tau_neg=1.05 -> f = 2/1.05 = 1.904762 -> L = +1.904762
    # token 2: r=2, tau=1 -> f = sigmoid(1)*4 = 0.731059*4 = 2.924234 -> L = -2.924234
    expected = (-2 + 2 / 1.05 - 4 / (1 + math.exp(-1))) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    # at r = 1: dL/dlogp = -A * sigmoid'(0) * 4 * r = -A; token 2: -A*4*s(1)(1-s(1))*2
    s1 = 1 / (1 + math.exp(-1))
    torch.testing.assert_close(logp.grad, T([[-1 / 3, 1 / 3, -(4 * s1 * (1 - s1) * 2) / 3]]))


def test_topr_positive_and_negative_sets() -> None:
    logp = leaf([[-1.0, -2.0, -0.5]])
    old = T([[-1.0 - ln(3.0), -2.0 - ln(0.5), -0.5 - ln(2.0)]])  # r = [3, 0.5, 2]
    loss, m = run("topr", logp, old, T([[1.0, -1.0, -1.0]]), torch.ones(1, 3))
    # positive token: w = 1 -> -1*1*(-1) = 1
    # negative tokens: w = clip(r, 0, 1) = 0.5 and 1 -> -0.5*(-1)*(-2) = -1; -1*(-1)*(-0.5) = -0.5
    # mean = (1 - 1 - 0.5)/3 = -1/6
    assert loss.item() == pytest.approx(-1 / 6, rel=1e-6)
    assert m["pg_clipfrac"].item() == pytest.approx(1 / 3)  # negative token with r > 1
    loss.backward()
    torch.testing.assert_close(logp.grad, T([[-1 / 3, 0.5 / 3, 1 / 3]]))


def reinforce(level: str, low: float | None = None, threshold: float = 2.0) -> PolicyLossParams:
    return PolicyLossParams(
        reinforce_is_level=level,
        reinforce_is_threshold=threshold,
        reinforce_is_threshold_low=low,
    )


def test_reinforce_is_without_weights_is_plain_reinforce() -> None:
    logp = leaf([[-1.0, -2.0]])
    loss, m = run("reinforce_is", logp, T([[-1.5, -1.0]]), T([[1.0, -1.0]]), torch.ones(1, 2),
                  reinforce("none"))  # fmt: skip
    # -A·log π = [-1·(-1), -(-1)·(-2)] = [1, -2] -> mean -0.5; no ratio, no clipping
    assert loss.item() == pytest.approx(-0.5)
    assert m["ppo_kl"].item() == pytest.approx(0.25)  # mean(-(log π - log π_old)) = (-0.5 + 1)/2
    loss.backward()
    torch.testing.assert_close(logp.grad, T([[-0.5, 0.5]]))  # -A/2


def test_reinforce_is_token_weights_truncate_and_are_detached() -> None:
    logp = leaf([[-1.0, -2.0, -0.5]])
    old = T([[-1.0 - ln(3.0), -2.0 - ln(0.5), -0.5 - ln(1.5)]])  # ρ = [3, 0.5, 1.5]
    loss, m = run("reinforce_is", logp, old, T([[1.0, -1.0, 2.0]]), torch.ones(1, 3),
                  reinforce("token"))  # fmt: skip
    # w = min(ρ, 2) = [2, 0.5, 1.5]; -w·A·log π = [-2·1·(-1), -0.5·(-1)·(-2), -1.5·2·(-0.5)]
    #   = [2, -1, 1.5] -> mean 2.5/3
    assert loss.item() == pytest.approx(2.5 / 3, rel=1e-6)
    assert m["pg_clipfrac"].item() == pytest.approx(1 / 3)  # ρ = 3 was truncated
    loss.backward()  # w is a constant: d/dlogπ = -w·A/3
    torch.testing.assert_close(logp.grad, T([[-2 / 3, 0.5 / 3, -3 / 3]]))


def test_reinforce_is_sequence_weight_and_icepop() -> None:
    logp = leaf([[-1.0, -2.0], [-1.0, -1.0]])
    old = T([[-1.0 - ln(3.0), -2.0 - ln(0.5)], [-1.0 - ln(4.0), -1.0]])
    mask = torch.ones(2, 2)
    adv = T([[1.0, 1.0], [1.0, 1.0]])
    # sequence ρ: 3·0.5 = 1.5 (row 0), 4·1 = 4 (row 1) -> truncated at 2: w = [1.5, 2]
    loss, _ = run("reinforce_is", logp, old, adv, mask, reinforce("sequence"))
    # -w·A·log π: row 0: 1.5·[1, 2] = [1.5, 3]; row 1: 2·[1, 1] = [2, 2] -> mean 8.5/4
    assert loss.item() == pytest.approx(8.5 / 4, rel=1e-6)
    # IcePop [0.5, 2]: row 1's ρ = 4 is outside -> weight 0; row 0 keeps 1.5 -> 4.5/4
    loss, m = run("reinforce_is", leaf([[-1.0, -2.0], [-1.0, -1.0]]), old, adv, mask,
                  reinforce("sequence", low=0.5))  # fmt: skip
    assert loss.item() == pytest.approx(4.5 / 4, rel=1e-6)
    assert m["pg_clipfrac"].item() == pytest.approx(0.5)  # row 1's two tokens


def test_topr_score_splits_by_the_sample_score() -> None:
    from temper.algorithms import policy_loss_inputs

    logp = leaf([[-1.0, -2.0], [-0.5, -1.0]])
    old = T([[-1.0 - ln(3.0), -2.0 - ln(0.5)], [-0.5 - ln(2.0), -1.0 - ln(0.5)]])
    adv = T([[-1.0, -1.0], [1.0, 1.0]])  # r = [[3, 0.5], [2, 0.5]]
    mask = torch.ones(2, 2)
    positive = {"sample_positive": T([1.0, 0.0])}  # score > 0 for sample 0 only
    agg = token_mean(mask)
    loss, m = compute_policy_loss(
        "topr_score", logp, old, adv, mask, PolicyLossParams(), agg, None, positive
    )
    # sample 0 (positive set, A = -1): -A log pi = [-1, -2]
    # sample 1 (negative set, A = +1): w = clip(r, 0, 1) = [1, 0.5] -> -w A log pi = [0.5, 0.5]
    # token-mean = (-1 - 2 + 0.5 + 0.5)/4 = -0.5
    assert loss.item() == pytest.approx(-0.5, rel=1e-6)
    assert m["pg_clipfrac"].item() == pytest.approx(1 / 4)  # sample 1's r = 2 > 1
    loss.backward()
    # dL/dlogp = -w A / 4 = [[0.25, 0.25], [-0.25, -0.125]]
    torch.testing.assert_close(logp.grad, T([[0.25, 0.25], [-0.25, -0.125]]))
    # split by the advantage instead (topr): sample 1 positive [0.5, 1], sample 0 negative
    # w = [1, 0.5] -> [-1, -1]; mean (-1 - 1 + 0.5 + 1)/4 = -0.125
    plain, _ = run("topr", logp.detach(), old, adv, mask)
    assert plain.item() == pytest.approx(-0.125, rel=1e-6)
    # weights 2 / 0.5: [-2, -4] and [0.25, 0.25] -> -5.5/4
    params = PolicyLossParams(topr_positive_weight=2.0, topr_negative_weight=0.5)
    weighted, _ = compute_policy_loss(
        "topr_score", logp.detach(), old, adv, mask, params, agg, None, positive
    )
    assert weighted.item() == pytest.approx(-1.375, rel=1e-6)
    assert policy_loss_inputs("topr_score") == {"sample_positive"}
    assert policy_loss_inputs("topr") == frozenset()
    with pytest.raises(KeyError, match="sample_positive"):
        compute_policy_loss("topr_score", logp.detach(), old, adv, mask, PolicyLossParams(), agg)


def test_geo_mean_hand_values() -> None:
    logp = leaf([[0.0, 0.0], [0.0, 0.0]])
    old = T([[-0.5, 0.1], [0.5, -0.1]])  # log r = [[0.5, -0.1], [-0.5, 0.1]]
    adv = T([[1.0, 1.0], [-1.0, -1.0]])
    loss, m = run("geo_mean", logp, old, adv, torch.ones(2, 2))
    # seq 0 (A>0): clip(lr, -0.2, 0.2) = [0.2, -0.1]; min(lr, clipped) = [0.2, -0.1]
    #   rho = exp(0.05) = 1.051271 -> L0 = -1.051271
    # seq 1 (A<0): clipped = [-0.2, 0.1]; max(lr, clipped) = [-0.2, 0.1]
    #   rho = exp(-0.05) = 0.951229 -> L1 = +0.951229
    # mean over 2 sequences = (-1.051271 + 0.951229)/2 = -0.050021
    assert loss.item() == pytest.approx((-math.exp(0.05) + math.exp(-0.05)) / 2, rel=1e-6)
    assert m["pg_clipfrac"].item() == pytest.approx(0.25)
    assert m["pg_clipfrac_lower"].item() == pytest.approx(0.25)


# ----------------------------------------------------------------------------- covariance losses


def cov_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # A = [1, 0, 0, -1] (mean 0), log pi = [-1, -2, -3, -5] (mean -2.75)
    # cov = (A - 0)(logp + 2.75) = [1.75, 0, 0, -1 * -2.25] = [1.75, 0, 0, 2.25]
    logp = leaf([[-1.0, -2.0, -3.0, -5.0]])
    adv = T([[1.0, 0.0, 0.0, -1.0]])
    return logp, adv, torch.ones(1, 4)


def test_kl_cov_penalizes_top_covariance_token() -> None:
    logp, adv, mask = cov_inputs()
    old = logp.detach() - T([[0.1, 0.0, 0.0, 0.2]])
    p = PolicyLossParams(kl_cov_ratio=0.25, ppo_kl_coef=1.0)
    loss, m = run("kl_cov", logp, old, adv, mask, p)
    # k = max(1, int(4 * 0.25)) = 1 -> token 3 (cov 2.25)
    # -A r = [-e^0.1, 0, 0, e^0.2] ; token 3 += 1 * |0.2|
    expected = (-math.exp(0.1) + math.exp(0.2) + 0.2) / 4
    assert loss.item() == pytest.approx(expected, rel=1e-5)  # fp32 log-ratio rounding
    assert m["ppo_kl_abs"].item() == pytest.approx(0.3 / 4, rel=1e-5)


def test_clip_cov_detaches_tokens_in_cov_band() -> None:
    logp, adv, mask = cov_inputs()
    p = PolicyLossParams(clip_cov_ratio=0.5, clip_cov_lb=1.0, clip_cov_ub=2.0)
    loss, m = run("clip_cov", logp, logp.detach(), adv, mask, p)
    # r = 1 everywhere (no PPO clipping): L = -A = [-1, 0, 0, 1]
    # candidates: 1 < cov < 2 -> token 0 only (2.25 is above ub); n_clip = int(0.5*4) = 2 >= 1
    # -> token 0's loss is zeroed: (0 + 0 + 0 + 1)/4 = 0.25
    assert loss.item() == pytest.approx(0.25)
    assert m["pg_clipfrac"].item() == pytest.approx(0.25)
    loss.backward()
    torch.testing.assert_close(logp.grad, T([[0.0, 0.0, 0.0, 0.25]]))


# ----------------------------------------------------------------------------- rollout correction


def test_rollout_is_weights_levels_and_modes() -> None:
    old = T([[ln(3.0), ln(0.5)]])
    rollout = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    w, new_mask, m = rollout_is_weights(old, rollout, mask, level="token", threshold=2.0)
    # token ratios [3, 0.5] truncated at 2 -> [2, 0.5]; one of two truncated
    torch.testing.assert_close(w, T([[2.0, 0.5]]))
    assert m["rollout_is_clipfrac"].item() == pytest.approx(0.5)
    assert new_mask is mask
    w, _, _ = rollout_is_weights(old, rollout, mask, level="sequence", threshold=2.0)
    torch.testing.assert_close(w, T([[1.5, 1.5]]))  # product 3 * 0.5 = 1.5
    w, _, _ = rollout_is_weights(old, rollout, mask, level="geometric", threshold=2.0)
    torch.testing.assert_close(w, torch.full((1, 2), math.sqrt(1.5)))  # exp(mean log) = 1.5^(1/2)
    w, new_mask, _ = rollout_is_weights(
        old, rollout, mask, level="token", threshold=2.0, mode="mask"
    )
    # MIS: keep ratios in [1/2, 2]: 3 dropped, 0.5 kept
    torch.testing.assert_close(new_mask, T([[0.0, 1.0]]))
    torch.testing.assert_close(w, T([[0.0, 1.0]]))
    w, _, _ = rollout_is_weights(old, rollout, mask, threshold=2.0)
    w, mean = batch_normalized(w, mask, "token")
    torch.testing.assert_close(w, T([[2.0, 0.5]]) / 1.25)  # mean of [2, 0.5] is 1.25
    assert mean == pytest.approx(1.25)


def test_icepop_zeroes_weights_outside_its_band_and_keeps_the_mask() -> None:
    """verl's ``rollout_is_threshold: "0.8_2.5"``: ratios [3, 0.5, 1.5, 2.5] → [0, 0, 1.5,
    2.5] (3 above, 0.5 below the band); the mask is unchanged."""
    old = T([[ln(3.0), ln(0.5), ln(1.5), ln(2.5)]])
    mask = torch.ones(1, 4)
    w, new_mask, m = rollout_is_weights(
        old, torch.zeros(1, 4), mask, threshold=2.5, threshold_low=0.8, mode="icepop"
    )
    torch.testing.assert_close(w, T([[0.0, 0.0, 1.5, 2.5]]))
    assert new_mask is mask and m["rollout_is_clipfrac"].item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="threshold_low"):
        rollout_is_weights(old, torch.zeros(1, 4), mask, threshold=2.5, mode="icepop")


def test_sequence_level_batch_normalization_averages_over_sequences() -> None:
    """Two sequences, ratios 2 (3 tokens) and 0.5 (1 token): the sequence mean is 1.25
    (the token mean would be 1.625); a sequence without tokens does not count."""
    old = T([[ln(2.0) / 3] * 3, [ln(0.5), 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = T([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    w, _, _ = rollout_is_weights(old, torch.zeros(3, 3), mask, level="sequence", threshold=5.0)
    w, _ = batch_normalized(w, mask, "sequence")
    torch.testing.assert_close(w, T([[1.6, 1.6, 1.6], [0.4, 0.0, 0.0], [0.0, 0.0, 0.0]]))


def test_weight_mean_parts_sum_over_micro_batches_to_the_batch_mean() -> None:
    """The parts of two halves add up to the whole batch's mean: tokens (Σw·m, Σm), or
    sequences (Σ per-sequence mean, number of sequences with a token)."""
    from temper.algorithms.rollout_correction import weight_mean_parts

    w = T([[2.0, 2.0, 2.0], [0.5, 9.0, 9.0], [7.0, 7.0, 7.0]])
    mask = T([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    total, count = weight_mean_parts(w, mask, "token")
    assert (total.item(), count.item()) == (6.5, 4.0)
    total, count = weight_mean_parts(w, mask, "sequence")
    assert (total.item(), count.item()) == (2.5, 2.0)  # the third row has no token
    halves = [weight_mean_parts(w[i : i + 1], mask[i : i + 1], "sequence") for i in range(3)]
    assert sum(t.item() for t, _ in halves) / sum(c.item() for _, c in halves) == 1.25


def test_reinforce_is_batch_normalize_needs_reinforce_is_weights() -> None:
    from temper.algorithms.policy_losses import PolicyLossParamError, check_policy_loss

    params = PolicyLossParams(reinforce_is_batch_normalize=True, reinforce_is_level="token")
    check_policy_loss("reinforce_is", params)
    for name, level in (("vanilla", "token"), ("reinforce_is", "none")):
        bad = PolicyLossParams(reinforce_is_batch_normalize=True, reinforce_is_level=level)
        with pytest.raises(PolicyLossParamError, match="reinforce_is_level"):
            check_policy_loss(name, bad)


def test_rollout_is_weights_multiply_token_losses() -> None:
    logp = leaf([[-1.0, -3.0]])
    loss, _ = run(
        "gpg", logp, logp.detach(), T([[2.0, -1.0]]), torch.ones(1, 2), weights=T([[0.5, 2.0]])
    )
    # -A log pi * w = [2*0.5, -3*2] = [1, -6] -> mean -2.5
    assert loss.item() == pytest.approx(-2.5)


# ----------------------------------------------------------------------------- robustness


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_very_negative_logprobs_are_finite(name: str) -> None:
    logp = leaf([[-1e4, -50.0, 0.0], [-1e4, -1e4, -3.0]])
    old = T([[0.0, -1e4, -1e4], [-1e4, -1e4, 0.0]])
    adv = T([[1.0, -1.0, 2.0], [-2.0, 1.0, 0.5]])
    mask = T([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    p = PolicyLossParams(kl_cov_ratio=0.5, clip_cov_ratio=0.5, dro_beta=0.1)
    loss, metrics = run(name, logp, old, adv, mask, p)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(logp.grad).all()
    assert all(torch.isfinite(v).all() for v in metrics.values())


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_fully_masked_rows_and_empty_batch(name: str) -> None:
    logp = leaf([[-1.0, -2.0], [-0.5, -0.1]])
    old = logp.detach() + 0.1
    adv = T([[1.0, 1.0], [-1.0, -1.0]])
    mask = T([[1.0, 1.0], [0.0, 0.0]])
    p = PolicyLossParams(dro_beta=0.1)
    loss, _ = run(name, logp, old, adv, mask, p)
    loss.backward()
    assert torch.isfinite(loss)
    assert (logp.grad[1] == 0).all(), "a fully masked row must not receive gradient"
    # an entirely empty micro-batch contributes exactly 0
    logp2 = leaf([[-1.0, -2.0]])
    loss2, _ = run(name, logp2, logp2.detach(), T([[1.0, 1.0]]), torch.zeros(1, 2), p)
    assert loss2.item() == 0.0


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_on_policy_gradient_is_reinforce(name: str) -> None:
    """At r = 1 (first PPO epoch) every loss except geo_mean/gspo/sapo-scale has the
    REINFORCE gradient -A ∇log π (token-mean)."""
    logp = leaf([[-1.0, -2.0, -0.5]])
    adv = T([[1.0, -2.0, 0.5]])
    loss, _ = run(
        name,
        logp,
        logp.detach(),
        adv,
        torch.ones(1, 3),
        PolicyLossParams(kl_cov_ratio=1e-9, clip_cov_ratio=1e-9, clip_cov_lb=1e9, dro_beta=0.1),
    )
    loss.backward()
    if name == "geo_mean":  # sequence-level: -mean(A) * d mean(lr) = -mean(A)/3 per token
        torch.testing.assert_close(logp.grad, torch.full((1, 3), -(adv.mean().item()) / 3))
    elif name == "gspo":  # sequence ratio: -A_t * s / (n * S), s = 1
        torch.testing.assert_close(logp.grad, -adv / 3)
    elif name == "sppo":  # squared sequence loss: -2η·mean(A) per token, η = 1, S = 1
        torch.testing.assert_close(logp.grad, torch.full((1, 3), -2 * adv.mean().item()))
    else:
        torch.testing.assert_close(logp.grad, -adv / 3)


def test_unknown_loss_name() -> None:
    with pytest.raises(KeyError, match="did you mean 'vanilla'"):
        compute_policy_loss(
            "vanila",
            torch.zeros(1, 1),
            torch.zeros(1, 1),
            torch.zeros(1, 1),
            torch.ones(1, 1),
            PolicyLossParams(),
            token_mean(torch.ones(1, 1)),
        )
