"""Rejection sampling on the rollout/train mismatch against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from temper.algorithms import RejectionFilter, rollout_rejection_mask
from temper.algorithms.rollout_correction import batch_normalized

T = torch.tensor
ln = math.log


def logs(values: list[list[float]]) -> torch.Tensor:
    """log of probabilities (or ratios) given by hand; 1.0 for padding."""
    return T([[ln(v) for v in row] for row in values])


def test_token_ratio_bounds() -> None:
    # rho = pi_old/pi_rollout = [1.1, 1.5, 0.5, (pad)]; keep 0.8 <= rho <= 1.2
    old = logs([[0.55, 0.75, 0.25, 0.9]])
    rollout = logs([[0.5, 0.5, 0.5, 0.3]])
    mask = T([[1.0, 1.0, 1.0, 0.0]])
    keep, m = rollout_rejection_mask(
        old, rollout, mask, [RejectionFilter("ratio", "token", 0.8, 1.2)]
    )
    assert (keep * mask).tolist() == [[1.0, 0.0, 0.0, 0.0]]
    assert keep.dtype == mask.dtype
    assert m["rollout_rs_masked_fraction"].item() == pytest.approx(2 / 3)  # 2 of 3 valid
    assert m["rollout_rs_seq_masked_fraction"].item() == 1.0
    assert m["rollout_rs_0_masked_fraction"].item() == pytest.approx(2 / 3)


def test_sequence_levels_reject_whole_sequences() -> None:
    # seq 0: rho = [2, 0.5, 1.5]; seq 1: rho = [1.1, 1.1, pad]
    rollout = logs([[0.25, 0.5, 0.4], [0.5, 0.5, 0.5]])
    old = logs([[0.5, 0.25, 0.6], [0.55, 0.55, 0.5]])
    mask = T([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])

    def kept(f: RejectionFilter) -> list[list[float]]:
        keep, _ = rollout_rejection_mask(old, rollout, mask, [f])
        return (keep * mask).tolist()

    # product: seq 0 = 2*0.5*1.5 = 1.5 > 1.3 (out); seq 1 = 1.21 (in)
    assert kept(RejectionFilter("ratio", "sequence_sum", None, 1.3)) == [[0.0] * 3, [1, 1, 0]]
    # geometric mean: seq 0 = 1.5^(1/3) = 1.1447 > 1.12 (out); seq 1 = 1.1 (in)
    assert kept(RejectionFilter("ratio", "sequence_mean", None, 1.12)) == [[0.0] * 3, [1, 1, 0]]
    # and 1.1447 >= 1.13 keeps seq 0 while 1.1 < 1.13 drops seq 1
    assert kept(RejectionFilter("ratio", "sequence_mean", 1.13, None)) == [[1.0] * 3, [0, 0, 0]]
    # max k2: seq 0 = (ln 2)^2/2 = 0.2402 > 0.1; seq 1 = (ln 1.1)^2/2 = 0.00454
    assert kept(RejectionFilter("k2", "sequence_max", None, 0.1)) == [[0.0] * 3, [1, 1, 0]]
    # sum k2: seq 0 = (0.4805 + 0.4805 + 0.1644)/2 = 0.5627; seq 1 = 0.00908; 0.5 drops seq 0
    assert kept(RejectionFilter("k2", "sequence_sum", None, 0.5)) == [[0.0] * 3, [1, 1, 0]]
    _, m = rollout_rejection_mask(
        old, rollout, mask, [RejectionFilter("k2", "sequence_sum", None, 0.5)]
    )
    assert m["rollout_rs_masked_fraction"].item() == pytest.approx(3 / 5)
    assert m["rollout_rs_seq_masked_fraction"].item() == pytest.approx(1 / 2)


def test_k3_token_and_sequence_mean() -> None:
    # rho = [2, 0.5, 1.5]: k3 = rho - 1 - ln rho = [0.3069, 0.1931, 0.0945]
    rollout = logs([[0.25, 0.5, 0.4]])
    old = logs([[0.5, 0.25, 0.6]])
    mask = torch.ones(1, 3)
    keep, _ = rollout_rejection_mask(
        old, rollout, mask, [RejectionFilter("k3", "token", None, 0.15)]
    )
    assert keep.tolist() == [[0.0, 0.0, 1.0]]
    # mean = 0.5945/3 = 0.19817: kept under 0.2, dropped under 0.19
    keep, _ = rollout_rejection_mask(
        old, rollout, mask, [RejectionFilter("k3", "sequence_mean", None, 0.2)]
    )
    assert keep.tolist() == [[1.0, 1.0, 1.0]]
    keep, _ = rollout_rejection_mask(
        old, rollout, mask, [RejectionFilter("k3", "sequence_mean", None, 0.19)]
    )
    assert keep.tolist() == [[0.0, 0.0, 0.0]]


def test_prob_diff_and_filters_combine() -> None:
    # pi_old = [0.5, 0.3, 0.6], pi_rollout = [0.2, 0.35, 0.58]: diff = [0.3, -0.05, 0.02]
    # rho = [2.5, 0.857, 1.0345]
    old = logs([[0.5, 0.3, 0.6]])
    rollout = logs([[0.2, 0.35, 0.58]])
    mask = torch.ones(1, 3)
    diff = RejectionFilter("prob_diff", "token", -0.1, 0.1)
    ratio = RejectionFilter("ratio", "token", 0.9, 1.1)
    keep, m = rollout_rejection_mask(old, rollout, mask, [diff])
    assert keep.tolist() == [[0.0, 1.0, 1.0]]
    keep, m = rollout_rejection_mask(old, rollout, mask, [diff, ratio])  # and 0.857 < 0.9
    assert keep.tolist() == [[0.0, 0.0, 1.0]]
    assert m["rollout_rs_0_masked_fraction"].item() == pytest.approx(1 / 3)
    assert m["rollout_rs_1_masked_fraction"].item() == pytest.approx(2 / 3)
    assert m["rollout_rs_masked_fraction"].item() == pytest.approx(2 / 3)
    # sequence sum of diff = 0.27 > 0.2: the whole sequence goes
    keep, _ = rollout_rejection_mask(
        old, rollout, mask, [RejectionFilter("prob_diff", "sequence_sum", -0.2, 0.2)]
    )
    assert keep.tolist() == [[0.0, 0.0, 0.0]]


def test_segment_mean_is_per_turn() -> None:
    # two turns [0, 1] and [3, 4] around an observation token (mask 0)
    # turn 1: rho = [2, 0.5] -> geometric mean 1 (kept); turn 2: rho = [1.5, 1.5] -> 1.5 (out)
    rollout = logs([[0.25, 0.5, 0.5, 0.4, 0.4]])
    old = logs([[0.5, 0.25, 0.9, 0.6, 0.6]])
    mask = T([[1.0, 1.0, 0.0, 1.0, 1.0]])
    keep, m = rollout_rejection_mask(
        old, rollout, mask, [RejectionFilter("ratio", "segment_mean", 0.8, 1.2)]
    )
    assert (keep * mask).tolist() == [[1.0, 1.0, 0.0, 0.0, 0.0]]
    assert m["rollout_rs_masked_fraction"].item() == pytest.approx(2 / 4)
    # a sequence-level geometric mean would be (2*0.5*1.5*1.5)^(1/4) = 1.2247: all out
    keep, _ = rollout_rejection_mask(
        old, rollout, mask, [RejectionFilter("ratio", "sequence_mean", 0.8, 1.2)]
    )
    assert (keep * mask).tolist() == [[0.0] * 5]


def test_no_valid_token_and_nan() -> None:
    old = T([[0.0, float("nan")]])
    rollout = torch.zeros(1, 2)
    keep, m = rollout_rejection_mask(
        old, rollout, T([[0.0, 1.0]]), [RejectionFilter("ratio", "token", 0.5, 2.0)]
    )
    assert keep.tolist() == [[1.0, 0.0]]  # NaN fails its bounds
    keep, m = rollout_rejection_mask(
        old[:, :1], rollout[:, :1], T([[0.0]]), [RejectionFilter("ratio", "sequence_max", 0.5, 2.0)]
    )
    assert m["rollout_rs_masked_fraction"].item() == 0.0
    assert m["rollout_rs_seq_masked_fraction"].item() == 0.0


def test_segment_importance_weights_are_per_turn() -> None:
    from temper.algorithms import rollout_is_weights

    # turns [0, 1] and [3]: rho = [2, 0.5] -> geometric mean 1; rho = [1.5] -> 1.5
    rollout = logs([[0.25, 0.5, 0.5, 0.4]])
    old = logs([[0.5, 0.25, 0.9, 0.6]])
    mask = T([[1.0, 1.0, 0.0, 1.0]])
    w, _, m = rollout_is_weights(old, rollout, mask, level="segment", threshold=1.2)
    # truncated at 1.2: [1, 1, 0 (masked), 1.2]; 1 of 3 valid tokens truncated
    torch.testing.assert_close(w, T([[1.0, 1.0, 0.0, 1.2]]))
    assert m["rollout_is_clipfrac"].item() == pytest.approx(1 / 3)
    # batch normalize divides by the token mean (1 + 1 + 1.2)/3
    w, _ = batch_normalized(w, mask, "segment")
    torch.testing.assert_close(w, T([[1.0, 1.0, 0.0, 1.2]]) / (3.2 / 3))
