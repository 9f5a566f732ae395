"""The teachers of on-policy distillation: frozen models that score the student's tokens.

A teacher is a reference role with another model (``distill.teachers.<name>.model_path``):
the same forward-only engine, micro-batching, temperature and devices (in this process,
or on Ray a worker group of its own, ``teacher:<name>``, whose proxy stands in here). With several teachers each
sample goes only to the teachers its data tag routes it to (ROLL's multi-teacher OPD), so
a teacher runs its forward on its own samples, not on the whole batch.
"""

from __future__ import annotations

import torch

from temper.algorithms.distill import route_by_tag
from temper.data.batch import Batch
from temper.roles.base import ReferenceRole
from temper.roles.kd_loss import TEACHER_LOGITS
from temper.training.micro_batching import KD_INDICES

#: Batch keys of the teachers' top-k token ids and log-probs, ``(B, T, R, k)``.
TOPK_IDS = "teacher_topk_ids"
TOPK_LOG_PROBS = "teacher_topk_log_probs"


class Teachers:
    """``compute_teacher_log_probs`` over named frozen teachers, routed by data tag."""

    def __init__(self, teachers: dict[str, ReferenceRole], tags: dict[str, list[str]]) -> None:
        if not teachers:
            raise ValueError("no teachers")
        self.teachers = teachers
        self.names = list(teachers)
        self.tags = [list(tags.get(name, [])) for name in self.names]

    def route(self, batch: Batch) -> torch.Tensor:
        """``(B, T)`` bool: which teachers score which samples (by the ``tag`` column; a
        batch without tags goes to the teachers that list none)."""
        tags = batch.get("tag") or [""] * len(batch)
        return route_by_tag([str(t) for t in tags], self.tags)

    def compute_teacher_log_probs(
        self, batch: Batch, topk: int = 0, vocab: int | None = None
    ) -> Batch:
        """A copy of ``batch`` with ``teacher_log_probs`` (B, T, R) — teacher ``t``'s
        log-prob of each response token, 0 where ``t`` does not score the sample — and
        ``teacher_routed`` (B, T) bool; with ``topk`` > 0 also each teacher's ``topk``
        most likely token ids ``< vocab`` at every response token, ``teacher_topk_ids``
        (B, T, R, k), and their log-probs (normalized over the vocabulary, at the
        sampling temperature), ``teacher_topk_log_probs`` (B, T, R, k) — 0 and id 0 where
        ``t`` does not score the sample (the direct-gradient top-k loss, distill.topk)."""
        routed = self.route(batch)
        b, r = batch["response_mask"].shape
        n = len(self.names)
        out = torch.zeros(b, n, r, dtype=torch.float32)
        top_ids = torch.zeros(b, n, r, max(topk, 0), dtype=torch.long)
        top_lp = torch.zeros(b, n, r, max(topk, 0), dtype=torch.float32)
        temperature = float(batch.meta.get("temperature", 1.0) or 1.0)
        for t, name in enumerate(self.names):
            rows = routed[:, t].nonzero(as_tuple=True)[0]
            if len(rows) == 0:
                continue
            whole = len(rows) == b
            sub = batch if whole else batch.select(rows)
            scored = self.teachers[name].compute_ref_log_probs(sub)["ref_log_probs"]
            out[rows, t] = scored.detach().float().cpu()
            if topk > 0:  # a second forward: the sampled-token pass above gives the metrics
                top = self.teachers[name].compute_top_logits(
                    sub, topk, temperature if temperature > 0 else 1.0, vocab, log_probs=True
                )
                top_ids[rows, t] = top[KD_INDICES].long().cpu()
                top_lp[rows, t] = top[TEACHER_LOGITS].detach().float().cpu()
        new = {"teacher_log_probs": out, "teacher_routed": routed}
        if topk > 0:
            new.update({TOPK_IDS: top_ids, TOPK_LOG_PROBS: top_lp})
        return batch.union(Batch.from_dict(new))
