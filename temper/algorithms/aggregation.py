"""Loss aggregation with explicit global normalizers.

A per-token loss matrix ``L (B, T)`` with ``mask (B, T)`` is reduced to a scalar. The
normalizers (valid-token count, valid-sequence count, the ``-norm`` length) are those of
the **whole mini-batch across all micro-batches and data-parallel ranks**, held by a
:class:`LossAggregator`. Each micro-batch loss is then a partial sum, so

    Σ_micro-batches aggregate(micro) == aggregate(whole mini-batch)

and the accumulated gradient does not depend on how the mini-batch is split. (With the
local counts of each micro-batch, ``token-mean`` would weight tokens of short
micro-batches more — the gradient-accumulation bug of early frameworks.)

Data parallelism: DDP/FSDP *average* gradients over ranks, so every rank's loss is
multiplied by ``dp_size`` (as verl's ``agg_loss`` does); the averaged gradient is then the
whole-mini-batch gradient. Use ``dp_size=1`` with a sum all-reduce.

Modes (``n_i`` valid tokens of row ``i``; ``N`` global valid tokens; ``S`` global number
of sequences with at least one valid token; ``H`` the constant ``norm_length``;
``w_i`` optional per-sequence weights, default 1):

=========================== ==================================================== ==========
mode                        formula                                              source
=========================== ==================================================== ==========
``token-mean``              ``Σ_i w_i Σ_t L_it m_it / N``                         verl, ROLL
``token-sum``               ``Σ_i w_i Σ_t L_it m_it``                             verl
``seq-mean-token-sum``      ``Σ_i w_i Σ_t L_it m_it / S``                         verl, ROLL
``seq-mean-token-mean``     ``Σ_{i: n_i>0} w_i (Σ_t L_it m_it / n_i) / S``        verl, ROLL
``seq-mean-token-sum-norm`` ``Σ_i w_i Σ_t L_it m_it / (S · H)``                   Dr. GRPO
=========================== ==================================================== ==========

``seq-mean-token-sum-norm`` follows Dr. GRPO (arXiv:2503.20783) and current verl: the
token sum of each sequence divided by a constant ``H`` (the max response length), then
averaged over sequences. ROLL (and verl < 0.5) divide by ``H`` only (no ``1/S``): the same
gradient direction scaled by the number of sequences in the micro-batch, which makes it
depend on the split; with Adam this is only a learning-rate rescaling.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from temper.registry import Registry

AggFn = Callable[[Tensor, Tensor, "Tensor | None", "LossAggregator"], Tensor]

LOSS_AGG_MODES: Registry[AggFn] = Registry("loss_agg_mode")


@dataclass(frozen=True)
class GlobalNormalizers:
    """Counts over a whole mini-batch (all micro-batches, all DP ranks).

    Attributes:
        num_tokens: number of valid (mask > 0) tokens.
        num_seqs: number of sequences with at least one valid token.
        max_len: response length ``T`` of the mask (default ``norm_length``).
    """

    num_tokens: float
    num_seqs: float
    max_len: int


def compute_global_normalizers(response_mask: Tensor) -> GlobalNormalizers:
    """Counts from the full mini-batch mask ``(B, T)``.

    For data-parallel training compute this on each rank's share and sum ``num_tokens``
    and ``num_seqs`` over ranks (one all-reduce), or compute it on the driver before
    dispatch.
    """
    m = response_mask > 0
    return GlobalNormalizers(
        num_tokens=float(m.sum().item()),
        num_seqs=float(m.any(dim=-1).sum().item()),
        max_len=int(response_mask.shape[-1]),
    )


@dataclass(frozen=True)
class LossAggregator:
    """A loss-aggregation mode plus the global denominators of the mini-batch.

    Attributes:
        mode: one of :data:`LOSS_AGG_MODES`.
        num_tokens: global number of valid tokens ``N`` (mini-batch, all DP ranks).
        num_seqs: global number of sequences with ≥1 valid token ``S``.
        norm_length: the constant ``H`` of ``seq-mean-token-sum-norm`` (verl's
            ``loss_scale_factor``; default: the response length of the mask).
        dp_size: number of data-parallel ranks whose gradients are *averaged*.

    Call it as ``agg(loss_mat, mask, seq_weights=None) -> scalar``.
    """

    mode: str
    num_tokens: float
    num_seqs: float
    norm_length: float
    dp_size: int = 1

    def __post_init__(self) -> None:
        LOSS_AGG_MODES.get(self.mode)  # raises UnknownNameError listing valid modes
        if self.dp_size < 1:
            raise ValueError(f"dp_size must be >= 1, got {self.dp_size}")
        if self.norm_length <= 0:
            raise ValueError(f"norm_length must be > 0, got {self.norm_length}")

    @classmethod
    def from_mask(
        cls,
        mode: str,
        response_mask: Tensor,
        *,
        dp_size: int = 1,
        norm_length: float | None = None,
    ) -> LossAggregator:
        """Aggregator whose denominators are the counts of ``response_mask``.

        Pass the **whole mini-batch** mask (on one process) to get split-invariant losses;
        passing a micro-batch mask gives the classic local (split-dependent) behavior.
        """
        g = compute_global_normalizers(response_mask)
        return cls.from_normalizers(mode, g, dp_size=dp_size, norm_length=norm_length)

    @classmethod
    def from_normalizers(
        cls,
        mode: str,
        normalizers: GlobalNormalizers,
        *,
        dp_size: int = 1,
        norm_length: float | None = None,
    ) -> LossAggregator:
        """Aggregator from precomputed (e.g. all-reduced) :class:`GlobalNormalizers`."""
        return cls(
            mode=mode,
            num_tokens=normalizers.num_tokens,
            num_seqs=normalizers.num_seqs,
            norm_length=float(norm_length if norm_length is not None else normalizers.max_len),
            dp_size=dp_size,
        )

    def with_mode(self, mode: str) -> LossAggregator:
        """Same denominators, another mode."""
        return replace(self, mode=mode)

    def __call__(self, loss_mat: Tensor, mask: Tensor, seq_weights: Tensor | None = None) -> Tensor:
        """Aggregate ``loss_mat (B, T)`` over ``mask (B, T)``; ``seq_weights (B,)`` optional."""
        if loss_mat.shape != mask.shape:
            raise ValueError(
                f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} differ"
            )
        return LOSS_AGG_MODES.get(self.mode)(loss_mat, mask, seq_weights, self) * self.dp_size

    def seq_mean(self, seq_losses: Tensor, seq_valid: Tensor) -> Tensor:
        """``Σ_i seq_losses_i·valid_i / S`` (times ``dp_size``): for sequence-level losses."""
        v = seq_valid.to(seq_losses.dtype)
        return (seq_losses * v).sum() / max(self.num_seqs, 1.0) * self.dp_size


def _token_sums(loss_mat: Tensor, mask: Tensor, seq_weights: Tensor | None) -> Tensor:
    """Per-row ``w_i Σ_t L_it m_it`` ``(B,)``; masked positions contribute exactly 0."""
    m = mask.to(loss_mat.dtype)
    # where() rather than a product so that inf/NaN on padding cannot leak into the sum
    rows = torch.where(m > 0, loss_mat * m, torch.zeros_like(loss_mat)).sum(dim=-1)
    if seq_weights is not None:
        rows = rows * seq_weights.to(rows.dtype)
    return rows


@LOSS_AGG_MODES.register("token-mean")
def _token_mean(loss_mat: Tensor, mask: Tensor, w: Tensor | None, agg: LossAggregator) -> Tensor:
    return _token_sums(loss_mat, mask, w).sum() / max(agg.num_tokens, 1.0)


@LOSS_AGG_MODES.register("token-sum")
def _token_sum(loss_mat: Tensor, mask: Tensor, w: Tensor | None, agg: LossAggregator) -> Tensor:
    return _token_sums(loss_mat, mask, w).sum()


@LOSS_AGG_MODES.register("seq-mean-token-sum")
def _seq_mean_token_sum(
    loss_mat: Tensor, mask: Tensor, w: Tensor | None, agg: LossAggregator
) -> Tensor:
    return _token_sums(loss_mat, mask, w).sum() / max(agg.num_seqs, 1.0)


@LOSS_AGG_MODES.register("seq-mean-token-mean")
def _seq_mean_token_mean(
    loss_mat: Tensor, mask: Tensor, w: Tensor | None, agg: LossAggregator
) -> Tensor:
    n = (mask > 0).sum(dim=-1).to(loss_mat.dtype)
    rows = _token_sums(loss_mat, mask, w) / n.clamp(min=1.0)
    return rows.sum() / max(agg.num_seqs, 1.0)


@LOSS_AGG_MODES.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(
    loss_mat: Tensor, mask: Tensor, w: Tensor | None, agg: LossAggregator
) -> Tensor:
    return _token_sums(loss_mat, mask, w).sum() / (max(agg.num_seqs, 1.0) * agg.norm_length)
