"""Offline-distillation divergences against values computed by hand.

The running example: two tokens, teacher logits ``(0, 0)`` (``p = (½, ½)``) and student
logits ``(ln 3, 0)`` (``q = (¾, ¼)``).
"""

from __future__ import annotations

import math

import pytest
import torch

from temper.algorithms.kd import KD_OBJECTIVES, KDParams, kd_mix, teacher_top_logits

P = (0.5, 0.5)
Q = (0.75, 0.25)
STUDENT = torch.tensor([[math.log(3.0), 0.0]])
TEACHER = torch.tensor([[0.0, 0.0]])


def _kl(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    return sum(x * math.log(x / y) for x, y in zip(a, b) if x > 0)


def _run(name: str, params: KDParams | None = None) -> float:
    return float(KD_OBJECTIVES.get(name)(STUDENT, TEACHER, params or KDParams())[0])


def test_forward_and_reverse_kl():
    # KL(p‖q) = ½ ln(½/¾) + ½ ln(½/¼) = ½ ln(4/3)
    assert _run("forward_kl") == pytest.approx(0.5 * math.log(4 / 3), abs=1e-6)
    # KL(q‖p) = ¾ ln(3/2) + ¼ ln(½)
    assert _run("reverse_kl") == pytest.approx(0.75 * math.log(1.5) + 0.25 * math.log(0.5))


def test_skewed_kls_mix_as_roll_does():
    lam = 0.1
    m_fwd = tuple(lam * p + (1 - lam) * q for p, q in zip(P, Q))  # (0.725, 0.275)
    assert _run("skewed_forward_kl", KDParams(skew_lambda=lam)) == pytest.approx(
        _kl(P, m_fwd), abs=1e-6
    )
    m_rev = tuple((1 - lam) * p + lam * q for p, q in zip(P, Q))  # (0.525, 0.475)
    assert _run("skewed_reverse_kl", KDParams(skew_lambda=lam)) == pytest.approx(
        _kl(Q, m_rev), abs=1e-6
    )


def test_js_divergence():
    m = tuple((p + q) / 2 for p, q in zip(P, Q))  # (0.625, 0.375)
    want = 0.5 * _kl(P, m) + 0.5 * _kl(Q, m)
    assert _run("js_divergence") == pytest.approx(want, abs=1e-6)
    assert _run("jsd") == _run("js_divergence")


def test_adaptive_kl_weighs_head_and_tail_gaps():
    # p = (0.2, 0.3, 0.5), q = (0.4, 0.4, 0.2), α = 0.25: the tail is token 0 (cumulative
    # teacher mass 0.2 ≤ α), gaps |p − q| = (0.2, 0.1, 0.3): g_tail = 0.2, g_head = 0.4
    p, q = (0.2, 0.3, 0.5), (0.4, 0.4, 0.2)
    student = torch.tensor([[math.log(x) for x in q]])
    teacher = torch.tensor([[math.log(x) for x in p]])
    got = KD_OBJECTIVES.get("adaptive_kl")(student, teacher, KDParams(adaptive_alpha=0.25))
    want = (0.4 / 0.6) * _kl(p, q) + (0.2 / 0.6) * _kl(q, p)
    assert float(got[0]) == pytest.approx(want, abs=1e-6)


def test_temperature_divides_the_student_logits():
    # T = 2: the student's logits (ln 9, 0) become (ln 3, 0): q = (¾, ¼) again
    student = torch.tensor([[math.log(9.0), 0.0]])
    got = KD_OBJECTIVES.get("forward_kl")(student, TEACHER, KDParams(temperature=2.0))
    assert float(got[0]) == pytest.approx(0.5 * math.log(4 / 3), abs=1e-6)


def test_a_token_the_teacher_rules_out_adds_nothing():
    # p = (1, 0): KL(p‖q) = −ln q_0 = −ln ¾, the −inf column masked (not NaN)
    teacher = torch.tensor([[0.0, float("-inf")]])
    got = KD_OBJECTIVES.get("forward_kl")(STUDENT, teacher, KDParams())
    assert float(got[0]) == pytest.approx(-math.log(0.75), abs=1e-6)


def test_equal_distributions_diverge_by_zero_and_gradients_flow():
    student = torch.tensor([[1.0, -2.0, 0.5]], requires_grad=True)
    for name in KD_OBJECTIVES.primary_names():
        value = KD_OBJECTIVES.get(name)(student, student.detach(), KDParams())
        assert float(value.detach()[0]) == pytest.approx(0.0, abs=1e-6), name
    KD_OBJECTIVES.get("forward_kl")(student, TEACHER_3, KDParams()).sum().backward()
    # ∂KL(p‖q)/∂z = q − p (softmax cross-entropy)
    q = torch.softmax(student.detach(), dim=-1)
    assert torch.allclose(student.grad, q - torch.full_like(q, 1 / 3), atol=1e-6)


TEACHER_3 = torch.zeros(1, 3)


def test_teacher_top_logits_scales_and_keeps_k():
    logits = torch.tensor([[1.0, 4.0, 2.0, 3.0]])
    values, ids = teacher_top_logits(logits, 2, scale=2.0)
    assert ids.tolist() == [[1, 3]]
    assert values.tolist() == [[2.0, 1.5]]
    values, ids = teacher_top_logits(logits, 0, scale=1.0)  # k = 0: every token
    assert ids.tolist() == [[0, 1, 2, 3]] and values.tolist() == logits.tolist()


def test_mix_and_params():
    assert float(kd_mix(torch.tensor(2.0), torch.tensor(1.0), 0.85)) == pytest.approx(
        0.15 * 2.0 + 0.85 * 1.0
    )
    with pytest.raises(ValueError, match="skew_lambda"):
        KDParams(skew_lambda=0.0)
    with pytest.raises(ValueError, match="temperatures"):
        KDParams(temperature=0.0)
