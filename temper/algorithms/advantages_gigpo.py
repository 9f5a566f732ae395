"""GiGPO: group-in-group policy optimization (Feng et al. 2025, arXiv:2505.10978).

Registered in :data:`ADV_ESTIMATORS` as ``gigpo``. Its samples are single env steps of
multi-turn episodes (the agentic pipeline's step-wise env manager), each carrying its
episode, its position in the episode, its env reward and the key of the state it started
from. Same signature and conventions as :mod:`temper.algorithms.advantages`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable

import torch
from torch import Tensor

from temper.algorithms.advantages import (
    AdvantageInputs,
    AdvantageParams,
    _need_index,
    _scores,
    estimator,
)
from temper.algorithms.groups import GroupIndex, as_group_ids

GIGPO_INPUTS = frozenset({"step_rewards", "episode_index", "step_index", "anchor_index"})


def _keys(index: GroupIndex) -> list[Hashable]:
    if isinstance(index, Tensor):
        keys: list[Hashable] = index.reshape(-1).tolist()
        return keys
    return [k.item() if hasattr(k, "item") and not isinstance(k, str) else k for k in index]


def step_returns(
    step_rewards: Tensor, episode_index: GroupIndex, step_index: Tensor, gamma: float
) -> Tensor:
    """Discounted return of every step sample: ``G_k = r_k + γ·G_{k+1}`` along its episode.

    Shapes ``(B,), (B,), (B,) -> (B,)``. Samples of one episode are ordered by
    ``step_index`` (they may come in any order); the last step of an episode has
    ``G = r``. Two samples of one episode with the same step index raise ``ValueError``.
    """
    r = step_rewards.reshape(-1).to(torch.float64)
    steps = step_index.reshape(-1).tolist()
    episodes = _keys(episode_index)
    if not (len(episodes) == len(steps) == r.numel()):
        raise ValueError(
            f"{r.numel()} step rewards, {len(episodes)} episode ids, {len(steps)} step indices"
        )
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, e in enumerate(episodes):
        members[e].append(i)
    out = torch.zeros_like(r)
    for e, rows in members.items():
        rows.sort(key=lambda i: steps[i])
        if len({steps[i] for i in rows}) != len(rows):
            raise ValueError(f"episode {e!r} has two samples with the same step index")
        running = 0.0
        for i in reversed(rows):
            running = float(r[i]) + gamma * running
            out[i] = running
    return out.to(step_rewards.dtype if step_rewards.is_floating_point() else torch.float32)


def group_relative(x: Tensor, ids: Tensor, by_std: bool, epsilon: float) -> Tensor:
    """``x_i - mean_g`` (``by_std``: divided by ``std_g + ε``, unbiased std) over each
    group's samples; a group of one sample, or whose std is at most ``ε``, gives 0.

    This is ROLL's agentic group normalization: unlike the outcome estimators'
    pass-through, a lone sample has no peers to be better or worse than.
    """
    n_groups = int(ids.max().item()) + 1 if ids.numel() else 0
    count = x.new_zeros(n_groups).index_add_(0, ids, torch.ones_like(x))
    mean = x.new_zeros(n_groups).index_add_(0, ids, x) / count.clamp(min=1)
    centered = x - mean[ids]
    lone = count[ids] <= 1
    if not by_std:
        return torch.where(lone, torch.zeros_like(x), centered)
    sq = x.new_zeros(n_groups).index_add_(0, ids, centered**2)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))[ids]
    flat = lone | (std <= epsilon)
    return torch.where(flat, torch.zeros_like(x), centered / (std + epsilon))


def anchor_groups(group_index: GroupIndex, anchor_index: GroupIndex) -> Tensor:
    """Dense step-group ids ``(B,)``: samples of one episode group whose anchor states
    are identical share a step group."""
    groups, anchors = _keys(group_index), _keys(anchor_index)
    if len(groups) != len(anchors):
        raise ValueError(f"{len(groups)} group ids but {len(anchors)} anchor keys")
    return as_group_ids(list(zip(groups, anchors)))


@estimator("gigpo", needs=GIGPO_INPUTS)
def gigpo(inp: AdvantageInputs, params: AdvantageParams) -> tuple[Tensor, Tensor]:
    """GiGPO advantage of step samples (arXiv:2505.10978), as ROLL computes it.

    With ``s_i`` the sample's sequence score (``Σ_t r_it`` over valid tokens: its episode's
    return, as the shaping phase placed it), ``g(i)`` its episode group
    (``inp.group_index``: episodes of one task and seed), ``r_k`` the env reward of step
    ``k`` and ``γ = params.step_gamma``::

        A^E_i = norm_{j: g(j)=g(i)}(s)_i                           episode level
        G_i   = Σ_{k ≥ step(i)} γ^(k - step(i)) · r_k             along i's episode
        A^S_i = norm_{j: g(j)=g(i), anchor(j)=anchor(i)}(G)_i      step level
        A_i   = params.episode_weight · A^E_i + params.step_weight · A^S_i

    ``norm`` is :func:`group_relative`: ``x - mean`` over the group, divided by
    ``std + ε`` when ``params.norm_adv_by_std_in_grpo`` (ROLL's ``reward_normalization``
    methods ``mean`` and ``mean_std``); a group of one gives 0, so a step whose anchor
    state no other episode of its group visited gets no step-level term. Statistics run
    over samples, so an episode counts once per step in its group's episode mean (ROLL's
    weighting: every step sample carries its episode's score). Step groups form within an
    episode group (the paper's anchor grouping; ROLL keys them by the state alone, which
    differs only when two episode groups reach the same state).

    ``A`` is broadcast over the valid tokens of the sample's response (0 elsewhere); masks
    do not take samples out of the statistics. Returns = advantages. Needs
    ``step_rewards``, ``episode_index``, ``step_index`` and ``anchor_index``.
    """
    missing = [n for n in sorted(GIGPO_INPUTS) if getattr(inp, n) is None]
    if missing:
        raise ValueError(f"adv_estimator 'gigpo' needs {', '.join(missing)} (B,) per step sample")
    assert inp.step_rewards is not None and inp.episode_index is not None
    assert inp.step_index is not None and inp.anchor_index is not None
    s, m = _scores(inp)
    by_std, eps = params.norm_adv_by_std_in_grpo, params.epsilon
    index = _need_index(inp, "gigpo")
    episode = group_relative(s, as_group_ids(index, device=s.device), by_std, eps)
    returns = step_returns(
        inp.step_rewards.to(s.dtype), inp.episode_index, inp.step_index, params.step_gamma
    )
    step = group_relative(
        returns.to(s.device), anchor_groups(index, inp.anchor_index).to(s.device), by_std, eps
    )
    a = params.episode_weight * episode + params.step_weight * step
    adv = a.unsqueeze(-1) * m
    return adv, adv.clone()
