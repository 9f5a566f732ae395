"""PRIME: process rewards from an implicit PRM (Cui et al. 2025, "Process Reinforcement
through Implicit Rewards"; verl's ``recipe/prime``).

The implicit process reward model (PRM) is a causal LM ``π_rm`` trained during RL against
a frozen copy ``π_ref`` of its initial weights. Its log-ratio at response token ``t``,

    q_t = log π_rm(y_t | y_<t) − log π_ref(y_t | y_<t),

summed and scaled, ``σ(β · Σ_t q_t)``, is its probability that the response is correct;
it is trained with the cross-entropy against the outcome label (:func:`prm_ce_loss`), and
``r_t = β · q_t`` is the policy's token reward (:func:`implicit_token_rewards`). The
policy's advantage is the RLOO baseline taken per reward source — the implicit rewards
and the outcome reward separately — weighted and summed, turned into returns and
whitened over the batch (:func:`prime_advantages`).

Shapes: ``B`` samples of ``R`` response tokens; ``n`` consecutive samples share a prompt.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from temper.algorithms.masked import masked_whiten

Granularity = Literal["token", "whole"]


def last_token_index(response_mask: Tensor) -> Tensor:
    """``(B,)`` index of each response's last token: ``Σ_t mask − 1`` (a right-padded
    mask; −1 for an empty response)."""
    return response_mask.long().sum(-1) - 1


def implicit_q(rm_log_probs: Tensor, ref_log_probs: Tensor, response_mask: Tensor) -> Tensor:
    """``(B, R)`` log-ratio ``q_t = (log π_rm − log π_ref)·mask_t``."""
    return (rm_log_probs - ref_log_probs) * response_mask.to(rm_log_probs.dtype)


def implicit_token_rewards(
    q: Tensor, response_mask: Tensor, beta: float, granularity: Granularity
) -> Tensor:
    """``(B, R)`` token rewards of the implicit PRM, ``r_t = β·q_t``, placed by granularity:

    - ``token``: ``r_t`` at every response token but the last (``t < L − 1``, ``L`` the
      response length) — the last token carries the outcome reward, as in verl;
    - ``whole``: ``Σ_{t<L} r_t`` at the last token ``L − 1`` (one reward per response).
    """
    r = beta * q * response_mask.to(q.dtype)
    last = last_token_index(response_mask)
    positions = torch.arange(q.shape[-1], device=q.device).unsqueeze(0)
    if granularity == "token":
        return r * (positions < last.unsqueeze(-1)).to(r.dtype)
    if granularity == "whole":
        out = torch.zeros_like(r)
        rows = torch.nonzero(last >= 0).squeeze(-1)
        out[rows, last[rows]] = r[rows].sum(-1)
        return out
    raise ValueError(f"unknown PRIME granularity {granularity!r}: use token or whole")


def prime_batch_norm(scores: Tensor) -> Tensor:
    """``scores / (max_{i,t} |Σ_{s≥t} scores_{i,s}| + 1e-6)``: the batch's token rewards
    scaled so that no return-to-go exceeds 1 in magnitude (verl's ``prime_norm:
    batch_norm``)."""
    to_go = scores.flip(-1).cumsum(-1).flip(-1)
    return scores / (to_go.abs().max() + 1e-6)


def prm_ce_loss(q: Tensor, acc: Tensor, response_mask: Tensor, beta: float) -> Tensor:
    """Scalar cross-entropy of the implicit PRM:
    ``mean_i BCE(σ(β·Σ_t q_{i,t}·mask_{i,t}), acc_i)``, ``acc ∈ [0, 1]`` the outcome."""
    logit = beta * (q * response_mask.to(q.dtype)).sum(-1)
    return torch.nn.functional.binary_cross_entropy_with_logits(logit, acc.to(logit.dtype))


def rloo_source(rewards: Tensor, mask: Tensor, n: int) -> Tensor:
    """``(B, R)`` leave-one-out rewards of one reward source, groups of ``n`` rows.

    With ``m_j`` the mean of sample ``j``'s rewards over its ``mask`` (0 for an empty
    mask), each masked reward becomes ``r_{i,t}·n/(n−1) − Σ_{j∈group} m_j/(n−1)`` — for a
    one-token source, ``r_i − mean_{j≠i} r_j``; unmasked entries are 0.
    """
    if n < 2:
        raise ValueError(f"RLOO needs at least 2 samples per prompt, got n={n}")
    m = mask.to(rewards.dtype)
    r = rewards * m
    count = m.sum(-1)
    means = r.sum(-1) / count.clamp(min=1.0)
    baseline = means.view(-1, n).sum(-1, keepdim=True).expand(-1, n).reshape(-1) / (n - 1)
    return (r * (n / (n - 1)) - baseline.unsqueeze(-1)) * m


def prime_advantages(
    rm_scores: Tensor | None,
    acc: Tensor,
    response_mask: Tensor,
    n: int,
    dpo_coef: float,
    gt_coef: float,
) -> tuple[Tensor, Tensor]:
    """``(advantages, returns)``, each ``(B, R)``:

    ``f = dpo_coef·RLOO(rm_scores, mask) + gt_coef·RLOO(acc at the last token)``
    (:func:`rloo_source`; a source with coefficient 0, or no ``rm_scores``, is left out),
    ``returns_t = Σ_{s≥t} f_s·mask_s``, ``advantages = whiten(returns)`` over the masked
    tokens of the batch (mean 0, unbiased variance 1), 0 outside the mask.
    """
    mask = response_mask.to(torch.float32)
    total = torch.zeros_like(mask)
    if rm_scores is not None and dpo_coef != 0.0:
        total = total + dpo_coef * rloo_source(rm_scores.float(), mask, n)
    if gt_coef != 0.0:
        last = last_token_index(response_mask).clamp(min=0)
        rows = torch.arange(mask.shape[0], device=mask.device)
        at_last = torch.zeros_like(mask)
        at_last[rows, last] = 1.0
        outcome = torch.zeros_like(mask)
        outcome[rows, last] = acc.float()
        total = total + gt_coef * rloo_source(outcome, at_last * mask, n)
    returns = (total * mask).flip(-1).cumsum(-1).flip(-1)
    return masked_whiten(returns, mask) * mask, returns


def accuracy_filter_order(
    acc: Tensor,
    response_lengths: Tensor,
    n: int,
    lower: float | None,
    upper: float | None,
    max_response_length: int | None,
) -> tuple[Tensor, Tensor]:
    """``(order, passed)``: the groups of ``n`` samples ranked for keeping, and which pass.

    A group passes when its mean accuracy lies in ``[lower, upper]`` (either bound None:
    no accuracy filter) and, with ``max_response_length`` given, its longest response is
    shorter than ``max_response_length − 1`` (none truncated). ``order`` (G,) lists the
    passing groups first, each part in draw order; the caller keeps a prefix of it.
    """
    group_acc = acc.float().view(-1, n).mean(-1)
    passed = torch.ones_like(group_acc, dtype=torch.bool)
    if lower is not None and upper is not None:
        passed &= (group_acc >= lower) & (group_acc <= upper)
    if max_response_length is not None:
        longest = response_lengths.view(-1, n).max(-1).values
        passed &= longest < max_response_length - 1
    order = torch.argsort((~passed).long(), stable=True)
    return order, passed


def pairwise_accuracy(seq_scores: Tensor, acc: Tensor, n: int) -> Tensor:
    """Scalar: per group of ``n``, over the pairs ``i < j``, the ``|acc_i − acc_j|``-weighted
    fraction ranked as the outcome ranks them (``seq_i > seq_j`` iff ``acc_i > acc_j``);
    a group whose outcomes are all equal counts 0.5. Mean over groups (verl's
    ``reward_model/dpo_acc``)."""
    s, a = seq_scores.float().view(-1, n), acc.float().view(-1, n)
    ds = s.unsqueeze(2) - s.unsqueeze(1)  # (G, n, n): s_i − s_j
    da = a.unsqueeze(2) - a.unsqueeze(1)
    upper = torch.triu(torch.ones(n, n, dtype=torch.bool, device=s.device), diagonal=1)
    weight = da.abs() * upper
    agree = ((ds > 0) == (da > 0)).float()
    total = weight.sum((1, 2))
    per_group = torch.where(
        total > 0,
        (agree * weight).sum((1, 2)) / total.clamp(min=1e-12),
        torch.full_like(total, 0.5),
    )
    return per_group.mean()


def sign_accuracy(seq_scores: Tensor, acc: Tensor) -> Tensor:
    """Scalar: fraction of samples with ``sign(seq_score) = sign(2·acc − 1)`` (verl's
    ``reward_model/dpo_acc_abs``)."""
    return (torch.sign(seq_scores) == torch.sign(acc * 2 - 1)).float().mean()
