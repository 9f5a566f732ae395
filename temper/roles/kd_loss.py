"""The student's loss of offline distillation, for :meth:`temper.roles.actor.Actor.distill_update`.

A mini-batch carries the teacher's top-k token ids ``kd_indices`` and its scaled logits
at them ``kd_teacher_logits`` (``(B, R, k)``, :meth:`temper.roles.reference.Reference.compute_top_logits`);
the engine's training forward returns the student's logits at the same ids
(``kd_logits``). The loss mixes the NLL of the learnt tokens with the divergence
``kd.objective`` (:data:`~temper.algorithms.kd.KD_OBJECTIVES`) at the same positions:
``(1 − w)·NLL + w·KD``, both aggregated with the mini-batch's global normalizers (so a
micro-batch split, packing or data-parallel shards do not change it).
"""

from __future__ import annotations

from typing import Any

import torch

from temper.algorithms.aggregation import LossAggregator
from temper.algorithms.kd import KD_OBJECTIVES, KDParams, kd_mix
from temper.algorithms.objectives import nll_loss
from temper.data.batch import Batch
from temper.training.base import LossFn, TrainEngine
from temper.training.micro_batching import KD_LOGITS

#: Batch key of the teacher's scaled top-k logits ``(B, R, k)``.
TEACHER_LOGITS = "kd_teacher_logits"


def distill_loss_fn(
    engine: TrainEngine,
    mini: Batch,
    loss_agg_mode: str,
    objective: str,
    params: KDParams,
    weight: float,
) -> LossFn:
    """The loss of one mini-batch's micro-batches (module doc). Metrics (partial sums, as
    the engine wants them): ``sft_loss`` (the NLL term), ``distill_loss`` (the divergence
    term), each before the weights ``1 − w`` and ``w``."""
    divergence = KD_OBJECTIVES.get(objective)
    normalizers = engine.global_normalizers(mini["response_mask"])
    agg = LossAggregator.from_normalizers(loss_agg_mode, normalizers)

    def loss_fn(mb: Batch, out: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
        mask = mb["response_mask"]
        nll = nll_loss(out["log_probs"], mask, agg)
        kd = agg(divergence(out[KD_LOGITS], mb[TEACHER_LOGITS], params), mask)
        metrics = {"sft_loss": nll.detach(), "distill_loss": kd.detach()}
        return kd_mix(nll, kd, weight), metrics

    return loss_fn
