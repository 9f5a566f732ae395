"""Auxiliary loss terms and the combination of the actor's loss terms."""

from __future__ import annotations

from torch import Tensor

from temper.algorithms.aggregation import LossAggregator


def entropy_loss(entropy: Tensor, response_mask: Tensor, agg: LossAggregator) -> Tensor:
    """Aggregated token entropy ``agg(H)``; ``entropy (B, T)`` from ``entropy_from_logits``.

    Subtracted with ``entropy_coeff`` (verl) / ``entropy_loss_coef`` (ROLL) in
    :func:`actor_loss`.
    """
    return agg(entropy, response_mask)


def nll_loss(log_prob: Tensor, target_mask: Tensor, agg: LossAggregator) -> Tensor:
    """Negative log-likelihood of the target tokens: the supervised fine-tuning loss.

    Shapes: ``log_prob, target_mask (B, T)`` -> scalar (``log_prob`` at temperature 1).
    Formula: ``agg(-log π_θ(y_t | y_<t))`` over ``target_mask``; with ``token-mean`` and
    the global normalizers of the whole mini-batch (``agg.num_tokens = N``, its target
    tokens over every micro-batch and data-parallel rank)
    ``L = -Σ_i Σ_t m_it log π_θ(y_it | y_i,<t) / N``, so the micro-batch losses sum to
    the mini-batch's mean token NLL however the mini-batch is split or packed.
    """
    return agg(-log_prob, target_mask)


def sft_loss(
    log_prob: Tensor,
    response_mask: Tensor,
    sample_mask: Tensor,
    agg: LossAggregator,
    advantages: Tensor | None = None,
) -> Tensor:
    """Supervised term on positive samples (ROLL ``sft_loss_coef``).

    Shapes: ``log_prob, response_mask (B, T)``, ``sample_mask (B,)`` (1 for positive
    samples, e.g. ``score > 0``) -> scalar.
    Formula: ``agg(-log π_θ)`` over the tokens of positive samples; with ``advantages``
    given, ``agg(-A·log π_θ)`` (ROLL's ``postive_loss`` variant). ``agg`` should hold the
    global normalizers of ``response_mask·sample_mask`` over the whole mini-batch
    (``LossAggregator.from_mask(mode, full_mask * positive[:, None])``).
    """
    m = response_mask * sample_mask.reshape(-1, 1).to(response_mask.dtype)
    per_token = -log_prob if advantages is None else -advantages * log_prob
    return agg(per_token, m)


def actor_loss(
    pg_loss: Tensor,
    *,
    kl_loss: Tensor | None = None,
    kl_loss_coef: float = 0.0,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    sft_loss: Tensor | None = None,
    sft_loss_coef: float = 0.0,
    rl_loss_coef: float = 1.0,
    distill_loss: Tensor | None = None,
) -> Tensor:
    """Total actor loss.

    ``L = rl_loss_coef·(L_pg + kl_loss_coef·L_kl) - entropy_coef·H + sft_loss_coef·L_sft
    + L_distill``. With ``rl_loss_coef = 1`` this is verl's ``pg_loss -
    entropy_coeff·entropy + kl_loss_coef·kl_loss``; the ``rl_loss_coef`` scaling of the
    policy+KL part is ROLL's. ``L_distill``: on-policy distillation's direct-gradient
    term, its teachers' coefficients already inside (verl adds it, weighted, to the PPO
    loss). Each term is already globally normalized, so the sum is too.
    """
    total = pg_loss
    if kl_loss is not None and kl_loss_coef:
        total = total + kl_loss_coef * kl_loss
    total = rl_loss_coef * total
    if entropy is not None and entropy_coef:
        total = total - entropy_coef * entropy
    if sft_loss is not None and sft_loss_coef:
        total = total + sft_loss_coef * sft_loss
    if distill_loss is not None:
        total = total + distill_loss
    return total
