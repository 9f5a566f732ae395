"""On-policy distillation's direct-gradient (GKD) term of the actor's loss
(``distill.direct_gradient``), for :class:`temper.roles.actor.Actor`.

The teachers scored the step's responses before the update
(:meth:`temper.roles.teacher.Teachers.compute_teacher_log_probs`): their log-probs of
the sampled tokens, or (``distill.topk`` > 0) their top-k token ids and log-probs. The
student's side comes from the update's own forward, so the term is differentiated
through the student (:mod:`temper.algorithms.gkd`): its log-probs of the sampled tokens,
or its logits at the teachers' top-k ids and at the sampled token (``kd_indices`` of the
mini-batch, whose ``kd_logits`` the engine returns), from which the student's top-k
log-probs follow without a second vocabulary-wide softmax. Each teacher's per-token loss
is weighted by its ``kl_coef`` on the samples routed to it, capped at
``±loss_max_clamp``, and aggregated like the policy loss (``actor.loss_agg_mode``, the
mini-batch's global normalizers).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from temper.algorithms.aggregation import LossAggregator
from temper.algorithms.gkd import (
    forward_kl_topk,
    routed_direct_loss,
    sampled_kl_loss,
    topk_student_log_probs,
)
from temper.config.schema import DistillConfig
from temper.data.batch import Batch
from temper.roles.teacher import TOPK_IDS, TOPK_LOG_PROBS
from temper.training.micro_batching import KD_INDICES, KD_LOGITS


@dataclasses.dataclass(frozen=True)
class DirectDistill:
    """What the term needs of ``distill``: the teachers' coefficients in the teachers'
    order (the order of ``teacher_log_probs``' teacher axis), the estimator or ``topk``,
    the clamps."""

    coefs: tuple[float, ...]
    estimator: str = "low_var_kl"
    topk: int = 0
    log_prob_min: float | None = None
    max_value: float | None = None

    @classmethod
    def of(cls, distill: DistillConfig) -> DirectDistill | None:
        """None unless on-policy distillation runs in direct-gradient mode."""
        if not distill.teachers or not distill.direct_gradient:
            return None
        return cls(
            coefs=tuple(t.kl_coef for t in distill.teachers.values()),
            estimator=distill.kl_penalty,
            topk=distill.topk,
            log_prob_min=distill.log_prob_min_clamp,
            max_value=distill.loss_max_clamp,
        )


def with_student_ids(batch: Batch, spec: DirectDistill) -> Batch:
    """``batch`` with ``kd_indices`` (B, R, T·k + 1) — every teacher's top-k ids, then the
    sampled token — so the update's forward returns the student's logits there; as is
    without ``topk``."""
    if not spec.topk:
        return batch
    ids = batch[TOPK_IDS]  # (B, T, R, k)
    b, n, r, k = ids.shape
    per_position = ids.permute(0, 2, 1, 3).reshape(b, r, n * k)
    sampled = batch["response_ids"][:, :r].long().unsqueeze(-1)
    batch[KD_INDICES] = torch.cat([per_position, sampled.to(per_position.device)], dim=-1)
    return batch


def direct_distill_loss(
    spec: DirectDistill,
    mb: Batch,
    out: dict[str, torch.Tensor],
    agg: LossAggregator,
    temperature: float,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The aggregated term of one micro-batch (module doc) and its metric
    ``distill_loss`` (the term, a partial sum as the engine wants it)."""
    mask = mb["response_mask"]
    log_prob = out["log_probs"]
    routed = mb["teacher_routed"].bool().to(log_prob.device)
    n_teachers = routed.shape[1]
    losses = []
    for t in range(n_teachers):
        if spec.topk:
            k = spec.topk
            logits = out[KD_LOGITS]
            at = torch.cat([logits[..., t * k : (t + 1) * k], logits[..., -1:]], dim=-1)
            student = topk_student_log_probs(at, log_prob, temperature)
            teacher = mb[TOPK_LOG_PROBS][:, t].to(log_prob.device)
            losses.append(forward_kl_topk(student, teacher, spec.log_prob_min))
        else:
            teacher = mb["teacher_log_probs"][:, t].to(log_prob.device)
            losses.append(sampled_kl_loss(log_prob, teacher, spec.estimator, spec.log_prob_min))
    per_token = routed_direct_loss(torch.stack(losses, dim=1), routed, spec.coefs, spec.max_value)
    loss = agg(per_token, mask)
    return loss, {"distill_loss": loss.detach()}
