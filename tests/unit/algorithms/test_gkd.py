"""Direct-gradient (GKD) distillation losses against hand-computed values and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from temper.algorithms.gkd import (
    direct_gradient_estimator_ok,
    forward_kl_topk,
    routed_direct_loss,
    sampled_kl_loss,
    topk_student_log_probs,
)

LOG2 = math.log(2.0)


def test_k3_value_and_gradient_pull_the_student_to_the_teacher() -> None:
    student = torch.tensor([[math.log(0.5)]], requires_grad=True)
    teacher = torch.tensor([[math.log(0.25)]], requires_grad=True)
    loss = sampled_kl_loss(student, teacher, "k3")
    # d = ℓ_t − ℓ = −log 2: e^d − d − 1 = 0.5 + log 2 − 1
    torch.testing.assert_close(loss, torch.tensor([[0.5 + LOG2 - 1.0]]))
    loss.sum().backward()
    assert student.grad is not None
    torch.testing.assert_close(student.grad, torch.tensor([[1.0 - 0.5]]))  # 1 − e^d
    assert teacher.grad is None  # the teacher is a target, never trained


def test_k2_gradient_is_the_log_ratio_and_the_clamp_stops_it() -> None:
    student = torch.tensor([[-1.0, -20.0]], requires_grad=True)
    teacher = torch.tensor([[-3.0, -1.0]])
    loss = sampled_kl_loss(student, teacher, "mse", log_prob_min=-10.0)
    # ½(−1 + 3)² = 2; the second token's student log-prob is floored at −10: ½·81
    torch.testing.assert_close(loss, torch.tensor([[2.0, 40.5]]))
    loss.sum().backward()
    assert student.grad is not None
    torch.testing.assert_close(student.grad, torch.tensor([[2.0, 0.0]]))


@pytest.mark.parametrize("name", ["kl", "k1"])
def test_k1_is_refused_as_a_direct_gradient(name: str) -> None:
    assert not direct_gradient_estimator_ok(name)
    with pytest.raises(ValueError, match="independent of the teacher"):
        sampled_kl_loss(torch.zeros(1, 1), torch.zeros(1, 1), name)
    assert direct_gradient_estimator_ok("low_var_kl") and direct_gradient_estimator_ok("abs")


def test_topk_student_log_probs_equal_the_full_softmax_with_its_gradient() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5]], requires_grad=True)
    temperature = 2.0
    sampled = 2
    ids = torch.tensor([[3, 1]])
    full = torch.log_softmax(logits / temperature, dim=-1)
    at = logits.gather(-1, torch.cat([ids, torch.tensor([[sampled]])], dim=-1))
    out = topk_student_log_probs(at, full[:, sampled], temperature)
    want = full.gather(-1, ids)
    torch.testing.assert_close(out, want)
    (g_out,) = torch.autograd.grad(out.sum(), logits, retain_graph=True)
    (g_want,) = torch.autograd.grad(want.sum(), logits)
    torch.testing.assert_close(g_out, g_want)  # the normalizer's gradient is kept


def test_forward_kl_topk_value_and_gradient() -> None:
    teacher = torch.tensor([[math.log(0.5), math.log(0.25)]])
    student = torch.tensor([[math.log(0.25), math.log(0.5)]], requires_grad=True)
    loss = forward_kl_topk(student, teacher)
    # 0.5·(log .5 − log .25) + 0.25·(log .25 − log .5) = 0.25·log 2
    torch.testing.assert_close(loss, torch.tensor([0.25 * LOG2]))
    loss.sum().backward()
    assert student.grad is not None
    torch.testing.assert_close(student.grad, torch.tensor([[-0.5, -0.25]]))  # −p_v


def test_forward_kl_topk_floor_clamp_and_ruled_out_tokens() -> None:
    # a top-1 sum below zero (the student puts more mass there) is floored at 0
    student = torch.tensor([[math.log(0.9)]], requires_grad=True)
    loss = forward_kl_topk(student, torch.tensor([[math.log(0.1)]]))
    torch.testing.assert_close(loss, torch.tensor([0.0]))
    loss.sum().backward()
    assert student.grad is not None
    torch.testing.assert_close(student.grad, torch.tensor([[0.0]]))
    # a −inf teacher log-prob adds nothing (no NaN)
    teacher = torch.tensor([[0.0, float("-inf")]])
    out = forward_kl_topk(torch.tensor([[-7.0, -1.0]]), teacher)
    torch.testing.assert_close(out, torch.tensor([7.0]))
    # the student's log-prob floored at −5: 1·(0 − (−5))
    floored = forward_kl_topk(torch.tensor([[-7.0]]), torch.tensor([[0.0]]), log_prob_min=-5.0)
    torch.testing.assert_close(floored, torch.tensor([5.0]))


def test_routed_direct_loss_weights_routes_and_caps_both_sides() -> None:
    per_teacher = torch.tensor([[[1.0, 20.0], [3.0, -15.0]]])
    coefs = [2.0, 5.0]
    one = routed_direct_loss(per_teacher, torch.tensor([[True, False]]), coefs, max_value=10.0)
    torch.testing.assert_close(one, torch.tensor([[2.0, 20.0]]))
    both = routed_direct_loss(per_teacher, torch.tensor([[True, True]]), coefs, max_value=10.0)
    torch.testing.assert_close(both, torch.tensor([[2.0 + 15.0, 20.0 - 50.0]]))
    with pytest.raises(ValueError, match="shapes disagree"):
        routed_direct_loss(per_teacher, torch.tensor([[True]]), coefs)
