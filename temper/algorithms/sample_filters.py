"""Sample selection and weighting: dynamic-sampling filters, PF-PPO, loss weights."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from temper.algorithms.groups import GroupIndex, group_stats
from temper.registry import Registry


@torch.no_grad()
def filter_groups_nonzero_std(scores: Tensor, group_index: GroupIndex) -> Tensor:
    """DAPO dynamic sampling (arXiv:2503.14476): keep groups whose scores differ.

    Returns a bool keep-mask ``(B,)``: False for every member of a group whose scores all
    equal (std 0 — no learning signal under group baselines). Groups of one are kept (as
    DAPO/verl ``filter_groups``).
    """
    st = group_stats(scores.float(), group_index)
    return (st.std > 0) | (st.count <= 1)


@torch.no_grad()
def filter_groups_by_mean(
    scores: Tensor, group_index: GroupIndex, low: float = 0.1, high: float = 0.95
) -> Tensor:
    """ROLL ``difficulty_mask``: keep groups with ``low < mean score < high`` (strict).

    Returns a bool keep-mask ``(B,)``. The mean of a group of one is its score here
    (ROLL passes everything through when ``n_sample == 1``; that case is the caller's).
    """
    st = group_stats(scores.float(), group_index)
    mean = torch.where(st.count > 1, st.mean, scores.float())
    return (mean > low) & (mean < high)


# PF-PPO (Shen et al. 2025, "Policy Filtration in RLHF", arXiv:2409.06957).
PFWeightFn = Callable[[Tensor, float], Tensor]
PF_PPO_REWEIGHT: Registry[PFWeightFn] = Registry("pf_ppo.reweight_method")


@PF_PPO_REWEIGHT.register("pow")
def _pf_pow(scores: Tensor, weight_pow: float) -> Tensor:
    return scores.abs().pow(weight_pow)


@PF_PPO_REWEIGHT.register("max_min")
def _pf_max_min(scores: Tensor, weight_pow: float) -> Tensor:
    keep = (scores == scores.max()) | (scores == scores.min())
    return keep.to(scores.dtype)


@PF_PPO_REWEIGHT.register("max_random")
def _pf_max_random(scores: Tensor, weight_pow: float) -> Tensor:
    return torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)


@torch.no_grad()
def pf_ppo_weights(scores: Tensor, reweight_method: str = "pow", weight_pow: float = 2.0) -> Tensor:
    """PF-PPO sampling weights ``(B,)`` from sequence scores, verl's definition.

    ``pow``: ``|s|^weight_pow``; ``max_min``: 1 for the best and worst score, else 0;
    ``max_random``: 0.4 for the best score, else 0.1. Then ``w = max(w + 1e-8, 1e-8)``.
    """
    s = scores.float()
    w = PF_PPO_REWEIGHT.get(reweight_method)(s, weight_pow)
    return torch.clamp(w + 1e-8, min=1e-8)


@torch.no_grad()
def pf_ppo_resample_indices(
    scores: Tensor,
    reweight_method: str = "pow",
    weight_pow: float = 2.0,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Indices ``(B,)`` of a PF-PPO resampled batch: ``B`` draws with replacement,
    proportional to :func:`pf_ppo_weights`. Apply them to every field of the batch."""
    w = pf_ppo_weights(scores, reweight_method, weight_pow)
    return torch.multinomial(w, w.numel(), replacement=True, generator=generator)


@torch.no_grad()
def sample_loss_weights(
    response_mask: Tensor,
    *,
    difficulty: Tensor | None = None,
    difficulty_loss_weight: bool = False,
    length_loss_weight: bool = False,
) -> Tensor:
    """ROLL per-sample loss weights ``(B,)`` (``difficulty_loss_weight``,
    ``length_loss_weight``); pass them as ``seq_weights`` to the aggregator.

    * difficulty: ``w *= 0.5 + 1.5·clip(difficulty, 0, 1)`` (harder → heavier);
    * length: ``w *= 1.5 - (n - n_min)/(n_max - n_min + 1e-8)`` (longer → lighter);
    * then ``w *= B / Σ w`` so the weights average 1.

    Note: the rescaling uses this batch's ``B``; compute the weights once on the whole
    mini-batch and split them with the data to keep micro-batch invariance.
    """
    B = response_mask.shape[0]
    w = torch.ones(B, device=response_mask.device)
    if difficulty_loss_weight and difficulty is not None:
        w = w * (0.5 + 1.5 * difficulty.float().to(w.device).clamp(0.0, 1.0))
    if length_loss_weight:
        n = (response_mask > 0).sum(dim=-1).float()
        w = w * (1.5 - (n - n.min()) / (n.max() - n.min() + 1e-8))
    if w.sum() > 0:
        w = w * (B / (w.sum() + 1e-8))
    return w
