"""Self-Play Preference Optimization (SPPO; Wu et al. 2024, arXiv:2405.00675), as verl's
SPPO recipe runs it: the ``sppo`` advantage estimator (a sample's score above the soft
mean of the batch's scores) and the ``sppo`` policy loss (the squared distance between
the sequence log-ratio and η times that advantage).

SPPO's update pushes ``log π_θ(y|x) - log π_t(y|x)`` towards ``η·(P(y ≻ π_t | x) - ½)``;
with a scalar reward in place of the preference probability, the centred target is the
score minus a baseline. verl's recipe takes the baseline as the soft mean
``(1/β)·log mean_j exp(β·s_j)`` over the whole training batch (not per prompt), which is
what :func:`sppo_advantages` computes.

Same signatures and conventions as :mod:`temper.algorithms.advantages` and
:mod:`temper.algorithms.policy_losses`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from temper.algorithms.advantages import AdvantageInputs, AdvantageParams, _float, estimator
from temper.algorithms.aggregation import LossAggregator
from temper.algorithms.masked import masked_mean
from temper.algorithms.policy_losses import POLICY_LOSSES, Metrics, PolicyLossParams


def softmean(x: Tensor, beta: float) -> Tensor:
    """``SoftMean_β(x) = (1/β)·log((1/n)·Σ_i exp(β·x_i))`` over a 1-d ``x`` (0-dim result).

    ``β = 0`` is the limit, the arithmetic mean; ``β > 0`` leans towards the maximum,
    ``β < 0`` towards the minimum. Computed with ``logsumexp`` so large ``β·x`` does not
    overflow.
    """
    if x.numel() == 0:
        return x.new_zeros(())
    if beta == 0.0:
        return x.mean()
    return (torch.logsumexp(beta * x, dim=0) - math.log(x.numel())) / beta


@estimator("sppo", reads=frozenset({"sppo_beta"}))
def sppo_advantages(inp: AdvantageInputs, params: AdvantageParams) -> tuple[Tensor, Tensor]:
    """SPPO's centred score (verl recipe ``sppo``): ``A_i = s_i - SoftMean_β(s)``.

    ``s_i = Σ_t r_it`` is the sample's summed token reward and the soft mean
    (:func:`softmean`, ``β = params.sppo_beta``, verl ``algorithm.sppo_eta``) runs over
    every sample of the batch, prompt groups ignored (verl's convention; a zero-length
    response's score counts in it). ``A_i`` is broadcast over the response's valid
    tokens and is 0 elsewhere. Returns = advantages.
    """
    r = _float(inp.token_level_rewards)
    m = (inp.response_mask > 0).to(r.dtype)
    s = (r * m).sum(dim=-1)
    adv = (s - softmean(s, params.sppo_beta)).unsqueeze(-1) * m
    return adv, adv.clone()


@POLICY_LOSSES.register("sppo")
def sppo_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    params: PolicyLossParams,
    agg: LossAggregator,
    rollout_is_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """SPPO's squared loss (arXiv:2405.00675 eq. 4.2; verl's ``compute_sppo_loss``).

    Per sequence ``ρ_i = Σ_t m_it·(log π_θ - log π_old)`` (the sequence log-ratio against
    the policy that generated it) and ``Ā_i`` the advantage on its valid tokens (the
    estimator broadcasts one value; the masked mean reads it back), then

        ``L_i = (ρ_i - η·Ā_i)²``,   ``η = params.sppo_eta`` (verl ``actor.sppo_eta``)

    averaged over non-empty sequences with the global count (``agg.seq_mean``);
    ``loss_agg_mode`` is not used (verl's SPPO actor always averages over samples). With
    ``ρ = 0`` (first update on fresh samples) ``∂L_i/∂ log π_θ(y_it) = -2η·Ā_i``: the
    REINFORCE gradient with weight ``2η·Ā_i``. ``rollout_is_weights`` scale each
    ``L_i`` by their mean over the sequence. Metrics: ``log_ratio_mean`` (mean ``ρ_i``),
    ``preference_mean`` (mean ``η·Ā_i``), ``ppo_kl``; no clipping, so the clip
    fractions are 0.
    """
    m = response_mask
    mf = (m > 0).to(log_prob.dtype)
    n = mf.sum(dim=-1)
    rho = ((log_prob - old_log_prob) * mf).sum(dim=-1)
    target = params.sppo_eta * (advantages * mf).sum(dim=-1) / n.clamp(min=1.0)
    seq_losses = (rho - target.detach()) ** 2
    if rollout_is_weights is not None:
        w = (rollout_is_weights.detach() * mf).sum(dim=-1) / n.clamp(min=1.0)
        seq_losses = seq_losses * w
    valid = n > 0
    loss = agg.seq_mean(seq_losses, valid)
    zero = torch.zeros((), device=log_prob.device)
    metrics = {
        "pg_loss": loss.detach(),
        "pg_clipfrac": zero,
        "pg_clipfrac_lower": zero,
        "ppo_kl": masked_mean(old_log_prob - log_prob, m).detach(),
        "log_ratio_mean": rho[valid].mean().detach() if valid.any() else zero,
        "preference_mean": target[valid].mean().detach() if valid.any() else zero,
    }
    return loss, metrics
