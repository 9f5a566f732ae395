"""Preference losses (DPO and its variants) on sequence log-probs of chosen/rejected pairs.

A pair's *implicit rewards* are ``r_c = β·(log π(y_c|x) − log π_ref(y_c|x))`` and
``r_r = β·(log π(y_r|x) − log π_ref(y_r|x))``, where a sequence log-prob is the sum of
the token log-probs of the response (:func:`sequence_log_probs`). Every loss of
:data:`PREFERENCE_LOSSES` has one signature::

    loss_fn(chosen, rejected, ref_chosen, ref_rejected, params) -> (P,) per-pair losses

with ``chosen, rejected, ref_chosen, ref_rejected (P,)`` sequence log-probs; the caller
averages over pairs. The names are those ROLL's DPO pipeline selects (its ``ipo``
switch; ``label_smoothing`` is the conservative, noisy-label form of the sigmoid loss).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from temper.registry import Registry


@dataclasses.dataclass(frozen=True)
class PreferenceParams:
    """``beta``: the strength of the pull towards the reference (β); ``label_smoothing``:
    the probability ε that a pair's label is flipped (sigmoid loss only)."""

    beta: float = 0.1
    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ValueError(f"label_smoothing must be in [0, 0.5), got {self.label_smoothing}")


PreferenceLossFn = Callable[[Tensor, Tensor, Tensor, Tensor, PreferenceParams], Tensor]
PREFERENCE_LOSSES: Registry[PreferenceLossFn] = Registry("dpo_loss")


def sequence_log_probs(log_probs: Tensor, response_mask: Tensor) -> Tensor:
    """``log π(y|x) = Σ_t m_t · log π(y_t | x, y_<t)``: ``(B, T), (B, T) -> (B,)``."""
    return (log_probs * response_mask.to(log_probs.dtype)).sum(dim=-1)


def preference_logits(
    chosen: Tensor, rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor
) -> Tensor:
    """``h = (log π_c − log π_ref,c) − (log π_r − log π_ref,r)``, ``(P,)`` each."""
    return (chosen - ref_chosen) - (rejected - ref_rejected)


@PREFERENCE_LOSSES.register("sigmoid", "dpo")
def sigmoid_loss(
    chosen: Tensor, rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor, p: PreferenceParams
) -> Tensor:
    """DPO (Rafailov et al., 2023), with label smoothing ε (conservative DPO):

    ``L = −(1 − ε)·log σ(β·h) − ε·log σ(−β·h)``, ``h`` of :func:`preference_logits`;
    ``ε = 0`` is the paper's ``−log σ(β·h)``. Shapes ``(P,)`` -> ``(P,)``.
    """
    z = p.beta * preference_logits(chosen, rejected, ref_chosen, ref_rejected)
    loss = -F.logsigmoid(z) * (1.0 - p.label_smoothing)
    if p.label_smoothing:
        loss = loss - F.logsigmoid(-z) * p.label_smoothing
    return loss


@PREFERENCE_LOSSES.register("ipo")
def ipo_loss(
    chosen: Tensor, rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor, p: PreferenceParams
) -> Tensor:
    """IPO (Azar et al., 2023): ``L = (h − 1/(2β))²``, ``h`` of :func:`preference_logits`
    — a squared loss that stops pushing once the margin reaches ``1/(2β)`` (β is the
    paper's τ). Shapes ``(P,)`` -> ``(P,)``; ``label_smoothing`` is not used.
    """
    h = preference_logits(chosen, rejected, ref_chosen, ref_rejected)
    return (h - 1.0 / (2.0 * p.beta)) ** 2


def pair_metrics(
    chosen: Tensor, rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor, p: PreferenceParams
) -> dict[str, Tensor]:
    """Per pair, detached (``(P,)`` each): ``rewards/chosen`` and ``rewards/rejected`` (the
    implicit rewards ``r_c``, ``r_r``), ``rewards/margin`` (``r_c − r_r``),
    ``rewards/accuracy`` (1 where ``r_c > r_r``), ``logps/chosen``, ``logps/rejected``
    (the policy's sequence log-probs)."""
    with torch.no_grad():
        r_c = p.beta * (chosen - ref_chosen)
        r_r = p.beta * (rejected - ref_rejected)
        return {
            "rewards/chosen": r_c,
            "rewards/rejected": r_r,
            "rewards/margin": r_c - r_r,
            "rewards/accuracy": (r_c > r_r).to(r_c.dtype),
            "logps/chosen": chosen.detach(),
            "logps/rejected": rejected.detach(),
        }


def preference_loss(
    name: str,
    chosen: Tensor,
    rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    params: PreferenceParams,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The mean loss over pairs of registered loss ``name`` and the means over pairs of
    :func:`pair_metrics` (``rewards/accuracy``: the fraction of pairs the implicit reward
    ranks right). Shapes ``(P,)`` -> scalar."""
    per_pair = PREFERENCE_LOSSES.get(name)(chosen, rejected, ref_chosen, ref_rejected, params)
    metrics = pair_metrics(chosen, rejected, ref_chosen, ref_rejected, params)
    return per_pair.mean(), {k: v.mean() for k, v in metrics.items()}


def online_pairs(scores: Tensor) -> Tensor:
    """Online DPO's pairs from sampled responses (verl's SPIN recipe): rows ``2i`` and
    ``2i + 1`` of a step's samples form pair ``i``; the one with the higher score is
    chosen, the other rejected (a tie: row ``2i`` is chosen, as ``argmax`` picks the first).

    ``scores (2P,)`` -> ``order (2P,)`` long: the row indices ``[c_0, r_0, c_1, r_1, …]``,
    so ``rows[order]`` alternates each pair's chosen and rejected row.
    """
    if scores.dim() != 1 or scores.numel() % 2:
        raise ValueError(f"online pairs need an even number of scores, got {tuple(scores.shape)}")
    pairs = scores.view(-1, 2)
    second = (pairs[:, 1] > pairs[:, 0]).long()  # 1 where row 2i + 1 wins
    first = torch.arange(pairs.shape[0], device=scores.device) * 2
    return torch.stack([first + second, first + 1 - second], dim=1).reshape(-1)
