"""Advantage estimators registered in :data:`ADV_ESTIMATORS` beside the classic ones:
GDPO (each reward component normalized in its group) and the optimal token baseline
(a per-token baseline weighted by the path's accumulated variance), position-aligned
and per valid token (tool-interleaved responses).

Same signature and conventions as :mod:`temper.algorithms.advantages`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from temper.algorithms.advantages import (
    AdvantageInputs,
    AdvantageParams,
    _float,
    _mask,
    _need_index,
    estimator,
)
from temper.algorithms.groups import as_group_ids, group_stats
from temper.algorithms.masked import masked_whiten

#: ``ε`` of the optimal token baseline's ratio ``Σ G·W / (Σ W + ε)`` (verl's).
OTB_EPSILON = 1e-8


@estimator("gdpo", needs=frozenset({"reward_components"}))
def gdpo(inp: AdvantageInputs, params: AdvantageParams) -> tuple[Tensor, Tensor]:
    """Group reward-Decoupled normalization Policy Optimization (GDPO, arXiv:2601.05242),
    verl's ``gdpo`` (``docs/algo/gdpo.md``).

    With ``K`` reward components ``c_ik`` per sample (``inp.reward_components (B, K)``)
    and weights ``w_k`` (``params.reward_weights``, default all 1):

    1. each component is normalized in its prompt group as GRPO normalizes the score,
       ``a_ik = (c_ik - mean_g(c_k)) / (std_g(c_k) + ε)`` (unbiased std;
       ``norm_adv_by_std_in_grpo=False``: no division; singleton groups: mean 0, std 1;
       a component equal across its group: 0);
    2. ``s_i = Σ_k w_k a_ik``, broadcast over the valid tokens of the response;
    3. whitened over all valid tokens of the batch, ``A = (s - μ) / sqrt(σ² + 1e-8)``
       (unbiased ``σ²``).

    ``token_level_rewards`` are not read: the components replace the summed reward. A
    zero-length response's components still count in its group's statistics (as in
    verl); its advantage is 0. Returns = advantages.
    """
    comps = inp.reward_components
    if comps is None:
        raise ValueError("adv_estimator 'gdpo' needs reward_components (B, K)")
    m = _mask(inp, _float(inp.token_level_rewards))
    c = _float(comps).to(m.dtype).reshape(m.shape[0], -1)
    K = c.shape[1]
    weights = params.reward_weights if params.reward_weights is not None else (1.0,) * K
    if len(weights) != K:
        raise ValueError(f"gdpo has {K} reward components but {len(weights)} reward weights")
    index = _need_index(inp, "gdpo")
    s = c.new_zeros(c.shape[0])
    for k in range(K):
        st = group_stats(c[:, k], index)
        a = c[:, k] - st.mean
        if params.norm_adv_by_std_in_grpo:
            a = a / (st.std + params.epsilon)
        s = s + weights[k] * a
    adv = s.unsqueeze(-1) * m
    if m.sum() > 0:
        adv = masked_whiten(adv, m) * m
    return adv, adv.clone()


def _path_weights(inp: AdvantageInputs, m: Tensor, name: str) -> Tensor:
    """``W_t = Σ_{j≤t, valid} w_j``, ``w_j = 1 - 2π_j + Σ_v π_v²`` (× ``ρ̄_j²``), ``(B, T)``."""
    if inp.old_log_probs is None or inp.sum_pi_squared is None:
        raise ValueError(
            f"adv_estimator {name!r} needs old_log_probs and sum_pi_squared (B, T) "
            "from the actor's forward"
        )
    w = 1.0 - 2.0 * torch.exp(_float(inp.old_log_probs).to(m.dtype))
    w = w + _float(inp.sum_pi_squared).to(m.dtype)
    if inp.rollout_is_weights is not None:
        w = w * _float(inp.rollout_is_weights).to(m.dtype) ** 2
    return (w * m).cumsum(dim=-1)


def _returns_to_go(inp: AdvantageInputs, m: Tensor) -> Tensor:
    """``G_t = Σ_{k≥t} r_k m_k`` (undiscounted reward-to-go), ``(B, T)``."""
    r = _float(inp.token_level_rewards).to(m.dtype)
    return (r * m).flip(-1).cumsum(-1).flip(-1)


def _token_baselines(
    G: Tensor, W: Tensor, valid: Tensor, members: list[Tensor], lengths: Tensor
) -> Tensor:
    """Per-group, per-position ``B_t = Σ_i G_it W_it v_it / (Σ_i W_it v_it + ε)`` over
    aligned rows ``(B, L)`` (``v`` the valid positions), 0 for groups of one; and the
    zero tail: when one row of a group is strictly longest, its baseline is 0 from the
    second-longest length on (nothing is left to compare it with)."""
    base = torch.zeros_like(G)
    for rows in members:
        if rows.numel() < 2:
            continue
        gw = (W[rows] * valid[rows]).sum(dim=0)
        base[rows] = ((G[rows] * W[rows] * valid[rows]).sum(dim=0) / (gw + OTB_EPSILON)).expand(
            rows.numel(), -1
        )
        lens = lengths[rows]
        top, second = torch.topk(lens, 2).values.tolist()
        if top > second:
            base[rows[int(torch.argmax(lens))], int(second) :] = 0.0
    return base


def _group_members(index: Tensor, keep: Tensor) -> list[Tensor]:
    ids = torch.where(keep, index, torch.full_like(index, -1))
    n = int(index.max().item()) + 1 if index.numel() else 0
    return [(ids == g).nonzero(as_tuple=True)[0] for g in range(n)]


@estimator("optimal_token_baseline", needs=frozenset({"old_log_probs", "sum_pi_squared"}))
def optimal_token_baseline(inp: AdvantageInputs, params: AdvantageParams) -> tuple[Tensor, Tensor]:
    """Optimal Token Baseline (OTB; verl ``docs/algo/otb.md``, R. Li, "The Optimal Token
    Baseline", richardli.xyz/optimal-token-baseline), verl's ``optimal_token_baseline``.

    Per token: the reward-to-go ``G_t = Σ_{k≥t} r_k`` (undiscounted, valid tokens) and
    the path weight (the *realized energy*, a logit-gradient proxy of the path's score
    variance) ``W_t = Σ_{j≤t} w_j``, ``w_j = 1 - 2π_j + Σ_v π_v(j)²`` with ``π_j =
    exp(old_log_probs)`` (× ``ρ̄_j²`` when ``rollout_is_weights`` are given). In each
    prompt group, at each response *position* ``t``, over the responses valid there:

    ``B_t = Σ_i G_it W_it / (Σ_i W_it + 1e-8)``,  ``A_t = (G_t - B_t)·m_t``.

    Groups of one response get ``B = 0`` (``A = G``). Zero tail: when one response of a
    group is strictly the longest, its baseline is 0 from the second-longest length on
    (alone there, ``B_t`` would equal its own ``G_t``). Zero-length responses count as
    group members and get 0. Positions are absolute, as in verl: for responses with
    masked tokens inside (tool output), ``tir_optimal_token_baseline`` aligns by valid
    token instead. Returns ``(A, G·m)``.
    """
    m = _mask(inp, _float(inp.token_level_rewards))
    G = _returns_to_go(inp, m)
    W = _path_weights(inp, m, "optimal_token_baseline")
    ids = as_group_ids(_need_index(inp, "optimal_token_baseline"), device=G.device)
    members = _group_members(ids, torch.ones_like(ids, dtype=torch.bool))
    base = _token_baselines(G, W, m, members, m.sum(dim=-1))
    return (G - base) * m, G * m


@estimator("tir_optimal_token_baseline", needs=frozenset({"old_log_probs", "sum_pi_squared"}))
def tir_optimal_token_baseline(
    inp: AdvantageInputs, params: AdvantageParams
) -> tuple[Tensor, Tensor]:
    """Optimal Token Baseline for tool-interleaved responses (verl
    ``tir_optimal_token_baseline``; formula as :func:`optimal_token_baseline`).

    ``G`` and ``W`` as there, but the group's responses are aligned by *valid token*
    (the k-th generated token of each response, whatever tool output lies between)
    rather than by position: ``B_k = Σ_i G_ik W_ik / (Σ_i W_ik + 1e-8)`` over the
    responses with more than ``k`` valid tokens. Zero-length responses are left out of
    their group (a group with one non-empty response gets ``B = 0``); the zero tail
    applies in valid-token positions. For prefix masks it equals
    ``optimal_token_baseline``. Returns ``(A, G·m)``.
    """
    m = _mask(inp, _float(inp.token_level_rewards))
    G = _returns_to_go(inp, m)
    W = _path_weights(inp, m, "tir_optimal_token_baseline")
    ids = as_group_ids(_need_index(inp, "tir_optimal_token_baseline"), device=G.device)
    lengths = m.sum(dim=-1)
    L = int(lengths.max().item()) if lengths.numel() else 0
    valid = m > 0
    slot = (m.cumsum(dim=-1) - 1).clamp(min=0).long()  # k of each valid token
    rows = torch.arange(m.shape[0], device=m.device).unsqueeze(-1).expand_as(slot)

    def compact(x: Tensor) -> Tensor:
        out = x.new_zeros(m.shape[0], L)
        out[rows[valid], slot[valid]] = x[valid]
        return out

    cG, cW = compact(G), compact(W)
    cV = (torch.arange(L, device=m.device).unsqueeze(0) < lengths.unsqueeze(-1)).to(m.dtype)
    members = _group_members(ids, lengths > 0)
    base = _token_baselines(cG, cW, cV, members, lengths)
    adv = torch.zeros_like(G)
    adv[valid] = (cG - base)[rows[valid], slot[valid]]
    return adv * m, G * m
