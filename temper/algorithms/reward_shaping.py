"""Reward shaping: normalization, clipping, whitening, length/format/overlong terms.

These are ROLL's PPO reward/advantage keys (``reward_norm``, ``reward_shift``,
``reward_scale``, ``reward_clip``, ``whiten_rewards``, ``whiten_advantages``,
``advantage_clip``, ``add_len_reward``, agentic ``reward_normalization`` and
``format_penalty``) and the DAPO overlong penalty of verl (``reward_model.
overlong_buffer``). Sequence-level rewards are ``(B,)``; token-level tensors ``(B, T)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from temper.algorithms.groups import GroupIndex, as_group_ids, group_stats
from temper.algorithms.masked import masked_whiten
from temper.registry import Registry

__all__ = [
    "REWARD_NORMALIZATION_METHODS",
    "REWARD_NORMS",
    "RunningMoments",
    "clip_with_fraction",
    "format_penalty",
    "grouped_reward_normalization",
    "length_reward",
    "masked_whiten",
    "normalize_rewards",
    "overlong_penalty",
    "reward_norm_types",
]


class RunningMoments:
    """Running mean/std of a reward stream (ROLL ``RunningMoments``, after SB3).

    ``update(x)`` merges the batch moments (Chan et al. parallel algorithm); ``std`` is
    the unbiased running std. Starts at mean 0, var 1, count ≈ 0. Checkpointable.
    """

    def __init__(self) -> None:
        self.mean = 0.0
        self.var = 1.0
        self.std = 1.0
        self.count = 1e-24

    @torch.no_grad()
    def update(self, xs: Tensor) -> None:
        n = xs.numel()
        if n == 0:
            return
        x = xs.detach().double()
        bvar, bmean = torch.var_mean(x, unbiased=False)
        delta = float(bmean) - self.mean
        tot = self.count + n
        m2 = self.var * self.count + float(bvar) * n + delta**2 * self.count * n / tot
        self.mean += delta * n / tot
        self.var = m2 / tot
        self.std = (self.var * tot / max(tot - 1, 1e-24)) ** 0.5
        self.count = tot

    def state_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "var": self.var, "std": self.std, "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mean, self.var = float(state["mean"]), float(state["var"])
        self.std, self.count = float(state["std"]), float(state["count"])


# Statistic functions: (rewards (B,), group_index, running) -> (mean (B,), std (B,))
StatFn = Callable[[Tensor, "GroupIndex | None", "RunningMoments | None"], tuple[Tensor, Tensor]]

REWARD_NORMS: Registry[StatFn] = Registry("reward_norm")


@REWARD_NORMS.register("batch")
def _batch_stats(
    r: Tensor, index: GroupIndex | None, running: RunningMoments | None
) -> tuple[Tensor, Tensor]:
    if r.numel() < 2:
        return torch.zeros_like(r), torch.ones_like(r)
    return r.mean().expand_as(r), r.std().expand_as(r)


@REWARD_NORMS.register("group")
def _group_stats(
    r: Tensor, index: GroupIndex | None, running: RunningMoments | None
) -> tuple[Tensor, Tensor]:
    if index is None:
        raise ValueError("reward_norm 'group' needs group_index (one prompt id per sample)")
    st = group_stats(r, index)
    return st.mean, st.std


@REWARD_NORMS.register("running")
def _running_stats(
    r: Tensor, index: GroupIndex | None, running: RunningMoments | None
) -> tuple[Tensor, Tensor]:
    if running is None:
        raise ValueError("reward_norm 'running' needs a RunningMoments (kept across steps)")
    running.update(r)
    return torch.full_like(r, running.mean), torch.full_like(r, running.std)


def reward_norm_types(
    reward_norm: str | None, reward_shift: bool = False, reward_scale: bool = False
) -> tuple[str | None, str | None]:
    """ROLL keys -> ``(mean_type, std_type)`` for :func:`normalize_rewards`.

    ``reward_shift`` keeps only the mean subtraction, ``reward_scale`` only the division
    by the std; both false means both. ``reward_norm: null`` disables normalization.
    """
    if reward_norm is None or reward_norm == "none":
        return None, None
    REWARD_NORMS.get(reward_norm)
    if reward_shift and reward_scale:
        raise ValueError(
            "reward_shift and reward_scale are exclusive (shift = mean only, scale = std only)"
        )
    if reward_shift:
        return reward_norm, None
    if reward_scale:
        return None, reward_norm
    return reward_norm, reward_norm


@torch.no_grad()
def normalize_rewards(
    rewards: Tensor,
    *,
    mean_type: str | None,
    std_type: str | None,
    group_index: GroupIndex | None = None,
    running: RunningMoments | None = None,
    eps: float = 1e-6,
) -> Tensor:
    """ROLL reward normalization of sequence rewards ``(B,) -> (B,)``.

    ``r' = (r - μ) / (σ + eps)`` with ``μ`` from ``mean_type`` (0 if ``None``) and ``σ``
    from ``std_type`` (no division if ``None``); each type is ``batch``, ``group`` or
    ``running`` (stds unbiased). Groups of one have mean 0, std 1; a batch of one too.
    ``running`` updates ``running`` once with this batch before using it.
    ROLL reshapes by ``n_sample`` (contiguous groups) and its std-only ``group`` mode
    broadcasts incorrectly; here groups come from ``group_index`` and every mode is
    per-sample.
    """
    r = rewards.float() if not rewards.is_floating_point() else rewards
    stats: dict[str, tuple[Tensor, Tensor]] = {}
    for t in {mean_type, std_type} - {None}:
        stats[t] = REWARD_NORMS.get(t)(r, group_index, running)  # type: ignore[index,arg-type]
    mu = stats[mean_type][0] if mean_type is not None else torch.zeros_like(r)
    out = r - mu
    if std_type is not None:
        out = out / (stats[std_type][1] + eps)
    return out


# Agentic (ROLL ``reward_normalization.method``), applied within each group.
GroupNormFn = Callable[[Tensor], Tensor]
REWARD_NORMALIZATION_METHODS: Registry[GroupNormFn] = Registry("reward_normalization.method")


@REWARD_NORMALIZATION_METHODS.register("identity")
def _identity(x: Tensor) -> Tensor:
    return x


@REWARD_NORMALIZATION_METHODS.register("mean")
def _mean_only(x: Tensor) -> Tensor:
    return x - x.mean()


@REWARD_NORMALIZATION_METHODS.register("mean_std")
def _mean_std(x: Tensor) -> Tensor:
    if x.numel() <= 1 or x.std() <= 1e-6:
        return torch.zeros_like(x)
    return (x - x.mean()) / (x.std() + 1e-6)


@REWARD_NORMALIZATION_METHODS.register("asym_clip")
def _asym_clip(x: Tensor) -> Tensor:
    return _mean_std(x).clamp(min=-1.0, max=3.0)


@torch.no_grad()
def grouped_reward_normalization(
    scores: Tensor,
    group_index: GroupIndex | None,
    method: str,
    *,
    mean_type: str | None = None,
    std_type: str | None = None,
) -> Tensor:
    """ROLL agentic reward normalization ``(B,) -> (B,)``, per group (``grouping``).

    ``identity``: ``x``; ``mean``: ``x - mean``; ``mean_std``: ``(x - mean)/(std + 1e-6)``,
    but **0** for a group of one or with ``std ≤ 1e-6`` (ROLL's rule, unlike the
    pass-through of :func:`normalize_rewards`); ``asym_clip``: ``mean_std`` clamped to
    ``[-1, 3]``. ``group_index=None`` treats the batch as one group (``grouping: batch``).

    ``mean_type`` / ``std_type`` (ROLL ≥ 2025-07's ``norm_mean_type`` / ``norm_std_type``,
    each ``batch``, ``group`` or None) replace ``method`` when either is set:
    ``(x - μ) / (σ + 1e-6)`` with ``μ``, ``σ`` from the whole batch or from the sample's
    group (``μ = 0`` when ``mean_type`` is None, no division when ``std_type`` is None),
    and 0 for a group of one or a ``σ ≤ 1e-6`` when dividing, as ROLL's
    ``agentic_reward_norm``.
    """
    x = scores.float() if not scores.is_floating_point() else scores
    if mean_type is not None or std_type is not None:
        return _typed_group_norm(x, group_index, mean_type, std_type)
    fn = REWARD_NORMALIZATION_METHODS.get(method)
    if group_index is None:
        return fn(x)
    ids = as_group_ids(group_index, device=x.device)
    out = torch.empty_like(x)
    for g in torch.unique(ids).tolist():
        sel = ids == g
        out[sel] = fn(x[sel])
    return out


def _typed_group_norm(
    x: Tensor, group_index: GroupIndex | None, mean_type: str | None, std_type: str | None
) -> Tensor:
    for name, t in (("mean_type", mean_type), ("std_type", std_type)):
        if t not in ("batch", "group", None):
            raise ValueError(f"reward_normalization {name} must be batch, group or None, got {t!r}")
    ids = (
        torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        if group_index is None
        else as_group_ids(group_index, device=x.device)
    )
    batch_mean = x.mean()
    batch_std = x.std() if x.numel() > 1 else torch.zeros((), device=x.device)
    out = torch.empty_like(x)
    for g in torch.unique(ids).tolist():
        sel = ids == g
        xs = x[sel]
        mu = batch_mean if mean_type == "batch" else xs.mean() if mean_type == "group" else 0.0
        if std_type is None:
            out[sel] = xs - mu
            continue
        sigma = batch_std if std_type == "batch" else xs.std() if xs.numel() > 1 else None
        if xs.numel() <= 1 or sigma is None or sigma.abs() <= 1e-6:
            out[sel] = torch.zeros_like(xs)
        else:
            out[sel] = (xs - mu) / (sigma + 1e-6)
    return out


def clip_with_fraction(x: Tensor, clip: float | None) -> tuple[Tensor, float]:
    """Clamp to ``[-clip, clip]`` (``reward_clip``, ``advantage_clip``); also returns the
    fraction of elements that were outside. ``clip=None`` is a no-op."""
    if clip is None:
        return x, 0.0
    if clip <= 0:
        raise ValueError(f"clip must be > 0, got {clip}")
    frac = float(((x > clip) | (x < -clip)).float().mean().item()) if x.numel() else 0.0
    return x.clamp(min=-clip, max=clip), frac


@torch.no_grad()
def length_reward(
    scores: Tensor,
    response_lengths: Tensor,
    group_index: GroupIndex,
    *,
    correct: Tensor | None = None,
    coef: float = 1.0,
) -> Tensor:
    """Length reward (Kimi k1.5, arXiv:2501.12599 §2.3.3), for ROLL ``add_len_reward``.

    Within each group, ``λ_i = 0.5 - (len_i - min_len)/(max_len - min_len)`` (``λ = 0`` when
    all lengths are equal); correct responses get ``coef·λ_i``, incorrect ones
    ``coef·min(0, λ_i)``. ``correct`` defaults to ``scores > 0``. Returns the bonus
    ``(B,)`` to add to the scores. (ROLL declares ``add_len_reward`` without a documented
    formula; this is the published one.)
    """
    lengths = response_lengths.float()
    ids = as_group_ids(group_index, device=lengths.device)
    G = int(ids.max().item()) + 1 if ids.numel() else 0
    big = torch.finfo(lengths.dtype).max
    lo = torch.full((G,), big, device=lengths.device).scatter_reduce(0, ids, lengths, "amin")
    hi = torch.full((G,), -big, device=lengths.device).scatter_reduce(0, ids, lengths, "amax")
    span = (hi - lo)[ids]
    lam = torch.where(
        span > 0, 0.5 - (lengths - lo[ids]) / span.clamp(min=1e-12), torch.zeros_like(lengths)
    )
    ok = (scores > 0) if correct is None else correct.bool()
    return coef * torch.where(ok, lam, lam.clamp(max=0.0))


def format_penalty(rewards: Tensor, format_ok: Tensor, penalty: float) -> Tensor:
    """Add ``penalty`` (a negative number, ROLL ``format_penalty``) where the response
    is not in the expected format: ``r' = r + penalty·(1 - ok)``; shapes ``(B,)``."""
    return rewards + penalty * (~format_ok.bool()).to(rewards.dtype)


def overlong_penalty(
    response_lengths: Tensor,
    max_response_length: int,
    overlong_buffer_len: int,
    penalty_factor: float = 1.0,
) -> Tensor:
    """DAPO soft overlong punishment (Yu et al. 2025, arXiv:2503.14476), ``(B,) -> (B,)``.

    With ``L_exp = max_response_length - overlong_buffer_len`` the penalty is
    ``min(0, -(len - L_exp)/overlong_buffer_len · penalty_factor)``: 0 up to ``L_exp``,
    then linear down to ``-penalty_factor`` at ``max_response_length``.
    """
    if overlong_buffer_len <= 0:
        raise ValueError(f"overlong_buffer_len must be > 0, got {overlong_buffer_len}")
    expected = max_response_length - overlong_buffer_len
    exceed = response_lengths.float() - expected
    return torch.clamp(-exceed / overlong_buffer_len * penalty_factor, max=0.0)
