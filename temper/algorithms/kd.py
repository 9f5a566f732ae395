"""Offline knowledge distillation: per-token divergences of a student from a teacher's
distribution over the teacher's top-k tokens (ROLL's distill pipeline, ``kd_objective``).

At every scored position the teacher keeps its ``k`` most likely tokens
(:func:`teacher_top_logits`); both distributions are then the softmax over those ``k``
tokens only — the teacher's of its logits scaled by ``1 / (T_kd · T_teacher)``, the
student's of its logits at the same token ids scaled by ``1 / T_kd`` — which is how ROLL
restricts both sides before comparing them (``k`` = the whole vocabulary: no
restriction). With ``p`` the teacher's and ``q`` the student's distribution over the k
tokens, every objective of :data:`KD_OBJECTIVES` has one signature::

    objective(student_logits (…, k), teacher_logits (…, k), params) -> (…) per position

``teacher_logits`` already scaled (as :func:`teacher_top_logits` returns them). A
teacher logit of ``−inf`` (a token the teacher rules out) contributes nothing, as ROLL
masks it. The caller masks the positions and aggregates (token-mean).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
from torch import Tensor

from temper.registry import Registry


@dataclasses.dataclass(frozen=True)
class KDParams:
    """``temperature``: ``T_kd``, dividing both models' logits (ROLL ``kd_temperature``);
    ``teacher_temperature``: ``T_teacher``, dividing the teacher's once more;
    ``adaptive_alpha``: the head/tail split of ``adaptive_kl`` (ROLL
    ``adaptive_kl_alpha``); ``skew_lambda``: the mixing weight ``λ`` of the skewed KLs."""

    temperature: float = 1.0
    teacher_temperature: float = 1.0
    adaptive_alpha: float = 0.5
    skew_lambda: float = 0.1

    def __post_init__(self) -> None:
        if self.temperature <= 0 or self.teacher_temperature <= 0:
            raise ValueError(
                f"temperatures must be > 0, got {self.temperature}, {self.teacher_temperature}"
            )
        if not 0.0 < self.skew_lambda < 1.0:
            raise ValueError(f"skew_lambda must be in (0, 1), got {self.skew_lambda}")
        if not 0.0 <= self.adaptive_alpha <= 1.0:
            raise ValueError(f"adaptive_alpha must be in [0, 1], got {self.adaptive_alpha}")


KDObjective = Callable[[Tensor, Tensor, KDParams], Tensor]
KD_OBJECTIVES: Registry[KDObjective] = Registry("kd_objective")


def teacher_top_logits(logits: Tensor, k: int, scale: float) -> tuple[Tensor, Tensor]:
    """The teacher's ``k`` largest logits and their token ids, ``(…, V) -> (…, k), (…, k)``.

    ``values = top_k(z / scale)`` with ``scale = T_kd · T_teacher``; ``k = 0`` or
    ``k ≥ V``: every token (``values = z / scale``, ids ``0 … V−1``)."""
    z = logits.float() / scale
    vocab = z.shape[-1]
    if k <= 0 or k >= vocab:
        ids = torch.arange(vocab, device=z.device).expand(z.shape)
        return z, ids
    values, ids = torch.topk(z, k, dim=-1)
    return values, ids


def _sides(student_logits: Tensor, teacher_logits: Tensor, p: KDParams) -> tuple[Tensor, ...]:
    """``(log q, q, log p, p, live)`` over the k tokens; ``live``: finite teacher logits."""
    live = torch.isfinite(teacher_logits)
    log_q = torch.log_softmax(student_logits.float() / p.temperature, dim=-1)
    log_p = torch.log_softmax(teacher_logits.float(), dim=-1)
    return log_q, log_q.exp(), log_p, log_p.exp(), live


def _sum(terms: Tensor, live: Tensor) -> Tensor:
    return torch.where(live, terms, torch.zeros_like(terms)).sum(dim=-1)


@KD_OBJECTIVES.register("forward_kl")
def forward_kl(student_logits: Tensor, teacher_logits: Tensor, p: KDParams) -> Tensor:
    """``KL(p ‖ q) = Σ_v p_v (log p_v − log q_v)``: mean-seeking, the classic KD loss."""
    log_q, _, log_p, probs_p, live = _sides(student_logits, teacher_logits, p)
    return _sum(probs_p * (log_p - log_q), live)


@KD_OBJECTIVES.register("reverse_kl")
def reverse_kl(student_logits: Tensor, teacher_logits: Tensor, p: KDParams) -> Tensor:
    """``KL(q ‖ p) = Σ_v q_v (log q_v − log p_v)``: mode-seeking."""
    log_q, probs_q, log_p, _, live = _sides(student_logits, teacher_logits, p)
    return _sum(probs_q * (log_q - log_p), live)


@KD_OBJECTIVES.register("skewed_forward_kl")
def skewed_forward_kl(student_logits: Tensor, teacher_logits: Tensor, p: KDParams) -> Tensor:
    """``KL(p ‖ λp + (1−λ)q) = Σ_v p_v (log p_v − log(λ p_v + (1−λ) q_v))`` (λ =
    ``skew_lambda``; Ko et al. 2024, DistiLLM): bounded where ``q`` vanishes."""
    _, probs_q, log_p, probs_p, live = _sides(student_logits, teacher_logits, p)
    lam = p.skew_lambda
    mixed = torch.log(lam * probs_p + (1 - lam) * probs_q)
    return _sum(probs_p * (log_p - mixed), live)


@KD_OBJECTIVES.register("skewed_reverse_kl")
def skewed_reverse_kl(student_logits: Tensor, teacher_logits: Tensor, p: KDParams) -> Tensor:
    """``KL(q ‖ (1−λ)p + λq) = Σ_v q_v (log q_v − log((1−λ) p_v + λ q_v))`` (λ =
    ``skew_lambda``; ROLL weights the teacher by ``1−λ`` here, the student by ``λ``)."""
    log_q, probs_q, _, probs_p, live = _sides(student_logits, teacher_logits, p)
    lam = p.skew_lambda
    mixed = torch.log((1 - lam) * probs_p + lam * probs_q)
    return _sum(probs_q * (log_q - mixed), live)


#: What keeps ``log 0`` finite in the Jensen-Shannon divergence (ROLL's constant).
JS_EPS = 1e-9


@KD_OBJECTIVES.register("js_divergence", "jsd")
def js_divergence(student_logits: Tensor, teacher_logits: Tensor, p: KDParams) -> Tensor:
    """``JS(p, q) = ½ KL(p ‖ m) + ½ KL(q ‖ m)``, ``m = (p + q) / 2``, each log taken of
    ``x + ε`` (ε = 1e-9, as ROLL): symmetric and bounded by ``log 2``."""
    _, probs_q, _, probs_p, live = _sides(student_logits, teacher_logits, p)
    m = (probs_p + probs_q) / 2
    log_m = torch.log(m + JS_EPS)
    terms = probs_p * (torch.log(probs_p + JS_EPS) - log_m)
    terms = terms + probs_q * (torch.log(probs_q + JS_EPS) - log_m)
    return _sum(terms / 2, live)


@KD_OBJECTIVES.register("adaptive_kl")
def adaptive_kl(student_logits: Tensor, teacher_logits: Tensor, p: KDParams) -> Tensor:
    """``AKL = g_h/(g_h+g_t) · KL(p‖q) + g_t/(g_h+g_t) · KL(q‖p)`` (Wu et al. 2024).

    Sort the k tokens by ascending teacher probability; the *tail* is the tokens whose
    cumulative teacher probability is ≤ α (``adaptive_alpha``), the *head* the rest;
    ``g_h = Σ_head |p_v − q_v|`` and ``g_t = Σ_tail |p_v − q_v|`` (constants: no gradient
    flows through the weights). Where ``g_h + g_t = 0`` (q = p) the divergence is 0."""
    _, probs_q, _, probs_p, _ = _sides(student_logits, teacher_logits, p)
    sorted_p, order = probs_p.sort(dim=-1)
    gap = (sorted_p - probs_q.gather(-1, order)).abs().detach()
    tail = (torch.cumsum(sorted_p, dim=-1) <= p.adaptive_alpha).float()
    g_tail = (gap * tail).sum(dim=-1)
    g_head = (gap * (1 - tail)).sum(dim=-1)
    total = (g_head + g_tail).clamp(min=torch.finfo(gap.dtype).tiny)
    fkl = forward_kl(student_logits, teacher_logits, p)
    rkl = reverse_kl(student_logits, teacher_logits, p)
    return (g_head / total) * fkl + (g_tail / total) * rkl


def kd_mix(nll: Tensor, divergence: Tensor, weight: float) -> Tensor:
    """``L = (1 − w) · L_NLL + w · L_KD`` (w = ROLL ``distill_loss_weight``), both terms
    token-means over the same learnt tokens."""
    return (1 - weight) * nll + weight * divergence
