"""On-policy distillation's per-token signal against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from temper.algorithms import distill_penalty, route_by_tag


def test_routing_by_tag_and_teachers_without_tags_score_everything() -> None:
    routed = route_by_tag(["math", "code", "chat"], [["math"], ["code", "chat"], []])
    assert routed.tolist() == [
        [True, False, True],
        [False, True, True],
        [False, True, True],
    ]
    assert route_by_tag(["x"], [["math"]]).tolist() == [[False]]  # no teacher: no signal


def test_single_teacher_reverse_kl_sample() -> None:
    # student log-probs −0.5, −1.0, −2.0 (last token masked); teacher −1.5, −0.25, −9.
    student = torch.tensor([[-0.5, -1.0, -2.0]])
    teacher = torch.tensor([[[-1.5, -0.25, -9.0]]])
    mask = torch.tensor([[1, 1, 0]])
    out = distill_penalty(student, teacher, torch.tensor([[True]]), [2.0], mask)
    # c·(log π − log π_t) = 2·(1.0), 2·(−0.75), masked: 0
    torch.testing.assert_close(out, torch.tensor([[2.0, -1.5, 0.0]]))


def test_two_teachers_weighted_by_coef_and_routing() -> None:
    student = torch.tensor([[-1.0, -1.0], [-2.0, -0.5]])
    teacher = torch.tensor(
        [
            [[-2.0, -1.5], [-1.0, -3.0]],  # sample 0: teacher A, teacher B
            [[-4.0, -4.0], [-1.0, -0.5]],  # sample 1
        ]
    )
    routed = torch.tensor([[True, True], [False, True]])  # sample 1 only to teacher B
    mask = torch.ones(2, 2)
    out = distill_penalty(student, teacher, routed, [0.3, 0.7], mask)
    # sample 0: 0.3·(1.0, 0.5) + 0.7·(0.0, 2.0) = (0.3, 1.55)
    # sample 1: 0.7·(−1.0, 0.0) = (−0.7, 0.0); teacher A's values there are never read
    torch.testing.assert_close(out, torch.tensor([[0.3, 1.55], [-0.7, 0.0]]))


def test_other_estimators_k3() -> None:
    student = torch.tensor([[-1.0]])
    teacher = torch.tensor([[[-2.0]]])
    out = distill_penalty(student, teacher, torch.tensor([[True]]), [1.0], torch.ones(1, 1), "k3")
    d = -2.0 - -1.0  # log π_t − log π
    assert out.item() == pytest.approx(math.exp(d) - d - 1.0)


def test_shapes_must_agree() -> None:
    with pytest.raises(ValueError, match="shapes disagree"):
        distill_penalty(
            torch.zeros(2, 3),
            torch.zeros(2, 1, 3),
            torch.ones(2, 2, dtype=torch.bool),
            [1.0],
            torch.ones(2, 3),
        )


def test_clamps_of_log_probs_and_of_the_estimate() -> None:
    student = torch.tensor([[-30.0, -1.0, -2.0]])
    teacher = torch.tensor([[[-1.0, -25.0, -1.0]]])
    routed, mask = torch.tensor([[True]]), torch.ones(1, 3)
    out = distill_penalty(student, teacher, routed, [1.0], mask, log_prob_min=-10.0, max_value=5.0)
    # clamped log-probs: (−10, −1, −2) vs (−1, −10, −1): k1 = (−9, 9, −1); clipped to ±5
    torch.testing.assert_close(out, torch.tensor([[-5.0, 5.0, -1.0]]))
