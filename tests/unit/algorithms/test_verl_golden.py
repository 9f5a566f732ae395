"""verl 0.9's algorithms against numbers verl computed: the constants below are the
outputs of ``verl/trainer/ppo/core_algos.py`` at verl 1dda039 (2026-08-22) —
``compute_optimal_token_baseline_advantage``,
``compute_multi_turn_optimal_token_baseline_advantage``, ``compute_gdpo_outcome_advantage``,
``compute_policy_loss_dppo_tv`` / ``_dppo_kl`` / ``_dro`` with ``agg_loss`` in
``token-mean`` — on the inputs written here, rounded to 6 decimals. The inputs have what
the hand-computed tests single out: an empty response, tool tokens inside a response,
rollout IS weights, masked, truncated and kept tokens.
"""

from __future__ import annotations

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

T = torch.tensor

# ----------------------------------------------------------------------------- estimators

OTB_MASK = T([[1, 1, 1, 1], [1, 0, 1, 0], [1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]]).float()
OTB_REWARDS = T([[0, 0, 0, 1.0], [0, 0, 0.5, 0], [0, 0, 0, 0], [0, 0, 1.0, 0], [0, 0, 0, 0]])
OTB_OLD = T([[-0.1, -0.2, -0.3, -0.4], [-0.5, -0.6, -0.7, -0.8], [-0.9, -1.0, -1.1, -1.2],
             [-0.2, -0.4, -0.6, -0.8], [-1.0, -1.0, -1.0, -1.0]])  # fmt: skip
OTB_SPS = T([[0.9, 0.8, 0.7, 0.6], [0.5, 0.4, 0.5, 0.4], [0.3, 0.3, 0.3, 0.3],
             [0.8, 0.6, 0.5, 0.4], [0.5, 0.5, 0.5, 0.5]])  # fmt: skip
OTB_IS = T([[1.0, 1.5, 0.5, 1.0], [2.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0],
            [0.5, 0.5, 1.0, 2.0], [1.0, 1.0, 1.0, 1.0]])  # fmt: skip
OTB_GOLDEN = {
    ("optimal_token_baseline", False): [
        [0.729444, 0.806081, 1.0, 1.0], [0.229444, 0.0, -0.186257, 0.0],
        [-0.270556, -0.193919, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0],
    ],
    ("optimal_token_baseline", True): [
        [0.614942, 0.697416, 1.0, 1.0], [0.114942, 0.0, -0.117916, 0.0],
        [-0.385058, -0.302584, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0],
    ],
    ("tir_optimal_token_baseline", False): [
        [0.729444, 0.690262, 1.0, 1.0], [0.229444, 0.0, 0.190262, 0.0],
        [-0.270556, -0.309738, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0],
    ],
    ("tir_optimal_token_baseline", True): [
        [0.614942, 0.594105, 1.0, 1.0], [0.114942, 0.0, 0.094105, 0.0],
        [-0.385058, -0.405895, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0],
    ],
}  # fmt: skip


@pytest.mark.parametrize(("name", "with_is"), list(OTB_GOLDEN))
def test_optimal_token_baselines_match_verl(name: str, with_is: bool) -> None:
    inp = AdvantageInputs(
        OTB_REWARDS,
        OTB_MASK,
        [0, 0, 0, 1, 1],
        old_log_probs=OTB_OLD,
        sum_pi_squared=OTB_SPS,
        rollout_is_weights=OTB_IS if with_is else None,
    )
    adv, _ = compute_advantages(name, inp)
    torch.testing.assert_close(adv, T(OTB_GOLDEN[name, with_is]), atol=2e-6, rtol=0)


def test_gdpo_matches_verl() -> None:
    mask = T([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0], [1, 1, 0]]).float()
    comps = T([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.5, 0.0], [0.0, 0.0], [1.0, 0.5]])
    inp = AdvantageInputs(
        torch.zeros(6, 3), mask, ["a", "a", "a", "b", "b", "c"], reward_components=comps
    )
    adv, _ = compute_advantages("gdpo", inp, AdvantageParams(reward_weights=(1.0, 0.5)))
    golden = [
        [-0.456488, -0.456488, -0.456488], [-1.61449, -1.61449, 0.0], [0.701513, 0.0, 0.0],
        [0.489015, 0.489015, 0.489015], [0.0, 0.0, 0.0], [1.214944, 1.214944, 0.0],
    ]  # fmt: skip
    torch.testing.assert_close(adv, T(golden), atol=2e-6, rtol=0)


# ----------------------------------------------------------------------------- policy losses

LOGP = [[-0.2, -1.5, -3.0, -0.05], [-0.7, -2.5, -0.01, -1.0]]
OLD = T([[-0.5, -0.9, -4.5, -0.3], [-0.4, -3.5, -0.2, -1.0]])
ADV = T([[1.0, -0.5, 2.0, -1.5], [-1.0, 0.8, 1.2, 0.3]])
MASK = T([[1, 1, 1, 1], [1, 1, 1, 0]]).float()

LOSS_GOLDEN = {
    # name: (params, loss, d loss / d log π_θ, pg_clipfrac, pg_clipfrac_lower)
    "dppo_tv": (
        PolicyLossParams(clip_ratio=0.1, clip_ratio_c=3.0),
        3.334323,
        [[0.0, 0.0, -0.857143, 0.275148], [0.0, -0.310661, 0.0, 0.0]],
        0.571429,
        0.142857,
    ),
    "dppo_kl": (
        PolicyLossParams(clip_ratio=0.08, clip_ratio_c=3.0),
        3.260241,
        [[0.0, 0.0, -0.857143, 0.275148], [0.105831, -0.310661, 0.0, 0.0]],
        0.428571,
        0.142857,
    ),
    "dro": (
        PolicyLossParams(dro_beta=0.2),
        1.010837,
        [[-0.134286, 0.054286, -0.242857, 0.221429], [0.134286, -0.085714, -0.166, 0.0]],
        0.0,
        0.0,
    ),
}


@pytest.mark.parametrize("name", list(LOSS_GOLDEN))
def test_policy_losses_match_verl(name: str) -> None:
    params, loss_v, grad_v, clipfrac, lower = LOSS_GOLDEN[name]
    logp = T(LOGP, requires_grad=True)
    agg = LossAggregator.from_mask("token-mean", MASK)
    loss, m = compute_policy_loss(name, logp, OLD, ADV, MASK, params, agg)
    (grad,) = torch.autograd.grad(loss, logp)
    assert loss.item() == pytest.approx(loss_v, abs=2e-6)
    torch.testing.assert_close(grad, T(grad_v), atol=2e-6, rtol=0)
    assert m["pg_clipfrac"].item() == pytest.approx(clipfrac, abs=2e-6)
    assert m["pg_clipfrac_lower"].item() == pytest.approx(lower, abs=2e-6)
    assert m["ppo_kl"].item() == pytest.approx(-0.334286, abs=2e-6)  # verl's, all three
