"""PRIME's estimator math (temper.algorithms.prime): hand-computed values, invariances, and
numbers verl's own functions computed on the same tensors.

The ``VERL_*`` constants are the outputs of verl 38d9a88's ``recipe/prime`` functions
(``compute_rloo_advantage_return`` with ``verl_F.masked_whiten``,
``compute_ce_dpo_loss_rm``, ``compute_dpo_accuracy``, ``compute_dpo_abs_accuracy`` and
``DataParallelPRIMERewardModel.prime_norm``), run on the inputs below and rounded to 6
decimals.
"""

from __future__ import annotations

import math

import pytest
import torch

from temper.algorithms.prime import (
    accuracy_filter_order,
    implicit_q,
    implicit_token_rewards,
    pairwise_accuracy,
    prime_advantages,
    prime_batch_norm,
    prm_ce_loss,
    rloo_source,
    sign_accuracy,
)

T = torch.tensor


def close(t: torch.Tensor, expected: list[list[float]], atol: float = 1e-6) -> None:
    torch.testing.assert_close(t, T(expected, dtype=t.dtype), atol=atol, rtol=0)


# 2 prompts × n=3; responses of 4, 3, 2, 4, 1 and 3 tokens
MASK = T(
    [[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 0]]
).float()
RM = T([[0.1, -0.2, 0.3, 0.0], [0.2, 0.1, 0.0, 0.0], [-0.1, 0.4, 0.0, 0.0],
        [0.05, 0.05, -0.3, 0.2], [0.5, 0.0, 0.0, 0.0], [-0.2, 0.1, 0.1, 0.0]])  # fmt: skip
ACC = T([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
Q = T([[0.5, -1.0, 2.0, 0.0], [1.0, 1.0, 0.0, 0.0], [-2.0, 0.5, 0.0, 0.0],
       [0.0, 0.3, 0.3, -0.1], [4.0, 0.0, 0.0, 0.0], [-1.0, -1.0, 2.0, 0.0]])  # fmt: skip
VERL_ADV = [
    [0.416229, 0.416229, 0.931882, 0.588113], [-0.958844, -1.130728, -1.130728, 0.0],
    [0.931882, 1.27565, 0.0, 0.0], [-1.531791, -1.33126, -1.130728, -0.328602],
    [0.18705, 0.0, 0.0, 0.0], [0.473524, 1.103766, 1.218355, 0.0],
]  # fmt: skip
VERL_RET = [
    [1.0, 1.0, 3.25, 1.75], [-5.0, -5.75, -5.75, 0.0], [3.25, 4.75, 0.0, 0.0],
    [-7.5, -6.625, -5.75, -2.25], [0.0, 0.0, 0.0, 0.0], [1.25, 4.0, 4.5, 0.0],
]  # fmt: skip
VERL_NORM = [
    [0.2, -0.399999, 0.599999, 0.0], [0.399999, 0.2, 0.0, 0.0], [-0.2, 0.799998, 0.0, 0.0],
    [0.1, 0.1, -0.599999, 0.399999], [0.999998, 0.0, 0.0, 0.0], [-0.399999, 0.2, 0.2, 0.0],
]  # fmt: skip


def test_advantages_and_returns_match_verl() -> None:
    adv, ret = prime_advantages(RM, ACC, MASK, 3, dpo_coef=5.0, gt_coef=5.0)
    close(adv, VERL_ADV, 1e-5)
    close(ret, VERL_RET, 1e-5)


def test_ce_loss_accuracies_and_norm_match_verl() -> None:
    assert prm_ce_loss(Q, ACC, MASK, 0.05).item() == pytest.approx(0.721518, abs=1e-6)
    seq = (Q * MASK).sum(-1)
    assert pairwise_accuracy(seq, ACC, 3).item() == pytest.approx(0.0)
    assert sign_accuracy(seq, ACC).item() == pytest.approx(0.166667, abs=1e-6)
    close(prime_batch_norm(RM), VERL_NORM)


# --------------------------------------------------------------------- hand-computed


def test_rloo_of_a_one_token_source_is_reward_minus_the_others_mean() -> None:
    rewards = T([[0.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    mask = T([[0.0, 1.0], [0.0, 1.0], [0.0, 1.0]])
    out = rloo_source(rewards, mask, 3)
    # 1 − (0 + 0)/2, 0 − (1 + 0)/2, 0 − (1 + 0)/2
    close(out, [[0.0, 1.0], [0.0, -0.5], [0.0, -0.5]])


def test_rloo_of_a_token_source_uses_each_samples_mean() -> None:
    # means 2 and 2: baseline (2 + 2)/(2 − 1) = 4; each token r·2 − 4
    out = rloo_source(T([[1.0, 3.0], [2.0, 9.0]]), T([[1.0, 1.0], [1.0, 0.0]]), 2)
    close(out, [[-2.0, 2.0], [0.0, 0.0]])


def test_rloo_of_equal_rewards_is_zero_and_needs_two_samples() -> None:
    out = rloo_source(torch.full((4, 3), 0.7), torch.ones(4, 3), 2)
    assert out.abs().max().item() == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="at least 2"):
        rloo_source(torch.ones(2, 2), torch.ones(2, 2), 1)


def test_outcome_only_advantages_are_whitened_returns() -> None:
    mask = torch.ones(2, 2)
    adv, ret = prime_advantages(None, T([1.0, 0.0]), mask, 2, dpo_coef=5.0, gt_coef=1.0)
    # RLOO at the last token: +1, −1; returns-to-go: [1, 1], [−1, −1]
    close(ret, [[1.0, 1.0], [-1.0, -1.0]])
    # mean 0, unbiased variance 4/3: ±1/√(4/3)
    s = 1 / math.sqrt(4 / 3)
    close(adv, [[s, s], [-s, -s]])


def test_a_zero_coefficient_leaves_its_source_out() -> None:
    with_rm, _ = prime_advantages(RM, ACC, MASK, 3, dpo_coef=0.0, gt_coef=5.0)
    without, _ = prime_advantages(None, ACC, MASK, 3, dpo_coef=5.0, gt_coef=5.0)
    assert torch.allclose(with_rm, without)


def test_token_rewards_by_granularity() -> None:
    q = implicit_q(T([[1.0, 2.0, 3.0, 9.0]]), T([[0.0, 0.0, 0.0, 1.0]]), T([[1, 1, 1, 0]]))
    assert q.tolist() == [[1.0, 2.0, 3.0, 0.0]]  # masked past the response
    mask = T([[1, 1, 1, 0]])
    # token: β·q at every token but the last (t < L − 1 = 2)
    assert implicit_token_rewards(q, mask, 0.5, "token").tolist() == [[0.5, 1.0, 0.0, 0.0]]
    # whole: Σ β·q at the last token
    assert implicit_token_rewards(q, mask, 0.5, "whole").tolist() == [[0.0, 0.0, 3.0, 0.0]]
    with pytest.raises(ValueError, match="granularity"):
        implicit_token_rewards(q, mask, 0.5, "step")  # type: ignore[arg-type]


def test_batch_norm_bounds_every_return_to_go_by_one() -> None:
    scores = T([[1.0, -2.0], [0.5, 0.5]])  # returns-to-go [−1, −2], [1, 0.5]: max |·| 2
    close(prime_batch_norm(scores), [[0.5, -1.0], [0.25, 0.25]])


def test_ce_loss_by_hand() -> None:
    mask = torch.ones(1, 2)
    assert prm_ce_loss(torch.zeros(1, 2), T([1.0]), mask, 0.05).item() == pytest.approx(math.log(2))
    q = T([[math.log(3) / 2, math.log(3) / 2]])  # β·Σq = ln 3 → σ = 3/4
    assert prm_ce_loss(q, T([1.0]), mask, 1.0).item() == pytest.approx(-math.log(0.75))
    assert prm_ce_loss(q, T([0.0]), mask, 1.0).item() == pytest.approx(-math.log(0.25))


def test_filter_prefers_mid_accuracy_untruncated_groups_in_draw_order() -> None:
    acc = T([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0])  # group means 1, .5, 0, .5
    lengths = T([3, 5, 2, 2, 4, 4, 1, 6])
    order, passed = accuracy_filter_order(acc, lengths, 2, 0.2, 0.8, None)
    assert passed.tolist() == [False, True, False, True]
    assert order.tolist() == [1, 3, 0, 2]
    # truncation: a group whose longest response reaches max_response_length − 1 = 5
    order, passed = accuracy_filter_order(acc, lengths, 2, None, None, 6)
    assert passed.tolist() == [False, True, True, False]
    assert order.tolist() == [1, 2, 0, 3]


def test_pairwise_accuracy_weights_pairs_by_their_outcome_gap() -> None:
    acc = T([1.0, 0.0, 0.5])
    assert pairwise_accuracy(T([3.0, 1.0, 2.0]), acc, 3).item() == pytest.approx(1.0)
    # pair (1, 2) ranked wrong, weight 0.5 of 2
    assert pairwise_accuracy(T([3.0, 2.0, 1.0]), acc, 3).item() == pytest.approx(0.75)
    assert pairwise_accuracy(T([3.0, 2.0]), T([1.0, 1.0]), 2).item() == pytest.approx(0.5)
