"""Policy-loss variants registered in :data:`POLICY_LOSSES`: entropy-aware (Clip-Cov,
KL-Cov), geometric-mean (GMPO), soft-gated (SAPO), tapered off-policy REINFORCE (TOPR) and
REINFORCE with truncated importance weights (``reinforce_is``).

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
    PolicyLossParams,
    _finish,
    _log_ratio,
    _ppo_clip_terms,
    needs_inputs,
)
from temper.algorithms.rollout_correction import rollout_is_weights as is_weights


def _covariance(advantages: Tensor, log_prob: Tensor, valid: Tensor) -> Tensor:
    """Per-token ``(A - mean A)(log π - mean log π)`` over valid tokens (detached)."""
    a, lp = advantages.detach(), log_prob.detach()
    return (a - masked_mean(a, valid)) * (lp - masked_mean(lp, valid))


@POLICY_LOSSES.register("clip_cov")
def clip_cov(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    params: PolicyLossParams,
    agg: LossAggregator,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs",
    arXiv:2505.22617), verl's definition.

    PPO clip loss, plus: among valid tokens not already clipped whose covariance
    ``(A - Ā)(log π - mean log π)`` lies in ``(clip_cov_lb, clip_cov_ub)``, a random
    ``max(1, ⌊clip_cov_ratio·N⌋)`` have their loss (and gradient) set to 0. Statistics
    are over the micro-batch (as verl); randomness from torch's global RNG.
    """
    m = response_mask
    valid = m > 0
    lr = _log_ratio(log_prob, old_log_prob, params)
    ratio = torch.exp(lr)
    l1, l2, losses = _ppo_clip_terms(ratio, advantages, params)
    clipped_by_ppo = (l2 > l1) & valid
    cov = _covariance(advantages, log_prob, valid)
    cand = (cov > params.clip_cov_lb) & (cov < params.clip_cov_ub) & valid & ~clipped_by_ppo
    corr = torch.ones_like(losses)
    idx = cand.nonzero()
    if idx.shape[0] > 0:
        n_clip = max(int(params.clip_cov_ratio * int(valid.sum().item())), 1)
        pick = idx[torch.randperm(idx.shape[0], device=idx.device)[:n_clip]]
        corr[pick[:, 0], pick[:, 1]] = 0.0
    metrics = {
        "pg_clipfrac": masked_mean((corr == 0).float(), m),
        "pg_clipfrac_lower": torch.zeros((), device=log_prob.device),
        "ppo_kl": masked_mean(-lr, m),
    }
    return _finish(losses * corr, m, params, agg, rollout_is_weights, metrics)


@POLICY_LOSSES.register("kl_cov")
def kl_cov(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    params: PolicyLossParams,
    agg: LossAggregator,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """KL-Cov (arXiv:2505.22617), verl's definition.

    Unclipped ``L = -A r``; the top ``max(1, ⌊kl_cov_ratio·N⌋)`` valid tokens by covariance
    ``(A - Ā)(log π - mean log π)`` get ``L = -A r + ppo_kl_coef·|log r|``. Micro-batch
    statistics (as verl). Extra metric ``ppo_kl_abs``.
    """
    m = response_mask
    valid = m > 0
    lr = _log_ratio(log_prob, old_log_prob, params)
    ratio = torch.exp(lr)
    losses = -advantages * ratio
    n_valid = int(valid.sum().item())
    if n_valid > 0:
        cov = _covariance(advantages, log_prob, valid).masked_fill(~valid, float("-inf"))
        k = max(1, int(n_valid * params.kl_cov_ratio))
        top = torch.topk(cov.reshape(-1), k).indices
        sel = torch.zeros(losses.numel(), dtype=torch.bool, device=losses.device)
        sel[top] = True
        sel = sel.reshape(losses.shape)
        losses = torch.where(sel, losses + params.ppo_kl_coef * lr.abs(), losses)
    metrics = {
        "pg_clipfrac": torch.zeros((), device=log_prob.device),
        "pg_clipfrac_lower": torch.zeros((), device=log_prob.device),
        "ppo_kl": masked_mean(-lr, m),
        "ppo_kl_abs": masked_mean(lr.abs(), m),
    }
    return _finish(losses, m, params, agg, rollout_is_weights, metrics)


@POLICY_LOSSES.register("geo_mean")
def geo_mean(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    params: PolicyLossParams,
    agg: LossAggregator,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """Geometric-Mean Policy Optimization (GMPO, Zhao et al. 2025, arXiv:2507.20673).

    Token log-ratios are clipped in log space to ``[-ε_low, ε_high]`` (pessimistically,
    by the sign of ``A``): ``ℓ_t = sgn(A)·min(sgn(A)·lr_t, sgn(A)·clip(lr_t))``. Per
    sequence ``ρ_i = exp(mean_t ℓ_t)``, ``Ā_i = mean_t A_t`` and ``L_i = -Ā_i ρ_i``
    (times the geometric mean of ``rollout_is_weights``). The loss is the mean of ``L_i``
    over non-empty sequences with the global sequence count (``agg.seq_mean``);
    ``loss_agg_mode`` is not used (as verl).
    """
    m = response_mask
    mf = (m > 0).to(log_prob.dtype)
    lr = _log_ratio(log_prob, old_log_prob, params)
    sgn = torch.sign(advantages)
    lr_c = torch.clamp(lr, -params.low, params.high)
    lr_min = sgn * torch.minimum(sgn * lr, sgn * lr_c)
    n = mf.sum(dim=-1)
    rho = torch.exp((lr_min * mf).sum(dim=-1) / n.clamp(min=1.0))
    adv_seq = (advantages * mf).sum(dim=-1) / n.clamp(min=1.0)
    seq_losses = -adv_seq * rho
    if rollout_is_weights is not None:
        log_w = torch.log(rollout_is_weights.detach() + 1e-10) * mf
        seq_losses = seq_losses * torch.exp(log_w.sum(dim=-1) / n.clamp(min=1.0))
    loss = agg.seq_mean(seq_losses, n > 0)
    clipped = (lr != lr_c).float()
    metrics = {
        "pg_loss": loss.detach(),
        "pg_clipfrac": masked_mean(clipped * (advantages > 0), m).detach(),
        "pg_clipfrac_lower": masked_mean(clipped * (advantages < 0), m).detach(),
        "ppo_kl": masked_mean(-lr, m).detach(),
    }
    return loss, metrics


@POLICY_LOSSES.register("sapo")
def sapo(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    params: PolicyLossParams,
    agg: LossAggregator,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """Soft Adaptive Policy Optimization (Qwen, arXiv:2511.20347), verl's definition.

    A smooth gate replaces the hard clip: ``f(r) = σ(τ(r - 1))·4/τ`` with ``τ = tau_pos``
    if ``A > 0`` else ``tau_neg``; ``L = -f(r)·A``. ``f(1) = 2/τ`` and ``f'(1) = 1``, so
    near ``r = 1`` the gradient equals PPO's.
    """
    m = response_mask
    lr = _log_ratio(log_prob, old_log_prob, params)
    ratio = torch.exp(lr)
    tau = torch.where(
        advantages > 0,
        torch.as_tensor(params.tau_pos, dtype=ratio.dtype, device=ratio.device),
        torch.as_tensor(params.tau_neg, dtype=ratio.dtype, device=ratio.device),
    )
    gates = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    losses = -gates * advantages
    metrics = {
        "pg_clipfrac": torch.zeros((), device=log_prob.device),
        "pg_clipfrac_lower": torch.zeros((), device=log_prob.device),
        "ppo_kl": masked_mean(-lr, m),
    }
    return _finish(losses, m, params, agg, rollout_is_weights, metrics)


def _topr(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    params: PolicyLossParams,
    agg: LossAggregator,
    rollout_is_weights: Tensor | None,
    pos: Tensor,
) -> tuple[Tensor, Metrics]:
    m = response_mask
    lr = _log_ratio(log_prob, old_log_prob, params)
    ratio = torch.exp(lr).detach()
    w = torch.where(
        pos,
        torch.full_like(ratio, params.topr_positive_weight),
        params.topr_negative_weight * torch.clamp(ratio, 0.0, 1.0),
    )
    losses = -w * advantages * log_prob
    metrics = {
        "pg_clipfrac": masked_mean(((ratio > 1.0) & ~pos).float(), m),
        "pg_clipfrac_lower": torch.zeros((), device=log_prob.device),
        "ppo_kl": masked_mean(-lr, m),
    }
    return _finish(losses, m, params, agg, rollout_is_weights, metrics)


@POLICY_LOSSES.register("topr")
def topr(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    params: PolicyLossParams,
    agg: LossAggregator,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """Tapered Off-Policy REINFORCE (TOPR, Le Roux et al. 2025, arXiv:2503.14286).

    Positive set (``A > 0``): SFT-like ``L = -w₊·A·log π_θ`` (no importance ratio).
    Negative set (``A ≤ 0``): ``L = -w₋·sg[clip(r, 0, 1)]·A·log π_θ`` (truncated ratio).
    ``w₊ = topr_positive_weight``, ``w₋ = topr_negative_weight``. The sets are split by the
    sign of the advantage; ``topr_score`` splits them by the sample's task score, as
    ROLL does. Metric ``pg_clipfrac``: share of negative tokens with ``r > 1``.
    """
    pos = advantages > 0
    return _topr(
        log_prob, old_log_prob, advantages, response_mask, params, agg, rollout_is_weights, pos
    )


@POLICY_LOSSES.register("topr_score")
@needs_inputs("sample_positive")
def topr_score(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    params: PolicyLossParams,
    agg: LossAggregator,
    rollout_is_weights: Tensor | None = None,
    *,
    sample_positive: Tensor,
) -> tuple[Tensor, Metrics]:
    """TOPR with the sets split by the sample's task score (ROLL's ``pg_variant: topr``):
    the loss of ``topr`` with the positive set ``score > 0`` (``sample_positive``, (B,))
    whatever the sign of each token's advantage — a positive-score sample with a negative
    (normalized) advantage keeps ``-w₊·A·log π_θ``.
    """
    pos = (sample_positive > 0).unsqueeze(-1).expand_as(advantages)
    return _topr(
        log_prob, old_log_prob, advantages, response_mask, params, agg, rollout_is_weights, pos
    )


@POLICY_LOSSES.register("reinforce_is")
def reinforce_is(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    params: PolicyLossParams,
    agg: LossAggregator,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """REINFORCE with importance weights of the current policy over the old one, no
    clipping (verl's bypass mode with ``loss_type: reinforce``, where the old log-probs
    are the rollout's).

    ``L = -sg[w]·A·log π_θ`` per token, with ``w`` from ``ρ = π_θ/π_old`` at
    ``reinforce_is_level``: ``token`` (ρ per token), ``sequence`` (exp of the response's
    summed log ratio, on each of its tokens), or ``none`` (``w = 1``: plain REINFORCE,
    ``L = -A·log π_θ``); ``w = min(ρ, reinforce_is_threshold)``, or with
    ``reinforce_is_threshold_low`` (IcePop) ``w = ρ`` inside ``[low, threshold]`` and 0
    outside. The log ratio is clamped to ±20 before ``exp``. Metrics: ``pg_clipfrac``
    (share of tokens whose ρ was truncated or zeroed), ``ppo_kl`` (k1 KL(π_old‖π_θ)).
    """
    m = response_mask
    lr = _log_ratio(log_prob, old_log_prob, params).detach()
    zero = torch.zeros((), device=log_prob.device)
    if params.reinforce_is_level == "none":
        w, clipfrac = torch.ones_like(log_prob), zero
    else:
        icepop = params.reinforce_is_threshold_low is not None
        w, _, stats = is_weights(
            log_prob.detach(),
            old_log_prob,
            m,
            level=params.reinforce_is_level,
            threshold=params.reinforce_is_threshold,
            threshold_low=params.reinforce_is_threshold_low,
            mode="icepop" if icepop else "truncate",
        )
        clipfrac = stats["rollout_is_clipfrac"]
    losses = -w * advantages * log_prob
    metrics = {"pg_clipfrac": clipfrac, "pg_clipfrac_lower": zero, "ppo_kl": masked_mean(-lr, m)}
    return _finish(losses, m, params, agg, rollout_is_weights, metrics)
