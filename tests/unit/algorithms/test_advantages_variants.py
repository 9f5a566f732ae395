"""GDPO and the optimal token baseline against hand-computed values (arithmetic in the
comments). Conventions as ``test_advantages.py``."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from temper.algorithms import AdvantageInputs, AdvantageParams, compute_advantages

T = torch.tensor
E = 1e-6  # the estimators' ε after the group std
# a group of two: unbiased std of [x, y] is |x - y|/√2, so (x - mean)/std = ±(1/2)·√2
K = 0.5 / (1 / math.sqrt(2) + E)


def prefix(lengths: list[int], width: int) -> torch.Tensor:
    mask = torch.zeros(len(lengths), width)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return mask


def whiten(tokens: list[float]) -> list[float]:
    """``(x - mean)/sqrt(var + 1e-8)`` with the unbiased variance, as masked_whiten."""
    mu, var = statistics.mean(tokens), statistics.variance(tokens)
    return [(x - mu) / math.sqrt(var + 1e-8) for x in tokens]


# ----------------------------------------------------------------------------- gdpo


def gdpo_case() -> AdvantageInputs:
    # components (accuracy, format); rows 0-1 group "a", rows 2-3 group "b", row 4 alone
    comps = T([[1.0, 1.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0], [0.5, 1.0]])
    mask = prefix([2, 1, 2, 2, 1], width=2)
    rewards = torch.zeros(5, 2)  # not read by gdpo (the components replace it)
    return AdvantageInputs(rewards, mask, ["a", "a", "b", "b", "c"], reward_components=comps)


def test_gdpo_normalizes_each_component_then_whitens() -> None:
    inp = gdpo_case()
    adv, ret = compute_advantages("gdpo", inp, AdvantageParams(reward_weights=(1.0, 0.5)))
    # step 1, per component and group (two rows: ±K; equal values: 0; singleton: x/(1+ε)):
    #   a: accuracy [1, 0] -> [K, -K]; format [1, 1] -> [0, 0]
    #   b: accuracy [1, 0] -> [K, -K]; format [0, 1] -> [-K, K]
    #   c: accuracy 0.5/(1+ε), format 1/(1+ε)
    # step 2, weights (1, 0.5): s = [K, -K, K - K/2, -K + K/2, (0.5 + 0.5)/(1+ε)]
    s = [K, -K, K / 2, -K / 2, 1 / (1 + E)]
    # step 3, whitened over the 8 valid tokens (lengths 2, 1, 2, 2, 1)
    tokens = [s[0], s[0], s[1], s[2], s[2], s[3], s[3], s[4]]
    w = whiten(tokens)
    expected = T([[w[0], w[1]], [w[2], 0.0], [w[3], w[4]], [w[5], w[6]], [w[7], 0.0]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected)
    # the numbers: K = 0.707106, s = [0.707106, -0.707106, 0.353553, -0.353553, 0.999999];
    # token sum 2K - K + 0.999999 = 1.707105, mean 0.213388; unbiased std 0.613621
    # -> row 0: (0.707106 - 0.213388)/0.613621 = 0.804597
    assert adv[0, 0].item() == pytest.approx(0.804597, rel=1e-5)


def test_gdpo_default_weights_and_dr_grpo_form() -> None:
    inp = gdpo_case()
    adv, _ = compute_advantages("gdpo", inp, AdvantageParams(norm_adv_by_std_in_grpo=False))
    # no std division: a = x - mean. a: [0.5, -0.5] + [0, 0]; b: [0.5, -0.5] + [-0.5, 0.5];
    # c (mean 0): 0.5 + 1. Weights 1: s = [0.5, -0.5, 0, 0, 1.5]
    s = [0.5, -0.5, 0.0, 0.0, 1.5]
    w = whiten([s[0], s[0], s[1], s[2], s[2], s[3], s[3], s[4]])
    torch.testing.assert_close(
        adv, T([[w[0], w[1]], [w[2], 0], [w[3], w[4]], [w[5], w[6]], [w[7], 0]])
    )


def test_gdpo_separates_what_the_summed_reward_collapses() -> None:
    """GDPO's motivation (arXiv:2601.05242): GRPO on the summed reward gives the same
    advantage to (1, 1) against (0, 0) as to (1, 0) against (0, 0) — both groups' sums
    [2, 0] and [1, 0] normalize to ±K. GDPO normalizes each component: 2K vs K."""
    comps = T([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    inp = AdvantageInputs(torch.zeros(4, 1), torch.ones(4, 1), [0, 0, 1, 1])
    grpo, _ = compute_advantages(
        "grpo", AdvantageInputs(comps.sum(-1, keepdim=True), inp.response_mask, [0, 0, 1, 1])
    )
    torch.testing.assert_close(grpo[:, 0], T([K, -K, K, -K]))
    inp.reward_components = comps
    adv, _ = compute_advantages("gdpo", inp)
    # group 0: accuracy [1, 0] -> ±K, format [1, 0] -> ±K: s = [2K, -2K]
    # group 1: accuracy [1, 0] -> ±K, format [0, 0] -> 0:  s = [K, -K]
    # whitening (mean 0, unbiased var (8K² + 2K²)/3): [2, -2, 1, -1]·K/sqrt(10K²/3 + 1e-8)
    torch.testing.assert_close(adv[:, 0], T(whiten([2 * K, -2 * K, K, -K])))
    assert adv[0, 0].item() == pytest.approx(2 * adv[2, 0].item(), rel=1e-6)


def test_gdpo_empty_row_counts_in_its_group() -> None:
    # group a: row 0 (2 tokens) and an empty row 1; group b: rows 2, 3 (one token each)
    comps = T([[1.0], [0.0], [0.0], [1.0]])
    mask = prefix([2, 0, 1, 1], width=2)
    inp = AdvantageInputs(torch.zeros(4, 2), mask, ["a", "a", "b", "b"], reward_components=comps)
    adv, _ = compute_advantages("gdpo", inp)
    # a: [1, 0] -> [K, -K] (the empty row's 0 is in the statistics); b: [0, 1] -> [-K, K]
    # valid tokens [K, K, -K, K]: mean K/2, unbiased var = K²(3·1/4 + 9/4)/3 = K²
    # -> [0.5, 0.5, -1.5, 0.5]·K/sqrt(K² + 1e-8)
    f = K / math.sqrt(K * K + 1e-8)
    torch.testing.assert_close(adv, T([[0.5 * f, 0.5 * f], [0, 0], [-1.5 * f, 0], [0.5 * f, 0]]))


def test_gdpo_needs_components_and_matching_weights() -> None:
    inp = gdpo_case()
    with pytest.raises(ValueError, match="2 reward components but 3 reward weights"):
        compute_advantages("gdpo", inp, AdvantageParams(reward_weights=(1.0, 1.0, 1.0)))
    with pytest.raises(ValueError, match="reward_components"):
        compute_advantages("gdpo", AdvantageInputs(torch.zeros(1, 1), torch.ones(1, 1), [0]))


# ----------------------------------------------------------------------------- optimal token baseline

LN = math.log


def otb_inputs(
    pis: list[list[float]], sums: list[list[float]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``old_log_probs = log π`` and ``sum_pi_squared``; ``w = 1 - 2π + Σπ²``."""
    return T([[LN(p) for p in row] for row in pis]), T(sums)


def otb_case() -> AdvantageInputs:
    # w per token from (π, Σπ²): (0.5, 0.5) -> 0.5; (0.25, 0.25) -> 0.75; (1, 1) -> 0
    old, sums = otb_inputs(
        [
            [0.5, 0.5, 0.5],  # row 0: w = [0.5, 0.5, 0.5]
            [0.25, 0.25, 0.5],  # row 1: w = [0.75, 0.75, (padding)]
            [0.5, 1.0, 0.5],  # row 2: w = [0.5, 0, (padding)]
            [0.5, 0.5, 0.5],  # row 3 (alone in its group)
            [0.5, 0.5, 0.5],  # row 4, with the empty row 5
            [0.5, 0.5, 0.5],  # row 5 (empty)
        ],
        [
            [0.5, 0.5, 0.5],
            [0.25, 0.25, 0.5],
            [0.5, 1.0, 0.5],
            [0.5, 0.5, 0.5],
            [0.5, 0.5, 0.5],
            [0.5, 0.5, 0.5],
        ],
    )
    rewards = T(
        [
            [0.0, 0.0, 1.0],
            [0.0, 0.0, 0.0],
            [0.0, 1.0, 0.0],
            [0.0, 2.0, 0.0],
            [0.0, 3.0, 0.0],
            [0.0, 0.0, 0.0],
        ]
    )
    mask = prefix([3, 2, 2, 2, 2, 0], width=3)
    return AdvantageInputs(
        rewards, mask, ["g", "g", "g", "s", "e", "e"], old_log_probs=old, sum_pi_squared=sums
    )


@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_otb_hand_values(name: str) -> None:
    adv, ret = compute_advantages(name, otb_case())
    # group g: G (reward-to-go) and W (cumulative w):
    #   row 0: G = [1, 1, 1], W = [0.5, 1, 1.5];  row 1: G = [0, 0], W = [0.75, 1.5]
    #   row 2: G = [1, 1],    W = [0.5, 0.5]
    # t=0: B = (1·0.5 + 0·0.75 + 1·0.5)/(0.5 + 0.75 + 0.5) = 1/1.75 = 4/7
    # t=1: B = (1·1 + 0·1.5 + 1·0.5)/(1 + 1.5 + 0.5) = 1.5/3 = 0.5
    # t=2: row 0 alone (lengths 3, 2, 2): zero tail from the second-longest length 2 -> B = 0
    # group s (one response): B = 0 -> A = G = [2, 2]
    # group e: row 4 and an empty row 5 -> row 4 alone past position 0 -> A = G = [3, 3]
    expected = T(
        [
            [3 / 7, 0.5, 1.0],
            [-4 / 7, -0.5, 0.0],
            [3 / 7, 0.5, 0.0],
            [2.0, 2.0, 0.0],
            [3.0, 3.0, 0.0],
            [0.0, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(
        ret, T([[1.0, 1, 1], [0, 0, 0], [1, 1, 0], [2, 2, 0], [3, 3, 0], [0, 0, 0]])
    )


def test_otb_without_path_variance_has_no_baseline() -> None:
    # deterministic tokens (π = 1, Σπ² = 1): w = 1 - 2 + 1 = 0, so W = 0 and
    # B = 0/(0 + 1e-8) = 0: the advantage is the return itself
    old, sums = otb_inputs([[1.0], [1.0]], [[1.0], [1.0]])
    inp = AdvantageInputs(
        T([[1.0], [0.0]]), torch.ones(2, 1), [0, 0], old_log_probs=old, sum_pi_squared=sums
    )
    adv, _ = compute_advantages("optimal_token_baseline", inp)
    torch.testing.assert_close(adv, T([[1.0], [0.0]]))


def test_otb_equal_longest_responses_keep_their_baseline() -> None:
    # lengths 2, 2, 1: no single longest response, so no zero tail. w = 0.5 everywhere.
    old, sums = otb_inputs([[0.5, 0.5]] * 3, [[0.5, 0.5]] * 3)
    rewards = T([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    inp = AdvantageInputs(
        rewards, prefix([2, 2, 1], 2), [0, 0, 0], old_log_probs=old, sum_pi_squared=sums
    )
    adv, _ = compute_advantages("optimal_token_baseline", inp)
    # t=0: G = [1, 0, 1], W = 0.5 each -> B = 2/3; t=1: rows 0, 1: G = [1, 0], W = 1 -> B = 1/2
    torch.testing.assert_close(adv, T([[1 / 3, 0.5], [-2 / 3, -0.5], [1 / 3, 0.0]]))


def test_otb_rollout_is_weights_scale_the_path_weights() -> None:
    old, sums = otb_inputs([[0.5], [0.5]], [[0.5], [0.5]])  # w = 0.5
    inp = AdvantageInputs(
        T([[1.0], [0.0]]),
        torch.ones(2, 1),
        [0, 0],
        old_log_probs=old,
        sum_pi_squared=sums,
        rollout_is_weights=T([[2.0], [1.0]]),
    )
    adv, _ = compute_advantages("optimal_token_baseline", inp)
    # w·ρ² = [2, 0.5] -> B = (1·2 + 0·0.5)/2.5 = 0.8 -> A = [0.2, -0.8]
    torch.testing.assert_close(adv, T([[0.2], [-0.8]]))


def tool_case() -> AdvantageInputs:
    # row 0 has a tool-output token (masked) at position 1; its π and Σπ² are ignored
    old, sums = otb_inputs([[0.5, 0.1, 0.5, 0.5], [0.25, 0.25, 0.5, 0.5]],
                           [[0.5, 0.9, 0.5, 0.5], [0.25, 0.25, 0.5, 0.5]])  # fmt: skip
    rewards = T([[0.0, 7.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    mask = T([[1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
    return AdvantageInputs(rewards, mask, [0, 0], old_log_probs=old, sum_pi_squared=sums)


def test_tir_otb_aligns_by_valid_token() -> None:
    adv, ret = compute_advantages("tir_optimal_token_baseline", tool_case())
    # valid tokens: row 0 at positions 0, 2, 3: G = [1, 1, 1], W = [0.5, 1, 1.5]
    #               row 1 at positions 0, 1:    G = [0, 0],    W = [0.75, 1.5]
    # k=0: B = (1·0.5)/(0.5 + 0.75) = 0.4; k=1: B = (1·1)/(1 + 1.5) = 0.4
    # k=2: row 0 alone (3 > 2 valid tokens): zero tail -> B = 0
    torch.testing.assert_close(adv, T([[0.6, 0.0, 0.6, 1.0], [-0.4, -0.4, 0.0, 0.0]]))
    torch.testing.assert_close(ret, T([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]))


def test_position_aligned_otb_on_tool_responses() -> None:
    adv, _ = compute_advantages("optimal_token_baseline", tool_case())
    # by position: t=0 as above, B = 0.4; t=1: only row 1 is valid there (G 0, W 1.5) -> B = 0;
    # t >= 2 (the second-longest length, 2 valid tokens): row 0's zero tail -> B = 0
    torch.testing.assert_close(adv, T([[0.6, 0.0, 1.0, 1.0], [-0.4, 0.0, 0.0, 0.0]]))


def test_tir_otb_leaves_empty_responses_out_of_the_group() -> None:
    old, sums = otb_inputs([[0.5, 0.5]] * 3, [[0.5, 0.5]] * 3)
    rewards = T([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    mask = prefix([2, 0, 0], 2)
    inp = AdvantageInputs(rewards, mask, [0, 0, 0], old_log_probs=old, sum_pi_squared=sums)
    adv, _ = compute_advantages("tir_optimal_token_baseline", inp)
    # one non-empty response: a group of one -> B = 0, A = G = [1, 1]
    torch.testing.assert_close(adv, T([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]]))


@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_otb_needs_the_actor_statistics(name: str) -> None:
    with pytest.raises(ValueError, match="sum_pi_squared"):
        compute_advantages(name, AdvantageInputs(torch.zeros(1, 1), torch.ones(1, 1), [0]))
