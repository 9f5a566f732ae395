"""A loss over pairs of rows, trained through micro-batches that may part a pair.

DPO and reward-model training both learn from pairs: rows ``2i`` (chosen) and ``2i + 1``
(rejected) of a mini-batch. Each row reduces to one scalar ``s`` of the weights — its
output ``out[key]`` summed over its ``response_mask`` (DPO: the sequence log-prob of the
``log_probs``; a reward model: its score, the one masked slot of its ``values``) — and
the pair's loss couples two such scalars. The engine's micro-batches (a sample count, a
token budget, packing) and data-parallel shards may put a pair's rows apart, but the
loss depends on the weights only through the ``s``, so its gradient is
``Σ_rows (∂L/∂s_row)·∇s_row``: a no-grad forward of the mini-batch gives every ``s``
and so ``∂L/∂s`` (autograd on the ``(rows,)`` vector — exact for any loss), then each
micro-batch backpropagates ``Σ_rows coef_row · s_row`` (:func:`pair_loss_fn`) — the pair
loss's gradient whatever the split, at the cost of that forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from temper.algorithms.preference import sequence_log_probs
from temper.data.batch import Batch
from temper.training.base import LossFn

_COEF = "_pair_coef"  # ∂L/∂s of each row of a mini-batch (B,)
_SHARE = "_pair_share/"  # a row's share of the mini-batch's loss and metrics (B,) each

#: ``objective(chosen, rejected, mini) -> (per-pair losses (P,), per-pair metrics)``: the
#: pair loss of the rows' scalars (float64, differentiable), ``mini`` the mini-batch (for
#: what the loss reads besides the scalars, such as DPO's reference log-probs).
PairObjective = Callable[[Tensor, Tensor, Batch], tuple[Tensor, dict[str, Tensor]]]


def row_scalars(out: Tensor, response_mask: Tensor) -> Tensor:
    """``s = Σ_t m_t · out_t``: ``(B, R), (B, R) -> (B,)``."""
    return sequence_log_probs(out, response_mask)


def check_pairs(mini: Batch) -> None:
    """A pair batch alternates chosen (``chosen`` 1) and rejected (0) rows."""
    chosen = mini["chosen"]
    if not bool((chosen[0::2] == 1).all() and (chosen[1::2] == 0).all()):
        raise ValueError("a pair batch alternates chosen and rejected rows, pair by pair")


def pair_coefficients(
    mini: Batch, scalars: Tensor, objective: PairObjective, n_pairs: float
) -> Batch:
    """``mini`` with each row's ``∂L/∂s`` (``L``: the sum of the pair losses over the
    ``n_pairs`` pairs of every data-parallel rank's share, divided by ``n_pairs``) and its
    share of the loss and metrics (the pair's value / ``n_pairs``, on the chosen row; 0
    on the rejected one). ``scalars``: the rows' ``s`` (B,), from a no-grad forward."""
    check_pairs(mini)
    seq = scalars.detach().double().requires_grad_(True)
    per_pair, metrics = objective(seq[0::2], seq[1::2], mini)
    (per_pair.sum() / n_pairs).backward()
    assert seq.grad is not None
    shares = {"loss": per_pair.detach(), **{k: v.detach() for k, v in metrics.items()}}
    work = mini.union(Batch.from_dict({_COEF: seq.grad.float()}))
    for name, per in shares.items():
        row = torch.zeros(len(mini), dtype=torch.float64, device=seq.device)
        row[0::2] = per.double() / n_pairs
        work[_SHARE + name] = row
    return work


def pair_loss_fn(mini: Batch, key: str) -> LossFn:
    """A micro-batch's part of the pair loss of a mini-batch from
    :func:`pair_coefficients`: ``Σ coef·(s − s̄) + Σ share`` with ``s`` the rows' scalars
    of the engine output ``key`` — the pair loss's gradient, and (``s̄``: ``s`` detached)
    the value of the pairs' loss shares, so the micro-batches sum to the mini-batch's mean
    pair loss; the metrics' shares sum to their means likewise."""
    keys = [k for k in mini.tensors.keys() if isinstance(k, str)]  # noqa: SIM118
    names = [k[len(_SHARE) :] for k in keys if k.startswith(_SHARE)]

    def loss_fn(mb: Batch, out: dict[str, Tensor]) -> tuple[Tensor, dict[str, Any]]:
        seq = row_scalars(out[key], mb["response_mask"])
        coef = mb[_COEF].to(seq.dtype)
        loss = (coef * (seq - seq.detach())).sum() + mb[_SHARE + "loss"].sum().to(seq.dtype)
        metrics = {n: mb[_SHARE + n].sum() for n in names if n != "loss"}
        return loss, metrics

    return loss_fn
