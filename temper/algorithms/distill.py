"""On-policy distillation: the student's per-token divergence from its teachers.

The student samples a response; each teacher scores the same tokens (a forward pass, no
generation). The per-token signal is the reverse KL of the student to the teacher,
estimated on the sampled token, ``log π_student(y_t) − log π_teacher(y_t)`` (the ``kl``
estimator; ``k2``/``k3``/``abs`` as in :mod:`temper.algorithms.kl`). ROLL's on-policy
distillation (``is_pure_opd`` / ``use_opd``) makes it the advantage, ``A_t = −Σ_i c_i·KL_i``
(pure), or subtracts it from the RL advantage (mixed); with several teachers only the
teachers a sample is routed to (by its data tag) contribute.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from temper.algorithms.kl import kl_penalty


def route_by_tag(tags: Sequence[str], teacher_tags: Sequence[Sequence[str]]) -> Tensor:
    """``(B, T)`` bool: sample ``b`` is scored by teacher ``t``.

    ``routed[b, t] = (teacher_tags[t] is empty) or (tags[b] ∈ teacher_tags[t])`` — a
    teacher with no tags scores every sample (ROLL ``tag_included: []``), one with tags
    only the samples whose data tag it lists.
    """
    out = torch.zeros(len(tags), len(teacher_tags), dtype=torch.bool)
    for t, included in enumerate(teacher_tags):
        wanted = set(included)
        for b, tag in enumerate(tags):
            out[b, t] = not wanted or tag in wanted
    return out


def distill_penalty(
    log_probs: Tensor,
    teacher_log_probs: Tensor,
    routed: Tensor,
    coefs: Sequence[float],
    response_mask: Tensor,
    estimator: str = "kl",
    log_prob_min: float | None = None,
    max_value: float | None = None,
) -> Tensor:
    """Weighted per-token divergence of the student from its routed teachers, ``(B, R)``.

    ``D[b, r] = m[b, r] · Σ_t c_t · routed[b, t] · clip(k(ℓ[b, r], ℓ_t[b, t, r]), −M, M)`` with
    ``k`` the KL estimator ``estimator`` (``kl``: ``ℓ − ℓ_t``, the reverse KL's sample),
    ``ℓ = max(log π, L)`` and ``ℓ_t = max(log π_t, L)`` (``L = log_prob_min``: a token
    one model all but rules out no longer dominates the signal; None: no clamp), ``M =
    max_value`` (None: no cap; verl's ``log_prob_min_clamp`` and ``loss_max_clamp``), ``m``
    the response mask. Shapes: ``log_probs`` (B, R), ``teacher_log_probs`` (B, T, R),
    ``routed`` (B, T) bool, ``coefs`` length T, ``response_mask`` (B, R).
    """
    b, n_teachers, r = teacher_log_probs.shape
    if log_probs.shape != (b, r) or routed.shape != (b, n_teachers) or len(coefs) != n_teachers:
        raise ValueError(
            f"shapes disagree: log_probs {tuple(log_probs.shape)}, teacher_log_probs "
            f"{tuple(teacher_log_probs.shape)}, routed {tuple(routed.shape)}, {len(coefs)} coefs"
        )
    student = log_probs.float()
    teachers = teacher_log_probs.float()
    if log_prob_min is not None:
        student, teachers = student.clamp(min=log_prob_min), teachers.clamp(min=log_prob_min)
    total = torch.zeros_like(student)
    for t, coef in enumerate(coefs):
        k = kl_penalty(student, teachers[:, t], estimator)
        if max_value is not None:  # both sides, as verl: the k1 sample can be negative
            k = k.clamp(min=-max_value, max=max_value)
        total = total + coef * routed[:, t].unsqueeze(-1).float() * k
    return total * response_mask.float()
