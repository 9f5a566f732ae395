"""On-policy distillation as a direct gradient term (generalized KD, Agarwal et al. 2023,
arXiv:2306.13649; verl's ``use_policy_gradient: false``).

The student samples a response; its per-token divergence from a teacher on that response
is a loss differentiated through the student's own log-probs (not an advantage, as in
:mod:`temper.algorithms.distill`). Two kinds of per-token divergence:

* a sampled-token estimator of the reverse KL ``KL(π ‖ π_t)`` (:mod:`temper.algorithms.kl`:
  ``abs``, ``mse``/``k2``, ``low_var_kl``/``k3``; ``kl``/``k1`` is refused —
  ``∇(log π − log π_t) = ∇ log π`` carries nothing of the teacher);
* the forward KL over the teacher's top-k tokens,
  ``Σ_{v ∈ top-k(π_t)} π_t(v) (log π_t(v) − log π(v))``, both log-probs normalized over the
  whole vocabulary (so the sum is not a divergence of two distributions and can be
  negative: it is floored at 0).

The caller weights each teacher's term by its coefficient and its routing, masks the
response and aggregates with the actor's ``loss_agg_mode``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from temper.algorithms.kl import KL_ESTIMATORS, kl_k1, kl_penalty


def direct_gradient_estimator_ok(estimator: str) -> bool:
    """False for ``kl``/``k1`` (any alias of it): its gradient ``∇ log π`` does not depend
    on the teacher, so backpropagating it would only push the sampled tokens down."""
    return KL_ESTIMATORS.get(estimator) is not kl_k1


def _clamp(x: Tensor, log_prob_min: float | None) -> Tensor:
    return x if log_prob_min is None else x.clamp(min=log_prob_min)


def _cap(x: Tensor, max_value: float | None) -> Tensor:
    # symmetric, as verl: the sampled estimators (k1) can be negative
    return x if max_value is None else x.clamp(min=-max_value, max=max_value)


def sampled_kl_loss(
    log_probs: Tensor,
    teacher_log_probs: Tensor,
    estimator: str,
    log_prob_min: float | None = None,
) -> Tensor:
    """Per-token estimate of ``KL(π ‖ π_t)`` on the sampled token, differentiable through
    the student's ``log_probs``; shapes ``(B, R)`` both -> ``(B, R)``.

    ``L = k(max(ℓ, L_min), max(ℓ_t, L_min))`` with ``k`` the estimator (``k3``:
    ``e^{ℓ_t−ℓ} − (ℓ_t − ℓ) − 1``, whose gradient ``(1 − e^{ℓ_t−ℓ})∇ℓ`` pulls ``ℓ``
    towards ``ℓ_t``) and ``L_min = log_prob_min`` (None: no clamp). The teacher's side
    carries no gradient.
    """
    if not direct_gradient_estimator_ok(estimator):
        raise ValueError(
            f"estimator '{estimator}' has a gradient independent of the teacher; use abs, "
            "mse/k2 or low_var_kl/k3"
        )
    student = _clamp(log_probs.float(), log_prob_min)
    teacher = _clamp(teacher_log_probs.detach().float(), log_prob_min)
    return kl_penalty(student, teacher, estimator)


def topk_student_log_probs(
    logits_at: Tensor, sampled_log_probs: Tensor, temperature: float = 1.0
) -> Tensor:
    """The student's log-probs at ``k`` token ids, normalized over the whole vocabulary,
    from its raw logits at those ids and at the sampled token; ``logits_at (…, k + 1)``
    (the last column: the sampled token's logit), ``sampled_log_probs (…)`` -> ``(…, k)``.

    ``log π(v) = z_v/T − log Z`` with ``log Z = z_y/T − log π(y)`` (``y`` the sampled token,
    ``T`` the temperature): the engine's log-prob of ``y`` already holds the normalizer, so
    no vocabulary-wide softmax is formed again; the gradient reaches ``log Z`` through
    ``log π(y)``.
    """
    z = logits_at.float() / temperature
    log_z = z[..., -1] - sampled_log_probs.float()
    return z[..., :-1] - log_z.unsqueeze(-1)


def forward_kl_topk(
    student_log_probs: Tensor, teacher_log_probs: Tensor, log_prob_min: float | None = None
) -> Tensor:
    """Forward KL over the teacher's top-k tokens, ``(…, k)`` both -> ``(…)``.

    ``L = max(0, Σ_v p_v (ℓ_t,v − ℓ_v))`` with ``ℓ_t,v = max(log π_t(v), L_min)``,
    ``p_v = e^{ℓ_t,v}``, ``ℓ_v = max(log π(v), L_min)`` (``L_min = log_prob_min``; None: no
    clamp), both log-probs normalized over the whole vocabulary. Its gradient
    ``−Σ_v p_v ∇ℓ_v`` raises the student's log-probs of the teacher's likely tokens,
    sampled or not. A ``−inf`` teacher log-prob (a token it rules out) contributes 0.
    """
    student = _clamp(student_log_probs.float(), log_prob_min)
    teacher = _clamp(teacher_log_probs.detach().float(), log_prob_min)
    p = teacher.exp()
    terms = torch.where(p > 0, p * (teacher - student), torch.zeros_like(p))
    return terms.sum(dim=-1).clamp(min=0.0)


def routed_direct_loss(
    per_teacher: Tensor,
    routed: Tensor,
    coefs: Sequence[float],
    max_value: float | None = None,
) -> Tensor:
    """``(B, R)`` weighted direct-gradient loss of the routed teachers from each teacher's
    per-token loss ``per_teacher (B, T, R)``, ``routed (B, T)`` bool, ``coefs`` length T:
    ``D[b, r] = Σ_t c_t · routed[b, t] · clip(L[b, t, r], −M, M)`` (``M = max_value``)."""
    b, n_teachers, _ = per_teacher.shape
    if routed.shape != (b, n_teachers) or len(coefs) != n_teachers:
        raise ValueError(
            f"shapes disagree: per_teacher {tuple(per_teacher.shape)}, routed "
            f"{tuple(routed.shape)}, {len(coefs)} coefs"
        )
    weights = torch.tensor(list(coefs), dtype=per_teacher.dtype, device=per_teacher.device)
    weights = weights * routed.to(per_teacher.device, per_teacher.dtype)
    return (weights.unsqueeze(-1) * _cap(per_teacher, max_value)).sum(dim=1)
