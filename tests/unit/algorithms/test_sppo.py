"""SPPO's soft-mean baseline, estimator and squared loss against hand-computed values
(arithmetic in the comments), gradients included."""

from __future__ import annotations

import math

import pytest
import torch

from temper.algorithms import (
    AdvantageInputs,
    AdvantageParams,
    LossAggregator,
    PolicyLossParams,
    compute_advantages,
    compute_policy_loss,
)
from temper.algorithms.sppo import softmean

T = torch.tensor
ln = math.log


def test_softmean_is_log_mean_exp_over_beta_and_the_mean_at_zero() -> None:
    x = T([0.0, 1.0])
    # (1/1)·ln((e^0 + e^1)/2) = ln(1.859141) = 0.620115
    assert softmean(x, 1.0).item() == pytest.approx(0.620115, abs=1e-6)
    # β = 2: ½·ln((1 + e²)/2) = ½·ln(4.194528) = ½·1.433781 = 0.716890
    assert softmean(x, 2.0).item() == pytest.approx(0.716890, abs=1e-6)
    assert softmean(x, 0.0).item() == pytest.approx(0.5)
    # large β·x does not overflow: it tends to the max
    assert softmean(T([0.0, 1000.0]), 10.0).item() == pytest.approx(1000.0 - ln(2) / 10)


def test_estimator_centres_scores_on_the_batch_soft_mean() -> None:
    rewards = T([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = T([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    inp = AdvantageInputs(rewards, mask, group_index=[0, 1, 2])
    adv, ret = compute_advantages("sppo", inp, AdvantageParams(sppo_beta=1.0))
    # scores s = [1, 0, 0]; SoftMean_1 = ln((e + 2)/3) = ln(1.572761) = 0.452836
    base = ln((math.e + 2) / 3)
    want = T([[1 - base, 1 - base, 0.0], [-base, -base, -base], [0.0, 0.0, 0.0]])
    assert torch.allclose(adv, want, atol=1e-6)
    assert torch.equal(adv, ret)
    # β = 0: the plain mean 1/3
    adv0, _ = compute_advantages("sppo", inp, AdvantageParams(sppo_beta=0.0))
    assert adv0[0, 0].item() == pytest.approx(2 / 3)
    assert adv0[1, 2].item() == pytest.approx(-1 / 3)


def _case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # row 0: π 0.5, 0.4 against π_old 0.25, 0.4 → ρ0 = ln 2 = 0.693147, advantage 0.5
    # row 1: π 0.5, 0.9 against 0.5, 0.3 (third token padding) → ρ1 = ln 3, advantage -0.25
    logp = T([[ln(0.5), ln(0.4), 0.0], [ln(0.5), ln(0.9), -3.0]], requires_grad=True)
    old = T([[ln(0.25), ln(0.4), 0.0], [ln(0.5), ln(0.3), -1.0]])
    adv = T([[0.5, 0.5, 0.0], [-0.25, -0.25, 0.0]])
    mask = T([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    return logp, old, adv, mask


def test_loss_regresses_the_sequence_log_ratio_onto_eta_times_advantage() -> None:
    logp, old, adv, mask = _case()
    agg = LossAggregator.from_mask("token-mean", mask)
    loss, m = compute_policy_loss("sppo", logp, old, adv, mask, PolicyLossParams(sppo_eta=2.0), agg)
    # η = 2: targets 1.0 and -0.5
    # L0 = (0.693147 - 1)² = 0.094159;  L1 = (1.098612 + 0.5)² = 2.555561
    # loss = (0.094159 + 2.555561) / 2 = 1.324860
    assert loss.item() == pytest.approx(1.324860, abs=1e-5)
    assert m["log_ratio_mean"].item() == pytest.approx((ln(2) + ln(3)) / 2, abs=1e-6)
    assert m["preference_mean"].item() == pytest.approx(0.25)
    assert m["pg_clipfrac"].item() == 0.0
    loss.backward()
    # ∂loss/∂log π_t = 2·(ρ_i - η·A_i)/S on valid tokens: row 0 2·(-0.306853)/2, row 1
    # 2·1.598612/2; padding gets none
    g0, g1 = ln(2) - 1.0, ln(3) + 0.5
    want = T([[g0, g0, 0.0], [g1, g1, 0.0]])
    assert logp.grad is not None
    assert torch.allclose(logp.grad, want, atol=1e-5)


def test_loss_ignores_the_aggregation_mode_and_counts_only_non_empty_rows() -> None:
    logp, old, adv, mask = _case()
    p = PolicyLossParams(sppo_eta=2.0)
    base, _ = compute_policy_loss(
        "sppo", logp, old, adv, mask, p, LossAggregator.from_mask("token-mean", mask)
    )
    for mode in ("token-sum", "seq-mean-token-mean"):
        agg = LossAggregator.from_mask(mode, mask)
        other, _ = compute_policy_loss("sppo", logp, old, adv, mask, p, agg)
        assert other.item() == pytest.approx(base.item())
    # an all-padding third row changes nothing (S stays 2)
    pad = torch.zeros(1, 3)
    logp3 = torch.cat([logp.detach(), pad])
    old3, adv3, mask3 = torch.cat([old, pad]), torch.cat([adv, pad]), torch.cat([mask, pad])
    agg3 = LossAggregator.from_mask("token-mean", mask3)
    padded, _ = compute_policy_loss("sppo", logp3, old3, adv3, mask3, p, agg3)
    assert padded.item() == pytest.approx(base.item())


def test_micro_batch_split_sums_to_the_whole_and_weights_scale_rows() -> None:
    logp, old, adv, mask = _case()
    p = PolicyLossParams(sppo_eta=2.0)
    agg = LossAggregator.from_mask("token-mean", mask)
    whole, _ = compute_policy_loss("sppo", logp, old, adv, mask, p, agg)
    parts = sum(
        compute_policy_loss(
            "sppo", logp[i : i + 1], old[i : i + 1], adv[i : i + 1], mask[i : i + 1], p, agg
        )[0]
        for i in range(2)
    )
    assert parts.item() == pytest.approx(whole.item())
    # weights 2 on row 0 (mean over its valid tokens), 1 on row 1: (2·0.094159 + 2.555561)/2
    w = T([[2.0, 2.0, 9.0], [1.0, 1.0, 9.0]])
    weighted, _ = compute_policy_loss("sppo", logp, old, adv, mask, p, agg, w)
    assert weighted.item() == pytest.approx((2 * (ln(2) - 1) ** 2 + (ln(3) + 0.5) ** 2) / 2)


def test_first_update_is_reinforce_with_weight_two_eta_advantage() -> None:
    """With π_θ = π_old the gradient is -2η·A_i/S on each valid token of row i."""
    logp = T([[-1.0, -2.0], [-0.5, -0.7]], requires_grad=True)
    adv = T([[1.0, 1.0], [-0.5, -0.5]])
    mask = torch.ones(2, 2)
    agg = LossAggregator.from_mask("token-mean", mask)
    loss, _ = compute_policy_loss(
        "sppo", logp, logp.detach(), adv, mask, PolicyLossParams(sppo_eta=0.5), agg
    )
    loss.backward()
    assert logp.grad is not None
    # row 0: -2·0.5·1/2 = -0.5; row 1: -2·0.5·(-0.5)/2 = 0.25
    assert torch.allclose(logp.grad, T([[-0.5, -0.5], [0.25, 0.25]]))


# ------------------------------------------------------------------ verl's numbers

# Outputs of verl's SPPO recipe at 38d9a88 (2025-06) on the inputs below, rounded to 6
# decimals: ``softmean`` and ``compute_advantage`` (recipe/sppo/sppo_ray_trainer.py) give
# the advantages, ``compute_sppo_loss`` (recipe/sppo/dp_actor.py, token-mean) the loss and
# autograd its gradient. Row 2 is an empty response: its score counts in the soft mean,
# its loss does not.
V_MASK = T([[1, 1, 1], [1, 1, 0], [0, 0, 0], [1, 0, 0]]).float()
V_SCORES = T([0.8, 0.1, 0.0, 1.0])
V_LOGP = T([[-0.3, -1.2, -0.7], [-2.0, -0.1, 0.0], [0.0, 0.0, 0.0], [-0.9, 0.0, 0.0]])
V_OLD = T([[-0.5, -1.0, -0.6], [-1.5, -0.2, 0.0], [0.0, 0.0, 0.0], [-1.4, 0.0, 0.0]])
V_GOLDEN = {
    (1.0, 1.0): (
        [0.233409, -0.466591, -0.566591, 0.433409],
        0.04001,
        [[-0.222273] * 3, [0.044394, 0.044394, 0.0], [0.0] * 3, [0.044394, 0.0, 0.0]],
    ),
    (2.0, 0.5): (
        [0.153888, -0.546112, -0.646112, 0.353888],
        0.050596,
        [[-0.117963] * 3, [-0.084629, -0.084629, 0.0], [0.0] * 3, [0.215371, 0.0, 0.0]],
    ),
}


@pytest.mark.parametrize(("beta", "eta"), list(V_GOLDEN))
def test_matches_verls_sppo_recipe(beta: float, eta: float) -> None:
    want_adv, want_loss, want_grad = V_GOLDEN[(beta, eta)]
    rewards = torch.zeros(4, 3)
    rewards[:, 0] = V_SCORES  # the score on a valid token (row 2 has none: its score is 0)
    adv, _ = compute_advantages(
        "sppo", AdvantageInputs(rewards, V_MASK), AdvantageParams(sppo_beta=beta)
    )
    valid = V_MASK.any(-1)  # the empty row's advantage sits on no token here
    assert torch.allclose(adv[valid, 0], T(want_adv)[valid], atol=1e-6)
    logp = V_LOGP.clone().requires_grad_(True)
    agg = LossAggregator.from_mask("token-mean", V_MASK)
    loss, _ = compute_policy_loss(
        "sppo", logp, V_OLD, adv, V_MASK, PolicyLossParams(sppo_eta=eta), agg
    )
    assert loss.item() == pytest.approx(want_loss, abs=1e-6)
    loss.backward()
    assert logp.grad is not None
    assert torch.allclose(logp.grad, T(want_grad), atol=1e-6)
