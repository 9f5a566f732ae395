"""Context parallelism (CP): each rank of a CP group holds a share of every sequence.

Megatron-Core's layout (the one its rotary embedding's ``get_pos_emb_on_this_cp_rank``
and TransformerEngine's attention assume): a sequence padded to a multiple of ``2·CP``
is cut into ``2·CP`` equal chunks, and CP rank ``r`` holds chunks ``r`` and
``2·CP − 1 − r``, in that order. Under a causal mask the early chunks attend to few
keys and the late ones to many; pairing an early chunk with a late one gives every rank
the same attention work.

The pieces here:

* :func:`cp_positions` / :func:`split_sequence` — the global positions a rank holds and
  its share of a ``(b, L)`` tensor (pure functions of the layout).
* :func:`gather_sequence_cp` — per-position outputs (log-probs, entropy, values) of
  every CP rank back into the sequence's order; backward: this rank's positions of the
  gradient (every CP rank computes the same loss from the gathered outputs).
* :func:`gather_kv` — the keys/values of every CP rank, for attention over the whole
  sequence; backward: reduce-scatter (each rank's K/V get the gradient of every rank's
  queries), as Megatron's CP attention does.
* :func:`rotary_rows` — this rank's rows of a rotary table (Megatron's
  ``get_pos_emb_on_this_cp_rank`` pins and moves its index to CUDA; this one indexes
  where the table is).

CP ranks hold the same weights and see different tokens of the same samples: their
gradients are summed with the data-parallel ones (Megatron's
``get_data_parallel_group(with_context_parallel=True)``).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def cp_multiple(cp: int, tp: int = 1, *, sequence_parallel: bool = False) -> int:
    """The multiple a sequence is padded to: ``2·CP`` chunks (none at CP = 1), each rank's
    share then cut over the TP ranks under sequence parallelism (``2·CP·TP``)."""
    return (2 * cp if cp > 1 else 1) * (tp if sequence_parallel else 1)


def cp_positions(length: int, cp: int, rank: int) -> torch.Tensor:
    """The global positions CP rank ``rank`` holds of a sequence of ``length`` (a multiple
    of ``2·CP``): with ``c = length / (2·CP)``, ``[r·c, (r+1)·c) ‖ [(2CP−1−r)·c, (2CP−r)·c)``.
    """
    if length % (2 * cp):
        raise ValueError(f"sequence length {length} is not a multiple of 2·CP = {2 * cp}")
    c = length // (2 * cp)
    first = torch.arange(rank * c, (rank + 1) * c)
    second = torch.arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c)
    return torch.cat([first, second])


def gathered_order(length: int, cp: int) -> torch.Tensor:
    """``order`` such that ``cat(rank 0's share, …, rank CP−1's share)[..., order]`` is the
    sequence in position order: the inverse permutation of every rank's positions."""
    held = torch.cat([cp_positions(length, cp, r) for r in range(cp)])
    return torch.argsort(held)


def split_sequence(x: torch.Tensor, cp: int, rank: int, dim: int = 1) -> torch.Tensor:
    """Rank ``rank``'s share of ``x`` along ``dim`` (its length a multiple of ``2·CP``)."""
    at = cp_positions(x.shape[dim], cp, rank).to(x.device)
    return x.index_select(dim, at)


def _all_gather_dim0(x: torch.Tensor, group: Any) -> torch.Tensor:
    size = dist.get_world_size(group)
    out = x.new_empty((x.shape[0] * size, *x.shape[1:]))
    dist.all_gather_into_tensor(out, x.contiguous(), group=group)
    return out


class _GatherSequence(torch.autograd.Function):
    """Every rank's share ``(…, L/CP, …)`` (along ``dim``) in position order ``(…, L, …)``;
    backward: this rank's positions of the gradient (no communication)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, dim: int) -> torch.Tensor:
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        ctx.dim, ctx.cp, ctx.rank = dim, cp, rank
        moved = x.movedim(dim, 0)
        full = _all_gather_dim0(moved, group)
        order = gathered_order(full.shape[0], cp).to(x.device)
        return full.index_select(0, order).movedim(0, dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return split_sequence(grad, ctx.cp, ctx.rank, dim=ctx.dim), None, None


def gather_sequence_cp(x: torch.Tensor, group: Any, dim: int = 1) -> torch.Tensor:
    """Per-position outputs of every CP rank along ``dim``, in position order (see
    :class:`_GatherSequence`: for consumers every CP rank computes identically)."""
    out: torch.Tensor = _GatherSequence.apply(x, group, dim)
    return out


class _GatherKV(torch.autograd.Function):
    """``x (s, …)`` of every rank of ``group`` concatenated in rank order ``(CP·s, …)``;
    backward: the gradient summed over the group, each rank keeping its own rows."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return _all_gather_dim0(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        size = dist.get_world_size(ctx.group)
        out = grad.new_empty((grad.shape[0] // size, *grad.shape[1:]))
        dist.reduce_scatter_tensor(out, grad.contiguous(), group=ctx.group)
        return out, None


def gather_kv(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Keys or values ``(s, b, g, d)`` of every CP rank in rank order (each rank's share
    in its layout order; :func:`held_positions` gives their positions)."""
    out: torch.Tensor = _GatherKV.apply(x, group)
    return out


def held_positions(length: int, cp: int) -> torch.Tensor:
    """The global position of each row of :func:`gather_kv`'s output (rank 0's share,
    then rank 1's, …) for a sequence of ``length``."""
    return torch.cat([cp_positions(length, cp, r) for r in range(cp)])


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """``(sq, sk)`` boolean: query at position ``q_pos[i]`` may attend to key ``j`` iff
    ``k_pos[j] ≤ q_pos[i]`` (the causal mask by global positions)."""
    return k_pos.unsqueeze(0) <= q_pos.unsqueeze(1)


def rotary_rows(emb: torch.Tensor, cp: int, rank: int) -> torch.Tensor:
    """This rank's rows of a rotary table ``(L, …)`` (``L`` a multiple of ``2·CP``), as
    Megatron's ``get_pos_emb_on_this_cp_rank`` selects them."""
    return split_sequence(emb, cp, rank, dim=0)
