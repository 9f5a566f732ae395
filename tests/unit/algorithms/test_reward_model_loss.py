"""Reward-model pair losses against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from temper.algorithms import REGISTRIES, check_name
from temper.algorithms.reward_model import (
    REWARD_MODEL_LOSSES,
    RewardLossParams,
    bradley_terry_loss,
    score_pair_metrics,
)


def test_bradley_terry_is_minus_log_sigmoid_of_the_score_difference() -> None:
    chosen = torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64)
    rejected = torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64)
    loss = bradley_terry_loss(chosen, rejected, RewardLossParams())
    # −log σ(1) = log(1 + e^−1); −log σ(0) = log 2; −log σ(−2) = log(1 + e^2)
    expected = [math.log(1 + math.exp(-1)), math.log(2), math.log(1 + math.exp(2))]
    assert loss.tolist() == pytest.approx(expected, rel=1e-12)
    assert loss.tolist() == pytest.approx([0.313261687518, 0.693147180560, 2.126928011043])


def test_centring_adds_c_times_the_squared_score_sum() -> None:
    chosen = torch.tensor([2.0, 0.5], dtype=torch.float64)
    rejected = torch.tensor([1.0, -0.5], dtype=torch.float64)
    loss = bradley_terry_loss(chosen, rejected, RewardLossParams(center_coef=0.1))
    # pair 1: log(1 + e^−1) + 0.1·3² = 0.313262 + 0.9; pair 2: log(1 + e^−1) + 0.1·0²
    assert loss.tolist() == pytest.approx([1.213261687518, 0.313261687518], rel=1e-12)


def test_the_loss_sees_only_score_differences_without_centring() -> None:
    """A common offset of both scores (what a head bias would add) changes nothing."""
    chosen, rejected = torch.tensor([0.3, -2.0]), torch.tensor([0.1, 1.0])
    p = RewardLossParams()
    shifted = bradley_terry_loss(chosen + 5.0, rejected + 5.0, p)
    torch.testing.assert_close(shifted, bradley_terry_loss(chosen, rejected, p))


def test_gradient_is_minus_sigmoid_of_minus_the_difference() -> None:
    """∂L/∂r_c = −σ(r_r − r_c) = −∂L/∂r_r."""
    chosen = torch.tensor([0.7], dtype=torch.float64, requires_grad=True)
    rejected = torch.tensor([-0.2], dtype=torch.float64, requires_grad=True)
    bradley_terry_loss(chosen, rejected, RewardLossParams()).sum().backward()
    assert chosen.grad is not None and rejected.grad is not None
    expected = -1.0 / (1.0 + math.exp(0.9))
    assert float(chosen.grad) == pytest.approx(expected, rel=1e-12)
    assert float(rejected.grad) == pytest.approx(-expected, rel=1e-12)


def test_pair_metrics() -> None:
    m = score_pair_metrics(torch.tensor([1.0, -1.0]), torch.tensor([0.5, 2.0]))
    assert m["rewards/margin"].tolist() == [0.5, -3.0]
    assert m["rewards/accuracy"].tolist() == [1.0, 0.0]
    assert m["rewards/chosen"].tolist() == [1.0, -1.0]
    assert m["rewards/rejected"].tolist() == [0.5, 2.0]


def test_registry_names_and_refusals() -> None:
    assert REGISTRIES["reward_model_loss"] is REWARD_MODEL_LOSSES
    assert check_name("reward_model_loss", "bt") == "bradley_terry"
    with pytest.raises(ValueError, match="center_coef"):
        RewardLossParams(center_coef=-1.0)
