"""Preference losses against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from temper.algorithms import PREFERENCE_LOSSES, PreferenceParams, preference_loss
from temper.algorithms.preference import sequence_log_probs
from temper.registry import UnknownNameError

# one pair: policy chosen/rejected -3 / -5, reference -4 / -4 → h = (1) − (−1) = 2
PAIR = [torch.tensor([x]) for x in (-3.0, -5.0, -4.0, -4.0)]


def test_sequence_log_probs_sum_response_tokens_only() -> None:
    lp = torch.tensor([[-1.0, -2.0, -4.0], [-0.5, -0.5, -9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert sequence_log_probs(lp, mask).tolist() == [-3.0, -10.0]


def test_sigmoid_is_minus_log_sigmoid_of_beta_h() -> None:
    loss, m = preference_loss("sigmoid", *PAIR, PreferenceParams(beta=0.5))
    # −log σ(0.5·2) = log(1 + e^−1)
    assert loss.item() == pytest.approx(math.log1p(math.exp(-1.0)))
    assert m["rewards/chosen"].item() == pytest.approx(0.5)  # 0.5·(−3 − −4)
    assert m["rewards/rejected"].item() == pytest.approx(-0.5)
    assert m["rewards/margin"].item() == pytest.approx(1.0)
    assert m["rewards/accuracy"].item() == 1.0
    assert m["logps/chosen"].item() == -3.0 and m["logps/rejected"].item() == -5.0


def test_label_smoothing_mixes_the_flipped_label() -> None:
    loss, _ = preference_loss("sigmoid", *PAIR, PreferenceParams(beta=0.5, label_smoothing=0.2))
    expected = 0.8 * math.log1p(math.exp(-1.0)) + 0.2 * math.log1p(math.exp(1.0))
    assert loss.item() == pytest.approx(expected)


def test_ipo_is_squared_distance_to_half_inverse_beta() -> None:
    loss, _ = preference_loss("ipo", *PAIR, PreferenceParams(beta=0.1))
    assert loss.item() == pytest.approx((2.0 - 5.0) ** 2)


def test_mean_over_pairs_and_accuracy_counts_pairs() -> None:
    chosen = torch.tensor([-3.0, -6.0])
    rejected = torch.tensor([-5.0, -4.0])
    ref = torch.tensor([-4.0, -4.0])
    loss, m = preference_loss("sigmoid", chosen, rejected, ref, ref, PreferenceParams(beta=1.0))
    # h = 2 and −2
    expected = (math.log1p(math.exp(-2.0)) + math.log1p(math.exp(2.0))) / 2
    assert loss.item() == pytest.approx(expected)
    assert m["rewards/accuracy"].item() == 0.5


def test_gradient_pushes_chosen_up_and_rejected_down() -> None:
    chosen = torch.tensor([-3.0], requires_grad=True)
    rejected = torch.tensor([-5.0], requires_grad=True)
    loss, _ = preference_loss(
        "sigmoid", chosen, rejected, PAIR[2], PAIR[3], PreferenceParams(beta=0.5)
    )
    loss.backward()
    # dL/dπ_c = −β·σ(−β·h) = −0.5·σ(−1)
    assert chosen.grad is not None and rejected.grad is not None
    assert chosen.grad.item() == pytest.approx(-0.5 / (1 + math.e))
    assert rejected.grad.item() == pytest.approx(0.5 / (1 + math.e))


def test_unknown_loss_names_the_valid_ones() -> None:
    with pytest.raises(UnknownNameError, match="ipo"):
        PREFERENCE_LOSSES.get("hinge_typo")


@pytest.mark.parametrize("kwargs", [{"beta": 0.0}, {"label_smoothing": 0.5}])
def test_params_refuse_out_of_range(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        PreferenceParams(**kwargs)


# --------------------------------------------------------------- online pairs (spin)


def test_online_pairs_by_hand():
    """Rows 2i, 2i+1 form pair i; the higher score first; a tie keeps the first row."""
    from temper.algorithms.preference import online_pairs

    scores = torch.tensor([0.0, 1.0, 0.7, 0.2, 0.5, 0.5, -1.0, 3.0])
    assert online_pairs(scores).tolist() == [1, 0, 2, 3, 4, 5, 7, 6]


def test_online_pairs_refuse_an_odd_count():
    from temper.algorithms.preference import online_pairs

    with pytest.raises(ValueError, match="even number"):
        online_pairs(torch.tensor([1.0, 2.0, 3.0]))
