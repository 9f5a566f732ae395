"""Importance weights for the rollout/train log-prob mismatch.

The rollout engine (vLLM, SGLang; bf16, other kernels) samples from ``π_rollout`` which
differs slightly from the trainer's ``π_old`` on the same weights. Truncated importance
sampling (TIS; Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training"; verl ``algorithm.rollout_correction``, ROLL
``use_rollout_importance_sampling_ratio``) multiplies the per-token policy loss by

    ρ_t = π_old(y_t) / π_rollout(y_t)

truncated at ``threshold``; masked importance sampling (``mode="mask"``) instead drops
tokens/sequences whose ratio leaves ``[threshold_low, threshold]`` (ROLL
``train_infer_ratio_mask`` / ``train_infer_ratio_seq_mask``); IcePop (``mode="icepop"``,
verl's ``rollout_is_threshold: "low_high"``) keeps ``ρ`` inside ``[threshold_low,
threshold]`` and zeroes it outside, leaving those tokens in the loss's mask.

Levels (registry :data:`ROLLOUT_IS_LEVELS`, config ``rollout_correction.rollout_is``):

* ``token``: ``ρ_t = exp(log π_old - log π_rollout)`` per token;
* ``sequence``: ``ρ_i = exp(Σ_t (log π_old - log π_rollout))`` (product), broadcast;
* ``geometric``: ``ρ_i = exp(mean_t (log π_old - log π_rollout))``, broadcast
  (ROLL's ``train_infer_ratio_seq``);
* ``segment``: the geometric mean over each run of consecutive valid tokens (a turn of a
  multi-turn response), broadcast to the run (ROLL's ``weight_type: segment``).

Log-ratios are clamped to [-20, 20] before ``exp``. Weights are detached.

Rejection sampling (:func:`rollout_rejection_mask`, config ``actor.rollout_rs``; verl
``rollout_rs``, ROLL ``train_infer_correction.filters``) removes tokens, or whole
sequences or turns, whose mismatch statistic leaves its bounds from the loss's mask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from temper.algorithms.masked import masked_mean
from temper.registry import Registry

LOG_RATIO_CLAMP = 20.0

LevelFn = Callable[[Tensor, Tensor], Tensor]
"""``(values (B, T), mask (B, T)) -> (B, T)``: a per-token value aggregated at a level and
broadcast back to the tokens it covers (the IS weights' log-ratios and the rejection
statistics share them)."""


def _per_token(values: Tensor, mask: Tensor) -> Tensor:
    return values


def _sequence_sum(values: Tensor, mask: Tensor) -> Tensor:
    return (values * mask).sum(dim=-1, keepdim=True).expand_as(values)


def _sequence_mean(values: Tensor, mask: Tensor) -> Tensor:
    return masked_mean(values, mask, dim=-1).unsqueeze(-1).expand_as(values)


def _sequence_max(values: Tensor, mask: Tensor) -> Tensor:
    low = torch.full_like(values, float("-inf"))
    top = torch.where(mask > 0, values, low).max(dim=-1, keepdim=True).values
    top = torch.where(torch.isinf(top) & (top < 0), torch.zeros_like(top), top)
    return top.expand_as(values)


def _segment_mean(values: Tensor, mask: Tensor) -> Tensor:
    """The mean over each run of consecutive valid tokens (a turn), on the run's tokens."""
    valid = mask > 0
    before = torch.nn.functional.pad(valid[:, :-1], (1, 0), value=False)
    seg = torch.cumsum((valid & ~before).long(), dim=-1) * valid.long()  # 1.. per run, 0 off
    k = int(seg.max().item()) + 1 if seg.numel() else 1
    m = valid.to(values.dtype)
    sums = torch.zeros(values.shape[0], k, dtype=values.dtype, device=values.device)
    counts = torch.zeros_like(sums)
    sums.scatter_add_(1, seg, values * m)
    counts.scatter_add_(1, seg, m)
    return (sums / counts.clamp(min=1.0)).gather(1, seg) * m


#: IS levels (of the log-ratio; module docstring)
ROLLOUT_IS_LEVELS: Registry[LevelFn] = Registry("rollout_correction.rollout_is")
ROLLOUT_IS_LEVELS.add("token", _per_token)
ROLLOUT_IS_LEVELS.add("sequence", _sequence_sum)
ROLLOUT_IS_LEVELS.add("geometric", _sequence_mean)
ROLLOUT_IS_LEVELS.add("segment", _segment_mean)


def weight_mean_parts(weights: Tensor, mask: Tensor, level: str) -> tuple[Tensor, Tensor]:
    """The numerator and denominator of the weights' batch mean, kept apart so that
    micro-batches and ranks can sum them before dividing.

    Token and segment levels (weights vary within a sequence): ``(Σ w·m, Σ m)`` over valid
    tokens. Sequence levels (one weight per sequence): ``(Σ_s w̄_s, #s)`` over the sequences
    with a valid token, ``w̄_s`` the sequence's mean weight over its valid tokens.
    """
    m = (mask > 0).to(weights.dtype)
    if level in ("token", "segment"):
        return (weights * m).sum(), m.sum()
    has = (m.sum(dim=-1) > 0).to(m.dtype)
    return (masked_mean(weights, m, dim=-1) * has).sum(), has.sum()


def batch_normalized(
    weights: Tensor,
    mask: Tensor,
    level: str,
    sum_parts: Callable[[list[float]], list[float]] | None = None,
) -> tuple[Tensor, float]:
    """``(weights / mean, mean)``: the weights divided by their batch mean
    (:func:`weight_mean_parts`; ``sum_parts`` sums the parts over data-parallel ranks, so
    each rank's share is divided by the whole batch's mean), unchanged (mean 1) when that
    mean is ≤ 1e-8 or there is no valid token."""
    total, count = weight_mean_parts(weights, mask, level)
    parts = [float(total), float(count)]
    total_all, count_all = sum_parts(parts) if sum_parts else parts
    mean = total_all / count_all if count_all > 0 else 0.0
    if mean <= 1e-8:
        return weights, 1.0
    return weights / mean, mean


def rollout_is_weights(
    old_log_prob: Tensor,
    rollout_log_prob: Tensor,
    response_mask: Tensor,
    *,
    level: str = "token",
    threshold: float = 2.0,
    threshold_low: float | None = None,
    mode: str = "truncate",
) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Rollout-correction weights and mask.

    Shapes: log-probs and mask ``(B, T)`` -> ``(weights (B, T), new_mask (B, T), metrics)``.

    * ``mode="truncate"`` (TIS): ``w = min(ρ, threshold)``; mask unchanged.
    * ``mode="mask"`` (MIS): ``w = 1``; tokens (or whole sequences, for sequence levels)
      with ``ρ ∉ [threshold_low, threshold]`` are removed from the mask
      (``threshold_low`` defaults to ``1/threshold``).
    * ``mode="icepop"``: ``w = ρ·1[threshold_low ≤ ρ ≤ threshold]``; mask unchanged
      (``threshold_low`` required).

    :func:`batch_normalized` divides them by their batch mean (verl
    ``rollout_is_batch_normalize``).
    Weights are 0 on masked tokens and detached.
    Metrics: ``rollout_is_mean``, ``rollout_is_clipfrac`` (fraction of valid tokens whose
    ratio was truncated or masked), ``rollout_log_ratio_mean`` (k1 KL(π_rollout‖π_old)).
    """
    if mode not in ("truncate", "mask", "icepop"):
        raise ValueError(
            f"rollout correction mode must be 'truncate', 'mask' or 'icepop', got {mode!r}"
        )
    if threshold <= 0:
        raise ValueError(f"threshold must be > 0, got {threshold}")
    if mode == "icepop" and (threshold_low is None or not 0 < threshold_low <= threshold):
        raise ValueError(f"icepop needs 0 < threshold_low <= threshold, got {threshold_low}")
    level_fn = ROLLOUT_IS_LEVELS.get(level)
    with torch.no_grad():
        m = (response_mask > 0).to(old_log_prob.dtype)
        log_ratio = (old_log_prob - rollout_log_prob) * m
        lr = torch.clamp(level_fn(log_ratio, m), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        ratio = torch.exp(lr)
        low = threshold_low if threshold_low is not None else 1.0 / threshold
        if mode == "truncate":
            outside = ratio > threshold
            weights = torch.clamp(ratio, max=threshold) * m
            new_mask = response_mask
        elif mode == "icepop":
            outside = (ratio > threshold) | (ratio < low)
            weights = torch.where(outside, torch.zeros_like(ratio), ratio) * m
            new_mask = response_mask
        else:
            outside = (ratio > threshold) | (ratio < low)
            weights = m.clone()
            keep = (~outside).to(response_mask.dtype)
            new_mask = response_mask * keep
            weights = weights * keep.to(weights.dtype)
        metrics = {
            "rollout_is_mean": masked_mean(weights, m),
            "rollout_is_clipfrac": masked_mean(outside.to(m.dtype), m),
            "rollout_log_ratio_mean": masked_mean(-log_ratio, m),
        }
    return weights.detach(), new_mask, metrics


def logprob_diff(
    log_prob: Tensor, rollout_log_prob: Tensor, response_mask: Tensor
) -> dict[str, Tensor]:
    """How far the rollout engine's log-probs are from the trainer's on the same tokens.

    Shapes: ``(B, T)`` each -> scalars ``logprob_diff`` (mean ``|log π_train − log
    π_rollout|`` over valid tokens; the rollout/train mismatch verl and ROLL monitor) and
    ``logprob_diff_max``. 0 for a batch without valid tokens.
    """
    with torch.no_grad():
        valid = response_mask > 0
        diff = (log_prob.float() - rollout_log_prob.float()).abs()[valid]
        if diff.numel() == 0:
            zero = torch.zeros((), device=log_prob.device)
            return {"logprob_diff": zero, "logprob_diff_max": zero}
        return {"logprob_diff": diff.mean(), "logprob_diff_max": diff.max()}


# ----------------------------------------------------------------------------- rejection


@dataclass(frozen=True)
class RejectionStat:
    """A per-token statistic of the train/rollout mismatch and what turns its aggregate
    into the value compared with the bounds (``after``)."""

    token: Callable[[Tensor, Tensor], Tensor]  # (old_log_prob, rollout_log_prob) -> (B, T)
    after: Callable[[Tensor], Tensor]


def _clamped_log_ratio(old: Tensor, rollout: Tensor) -> Tensor:
    return torch.clamp(old - rollout, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _identity(x: Tensor) -> Tensor:
    return x


def _k2(old: Tensor, rollout: Tensor) -> Tensor:
    return 0.5 * _clamped_log_ratio(old, rollout).square()


def _k3(old: Tensor, rollout: Tensor) -> Tensor:
    lr = _clamped_log_ratio(old, rollout)
    return torch.exp(lr) - 1.0 - lr


def _prob_diff(old: Tensor, rollout: Tensor) -> Tensor:
    return torch.exp(old) - torch.exp(rollout)


ROLLOUT_RS_STATS: Registry[RejectionStat] = Registry("rollout_correction.rollout_rs_stat")
ROLLOUT_RS_STATS.add("ratio", RejectionStat(_clamped_log_ratio, torch.exp))
ROLLOUT_RS_STATS.add("k2", RejectionStat(_k2, _identity))
ROLLOUT_RS_STATS.add("k3", RejectionStat(_k3, _identity))
ROLLOUT_RS_STATS.add("prob_diff", RejectionStat(_prob_diff, _identity))

#: Rejection levels (of the statistic)
ROLLOUT_RS_LEVELS: Registry[LevelFn] = Registry("rollout_correction.rollout_rs_level")
ROLLOUT_RS_LEVELS.add("token", _per_token)
ROLLOUT_RS_LEVELS.add("sequence_sum", _sequence_sum)
ROLLOUT_RS_LEVELS.add("sequence_mean", _sequence_mean)
ROLLOUT_RS_LEVELS.add("sequence_max", _sequence_max)
ROLLOUT_RS_LEVELS.add("segment_mean", _segment_mean)


@dataclass(frozen=True)
class RejectionFilter:
    """One rule: keep a token iff ``low ≤ after(level(stat)) ≤ high`` (a bound of None is
    open). Names are of :data:`ROLLOUT_RS_STATS` and :data:`ROLLOUT_RS_LEVELS`."""

    stat: str = "ratio"
    level: str = "token"
    low: float | None = None
    high: float | None = None


def rollout_rejection_mask(
    old_log_prob: Tensor,
    rollout_log_prob: Tensor,
    response_mask: Tensor,
    filters: Sequence[RejectionFilter],
) -> tuple[Tensor, dict[str, Tensor]]:
    """Rejection sampling on the rollout/train mismatch: which tokens stay in the loss.

    Shapes: log-probs and mask ``(B, T)`` -> ``(keep (B, T) in the mask's dtype, metrics)``;
    ``response_mask * keep`` is the new loss mask. With ``lr_t = clamp(log π_old(y_t) −
    log π_rollout(y_t), ±20)``, the per-token statistics (:data:`ROLLOUT_RS_STATS`) are

    * ``ratio``: ``lr_t``, compared after aggregation as ``exp(·)`` — so ``token`` is
      ``ρ_t = π_old/π_rollout``, ``sequence_sum`` the sequence's product ``Π ρ_t``,
      ``sequence_mean`` its geometric mean, ``segment_mean`` the geometric mean of each
      run of consecutive response tokens (a turn);
    * ``k2``: ``½·lr_t²``; ``k3``: ``ρ_t − 1 − lr_t`` (Schulman's estimators of
      KL(π_rollout‖π_old));
    * ``prob_diff``: ``π_old(y_t) − π_rollout(y_t)`` (probabilities, not logs),

    aggregated per :data:`ROLLOUT_RS_LEVELS` over the valid tokens — ``token`` (itself),
    ``sequence_sum``, ``sequence_mean``, ``sequence_max`` (broadcast to the sequence),
    ``segment_mean`` (broadcast to the run). A token is kept iff every filter holds
    ``low ≤ value ≤ high`` (NaN fails); a sequence-level value rejects the whole
    sequence. Metrics (over valid tokens / sequences with a valid token):
    ``rollout_rs_masked_fraction`` (tokens rejected), ``rollout_rs_seq_masked_fraction``
    (sequences with a rejected token), ``rollout_rs_{i}_masked_fraction`` per filter ``i``.
    """
    with torch.no_grad():
        m = (response_mask > 0).to(old_log_prob.dtype)
        keep = torch.ones_like(m, dtype=torch.bool)
        metrics: dict[str, Tensor] = {}
        for i, f in enumerate(filters):
            stat = ROLLOUT_RS_STATS.get(f.stat)
            level = ROLLOUT_RS_LEVELS.get(f.level)
            value = stat.after(level(stat.token(old_log_prob, rollout_log_prob) * m, m))
            ok = torch.ones_like(keep)
            if f.low is not None:
                ok = ok & (value >= f.low)
            if f.high is not None:
                ok = ok & (value <= f.high)
            metrics[f"rollout_rs_{i}_masked_fraction"] = masked_mean((~ok).to(m.dtype), m)
            keep = keep & ok
        rejected = (~keep).to(m.dtype) * m
        metrics["rollout_rs_masked_fraction"] = masked_mean(rejected, m)
        has = m.sum(dim=-1) > 0
        hit = (rejected.sum(dim=-1) > 0).to(m.dtype)
        metrics["rollout_rs_seq_masked_fraction"] = (
            hit[has].mean() if bool(has.any()) else torch.zeros((), device=m.device)
        )
    return keep.to(response_mask.dtype), metrics
