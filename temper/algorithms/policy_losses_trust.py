"""Policy losses that bound the update by a divergence instead of PPO's ratio clip,
registered in :data:`POLICY_LOSSES`: DPPO with its binary total-variation and binary
KL masks (``dppo_tv``, ``dppo_kl``), and DRO's quadratic log-ratio penalty (``dro``).

Same signature and conventions as :mod:`temper.algorithms.policy_losses`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from temper.algorithms.aggregation import LossAggregator
from temper.algorithms.masked import masked_mean
from temper.algorithms.policy_losses import (
    POLICY_LOSSES,
    Metrics,
    PolicyLossParamError,
    PolicyLossParams,
    _finish,
    _log_ratio,
)

#: Smoothing of ``1 - π`` inside the binary KL's logarithm (verl's).
BINARY_KL_EPS = 1e-8


def _dppo(
    valid: Tensor,
    log_prob: Tensor,
    lr: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    params: PolicyLossParams,
    agg: LossAggregator,
    rollout_is_weights: Tensor | None,
) -> tuple[Tensor, Metrics]:
    """``L = -A · sg[min(r, c)] · log π_θ · sg[valid]`` and DPPO's metrics."""
    ratio = torch.exp(lr)
    c = params.clip_ratio_c
    weight = (ratio if c is None else torch.clamp(ratio, max=c)).detach()
    keep = valid.detach().to(log_prob.dtype)
    losses = -advantages * weight * log_prob * keep
    m = response_mask
    truncated = torch.zeros_like(keep) if c is None else (ratio > c).to(keep.dtype) * keep
    metrics = {
        "pg_clipfrac": masked_mean(1.0 - keep, m),
        "pg_clipfrac_lower": masked_mean(truncated, m),
        "ppo_kl": masked_mean(-lr, m),
    }
    return _finish(losses, m, params, agg, rollout_is_weights, metrics)


@POLICY_LOSSES.register("dppo_tv")
def dppo_tv(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    params: PolicyLossParams,
    agg: LossAggregator,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """DPPO-Binary-TV (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement
    Learning", arXiv:2602.04879), verl's ``dppo_tv`` (``docs/algo/dppo.md``).

    The trust region is a bound on the total variation between the old and the new
    policy, estimated on the binary split {sampled token, every other token}:
    ``TV = |π_θ(y_t) - π_old(y_t)|``. A token is masked (no loss, no gradient) when the
    update would push the divergence past the threshold in the advantage's direction:

    ``valid = π_θ - π_old ≤ δ_high`` if ``A > 0``, ``π_θ - π_old ≥ -δ_low`` otherwise,

    ``δ_low, δ_high`` = ``clip_ratio_low`` / ``clip_ratio_high`` (default ``clip_ratio``;
    verl's example uses 0.15). Valid tokens get the importance-weighted policy gradient
    with a truncated, stop-gradient weight (truncated IS instead of dual clip):

    ``L = -A · sg[min(r, c)] · log π_θ``,  ``r = π_θ/π_old``, ``c = clip_ratio_c``
    (``None``: no truncation; verl's example sets a very large ``c``).

    Metrics: ``pg_clipfrac`` = share of masked tokens, ``pg_clipfrac_lower`` = share of
    valid tokens whose weight was truncated.
    """
    lr = _log_ratio(log_prob, old_log_prob, params)
    diff = (torch.exp(log_prob) - torch.exp(old_log_prob)).detach()
    valid = torch.where(advantages > 0, diff <= params.high, diff >= -params.low)
    return _dppo(valid, log_prob, lr, advantages, response_mask, params, agg, rollout_is_weights)


@POLICY_LOSSES.register("dppo_kl")
def dppo_kl(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    params: PolicyLossParams,
    agg: LossAggregator,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """DPPO-Binary-KL (arXiv:2602.04879), verl's ``dppo_kl``: :func:`dppo_tv` with the
    KL between the binary distributions {sampled token, the rest} as the divergence,

    ``D = q·log(q/p) + (1 - q)·log((1 - q + 1e-8) / (1 - p + 1e-8))``,
    ``p = π_θ(y_t)``, ``q = π_old(y_t)``.

    The KL grows in both directions, so only a move in the advantage's direction is
    masked: ``valid = D ≤ δ_high or p ≤ q`` if ``A > 0``, ``D ≤ δ_low or p ≥ q``
    otherwise (verl's example: ``δ = 0.05``). Loss and metrics as :func:`dppo_tv`.
    """
    lr = _log_ratio(log_prob, old_log_prob, params)
    with torch.no_grad():
        p, q = torch.exp(log_prob), torch.exp(old_log_prob)
        kl = q * (old_log_prob - log_prob) + (1.0 - q) * torch.log(
            (1.0 - q + BINARY_KL_EPS) / (1.0 - p + BINARY_KL_EPS)
        )
        valid = torch.where(
            advantages > 0, (kl <= params.high) | (p <= q), (kl <= params.low) | (p >= q)
        )
    return _dppo(valid, log_prob, lr, advantages, response_mask, params, agg, rollout_is_weights)


@POLICY_LOSSES.register("dro")
def dro(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    params: PolicyLossParams,
    agg: LossAggregator,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """Direct Reward Optimization (Richemond et al. 2024, arXiv:2405.19107; cited with
    Kimi k1.5, arXiv:2501.12599), verl's ``dro`` (``docs/algo/dro.md``).

    Per token, a policy gradient with a quadratic penalty on the log-ratio in place of
    any clip:

    ``L = -(A · log π_θ - β/2 · (log π_θ - log π_old)²)``,  ``β = dro_beta > 0``,

    so ``∂L/∂log π_θ = -A + β·(log π_θ - log π_old)``: the REINFORCE gradient at
    ``π_θ = π_old``, pulled back towards ``π_old`` as the policy moves. The log-ratio is
    not clamped (as verl). ROLL's ``pg_variant: kimi15`` is this loss with
    ``β = kimi15_tau`` (its ``-A·log π + τ/2·(log π - log π_old)²``). DRO expects advantages suited to its soft off-policy form;
    any estimator's are accepted. Raises :class:`PolicyLossParamError` without a
    positive ``dro_beta``.
    """
    beta = params.dro_beta
    if beta is None or not beta > 0:
        raise PolicyLossParamError(
            "dro_beta", f"policy loss 'dro' needs a positive dro_beta, got {beta}", "a number > 0"
        )
    lr = log_prob - old_log_prob
    losses = -(log_prob * advantages - 0.5 * beta * lr.square())
    m = response_mask
    metrics = {
        "pg_clipfrac": torch.zeros((), device=log_prob.device),
        "pg_clipfrac_lower": torch.zeros((), device=log_prob.device),
        "ppo_kl": masked_mean(-lr, m),
    }
    return _finish(losses, m, params, agg, rollout_is_weights, metrics)
