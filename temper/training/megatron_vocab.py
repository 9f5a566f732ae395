"""Log-probabilities and entropy from vocabulary-parallel logits (tensor parallelism).

Under tensor parallelism Megatron's output layer leaves each TP rank with the logits of
its slice of the vocabulary, ``z[..., v0:v1]``; gathering the full ``(tokens, V)``
logits would cost TP× the memory and, on CPU, cannot even run (Megatron allocates the
gather buffer on CUDA). The softmax statistics are reduced over the TP group instead:

    m      = max_v z_v                               (all-reduce MAX, no gradient: exact,
                                                      lse does not depend on the shift)
    S      = Σ_v exp(z_v - m)                        (all-reduce SUM)
    lse    = m + log S
    log p(t) = z_t - lse                             (z_t: all-reduce SUM of the owner's)
    H      = lse - (Σ_v exp(z_v - m)·z_v) / S        (all-reduce SUM)

with ``z = logits / temperature``. The sums go through Megatron's
``reduce_from_tensor_model_parallel_region`` (all-reduce forward, identity backward):
every TP rank computes the same loss from the reduced values, so each rank's backward
yields exactly the gradient of its own vocabulary slice. That holds only if everything
after a reduction is the same function of reduced values on every rank — hence the
entropy's ``Σ p z`` is formed as ``Σ e·z / S`` after both sums are reduced, never as a
local ``Σ (e/S)·z``. Padded vocabulary columns
(``≥ vocab_size``) are cut off before any of this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class VocabShard:
    """This TP rank's slice ``[start, start + width)`` of the padded vocabulary, of which
    ``valid`` columns are real tokens (< the tokenizer's vocabulary size)."""

    start: int
    width: int
    valid: int
    group: object = None  # the TP process group (None: one rank, no communication)

    @classmethod
    def of(cls, rank: int, tp: int, padded: int, vocab: int, group: object = None) -> VocabShard:
        width = padded // tp
        start = rank * width
        return cls(start, width, max(0, min(width, vocab - start)), group)


def _tp_sum(x: torch.Tensor, shard: VocabShard) -> torch.Tensor:
    if shard.group is None:
        return x
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    return reduce_from_tensor_model_parallel_region(x, group=shard.group)


def log_probs_and_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    shard: VocabShard,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(log p(targets), entropy or None)`` of shape ``targets.shape`` from this rank's
    logits ``(..., shard.width)``; differentiable w.r.t. ``logits`` (see module doc)."""
    z = logits[..., : shard.valid].float()
    if temperature != 1.0:
        z = z / temperature
    if shard.valid:
        local_max = z.detach().max(dim=-1).values
    else:
        local_max = torch.full(targets.shape, float("-inf"), device=z.device)
    m = local_max.clone()
    if shard.group is not None:
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=shard.group)
    shifted = z - m.unsqueeze(-1)
    exp = shifted.exp()
    total = _tp_sum(exp.sum(dim=-1), shard)
    lse = m + total.log()
    local_t = targets - shard.start
    mine = (local_t >= 0) & (local_t < shard.valid)
    if shard.valid:
        picked = z.gather(-1, local_t.clamp(0, shard.valid - 1).unsqueeze(-1)).squeeze(-1)
    else:
        picked = torch.zeros(targets.shape, device=z.device)
    z_t = _tp_sum(torch.where(mine, picked, torch.zeros_like(picked)), shard)
    log_p = z_t - lse
    if not with_entropy:
        return log_p, None
    # Σ p z = Σ e z / S: both sums reduced first, so every TP rank applies the same
    # function to the same reduced values (what makes identity-backward reductions exact)
    expected_z = _tp_sum((exp * z).sum(dim=-1), shard) / total
    return log_p, lse - expected_z


def gather_vocab(logits: torch.Tensor, ids: torch.Tensor, shard: VocabShard) -> torch.Tensor:
    """The logits ``z[..., ids]`` ``(..., k)`` of token ids over the whole vocabulary,
    from this rank's slice ``(..., shard.width)``: each rank contributes the ids it owns
    (zero elsewhere) and the TP sum completes them — differentiable, each rank's backward
    reaching only its own columns (module doc)."""
    local = ids - shard.start
    mine = (local >= 0) & (local < shard.valid)
    if shard.valid:
        picked = logits[..., : shard.valid].float().gather(-1, local.clamp(0, shard.valid - 1))
    else:
        picked = torch.zeros(ids.shape, device=logits.device)
    return _tp_sum(torch.where(mine, picked, torch.zeros_like(picked)), shard)


@torch.no_grad()
def top_vocab(
    logits: torch.Tensor, k: int, shard: VocabShard, limit: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest logits over the whole vocabulary and their token ids
    ``(..., k)`` among ids ``< limit`` (None: every real one; ``k = 0``: every column, in
    id order, padded ones at −inf), from this
    rank's slice: each rank's
    own top ``k`` (with global ids), gathered over the TP group, and the top ``k`` of
    those — exact, since the whole top ``k`` lies among the ranks' local ones."""
    # every rank keeps its whole slice width (padded columns at −inf, which the KD
    # objectives mask) so the gathered shapes agree whatever the ranks' valid columns
    valid = shard.valid if limit is None else max(0, min(shard.valid, limit - shard.start))
    column = torch.arange(shard.width, device=logits.device)
    z = logits[..., : shard.width].float().masked_fill(column >= valid, float("-inf"))
    ids = (column + shard.start).expand(z.shape)
    if 0 < k < shard.width:
        z, local = torch.topk(z, k, dim=-1)
        ids = local + shard.start
    if shard.group is None:
        return z, ids
    group: Any = shard.group  # a ProcessGroup (VocabShard keeps it untyped)
    tp = dist.get_world_size(group)
    values = [torch.empty_like(z) for _ in range(tp)]
    indices = [torch.empty_like(ids) for _ in range(tp)]
    dist.all_gather(values, z.contiguous(), group=shard.group)
    dist.all_gather(indices, ids.contiguous(), group=shard.group)
    all_z, all_ids = torch.cat(values, dim=-1), torch.cat(indices, dim=-1)
    if k <= 0 or k >= all_z.shape[-1]:
        return all_z, all_ids
    top, where = torch.topk(all_z, k, dim=-1)
    return top, all_ids.gather(-1, where)


@torch.no_grad()
def vocab_logsumexp(
    logits: torch.Tensor, shard: VocabShard, limit: int | None = None
) -> torch.Tensor:
    """``log Σ_v e^{z_v}`` over the whole vocabulary's ids ``< limit`` (None: every real
    one), ``(..., width) -> (...)``, from this rank's slice: the max and the shifted sum
    reduced over the TP group (module doc) — a teacher's normalizer of its top-k logits."""
    valid = shard.valid if limit is None else max(0, min(shard.valid, limit - shard.start))
    z = logits[..., :valid].float()
    if valid:
        m = z.max(dim=-1).values
    else:
        m = torch.full(logits.shape[:-1], float("-inf"), device=logits.device)
    if shard.group is not None:
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=shard.group)
    total = (z - m.unsqueeze(-1)).exp().sum(dim=-1)
    if shard.group is not None:
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=shard.group)
    return m + total.log()


@torch.no_grad()
def vocab_sum_pi_squared(
    logits: torch.Tensor, shard: VocabShard, *, temperature: float = 1.0, chunk_size: int = 2048
) -> torch.Tensor:
    """``Σ_v π_v²`` over the whole vocabulary, ``(..., width) -> (...)``, from this rank's
    slice (the optimal-token-baseline estimators' input). With ``z = logits / τ``,
    ``m = max_v z_v`` (all-reduce MAX), ``S = Σ_v e^{z_v − m}`` and
    ``Q = Σ_v e^{2(z_v − m)}`` (one all-reduce SUM of both): ``Σ_v π_v² = Q / S²``.
    Chunked over rows (every TP rank holds the same rows, so the collectives pair up):
    one fp32 ``(chunk, width)`` temporary at a time. No gradient."""
    flat = logits.reshape(-1, logits.shape[-1])
    out = []
    for i in range(0, flat.shape[0], chunk_size):
        z = flat[i : i + chunk_size, : shard.valid].float()
        if temperature != 1.0:
            z = z / temperature
        if shard.valid:
            m = z.max(dim=-1).values
        else:
            m = torch.full(z.shape[:1], float("-inf"), device=z.device)
        if shard.group is not None:
            dist.all_reduce(m, op=dist.ReduceOp.MAX, group=shard.group)
        e = (z - m.unsqueeze(-1)).exp()
        sums = torch.stack([e.sum(dim=-1), (e * e).sum(dim=-1)])
        if shard.group is not None:
            dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=shard.group)
        out.append(sums[1] / sums[0].square())
    res = torch.cat(out) if out else torch.zeros(0, device=logits.device)
    return res.reshape(logits.shape[:-1])
