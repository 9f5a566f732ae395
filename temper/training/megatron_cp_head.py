"""The megatron engine's outputs under context parallelism (:mod:`megatron_cp`).

The last stage's output ``hidden (b, L/CP, V/TP)`` (logits; ``(b, L/CP, 1)`` values)
holds this CP rank's share of the positions. Each output is computed at every held
position — position ``p`` predicts the token at ``p + 1`` of the whole sequence, so the
labels are the ids shifted left, split like the ids — then gathered over the CP group
into position order (:func:`megatron_cp.gather_sequence_cp`) and read at the response
positions ``index (b, R)``. Every CP rank then holds the micro-batch's whole outputs
and computes the same loss; its backward reaches this rank's positions only, and the
CP ranks' gradients are summed with the data-parallel ones.
"""

from __future__ import annotations

from typing import Any

import torch

from temper.training.megatron_cp import gather_sequence_cp, split_sequence
from temper.training.megatron_vocab import (
    VocabShard,
    gather_vocab,
    log_probs_and_entropy,
    vocab_sum_pi_squared,
)


def at_response(local: torch.Tensor, index: torch.Tensor, group: Any) -> torch.Tensor:
    """``local (b, L/CP[, k])`` of every CP rank in position order, read at ``index (b, R)``:
    ``(b, R[, k])``."""
    whole = gather_sequence_cp(local, group, dim=1)
    if whole.dim() == 2:
        return whole.gather(1, index)
    return whole.gather(1, index.unsqueeze(-1).expand(-1, -1, whole.shape[-1]))


def cp_outputs(
    hidden: torch.Tensor,
    ids: torch.Tensor,
    index: torch.Tensor,
    *,
    vocab: VocabShard,
    group: Any,
    temperature: float,
    with_entropy: bool,
    sum_pi_squared_chunk: int | None = None,
    kd_ids: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """``log_probs`` (+ ``entropy``, + ``sum_pi_squared`` when ``sum_pi_squared_chunk`` is
    given, + ``kd_logits`` at the teacher's ``kd_ids (b, R, k)``) of the response tokens,
    ``(b, R[, k])``, from this rank's logits; ``ids (b, L)``: the whole padded sequence."""
    cp, rank = torch.distributed.get_world_size(group), torch.distributed.get_rank(group)
    labels = split_sequence(torch.roll(ids, -1, dims=1), cp, rank)
    log_p, entropy = log_probs_and_entropy(
        hidden, labels, vocab, temperature=temperature, with_entropy=with_entropy
    )
    out = {"log_probs": at_response(log_p, index, group)}
    if entropy is not None:
        out["entropy"] = at_response(entropy, index, group)
    if sum_pi_squared_chunk is not None:
        sq = vocab_sum_pi_squared(
            hidden, vocab, temperature=temperature, chunk_size=sum_pi_squared_chunk
        )
        out["sum_pi_squared"] = at_response(sq, index, group)
    if kd_ids is not None:  # the teacher's ids placed at their positions, split like the ids
        k = kd_ids.shape[-1]
        placed = kd_ids.new_zeros((*ids.shape, k))
        placed.scatter_(1, index.unsqueeze(-1).expand(-1, -1, k), kd_ids)
        mine = split_sequence(placed, cp, rank)
        out["kd_logits"] = at_response(gather_vocab(hidden, mine, vocab), index, group)
    return out
