"""Group ids and per-group statistics.

A *group* is the set of responses to one prompt; each sample carries a group index
(``uid`` in verl, ``prompt_id`` in ROLL). Indices may be a LongTensor ``(B,)`` or any
sequence of hashable ids (strings, numpy object arrays, …); they are mapped to dense ints
``0..G-1`` in order of first appearance.

Singleton-group convention (used everywhere in this package): a group of one response
has no baseline, so its statistics are **mean 0 and std 1** and its reward passes through
unchanged. This is verl's convention for ``grpo``/``rloo``/``opo``/``gpg``/
``reinforce_plus_plus_baseline``; see each estimator's docstring.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

GroupIndex = Tensor | Sequence[Hashable]


def as_group_ids(index: GroupIndex, device: torch.device | str | None = None) -> Tensor:
    """Dense group ids ``(B,)`` int64 in ``0..G-1`` (first-appearance order)."""
    dev: torch.device | str | None = device
    if isinstance(index, Tensor):
        flat = index.reshape(-1)
        keys: list[Hashable] = flat.tolist()
        dev = device if device is not None else index.device
    else:
        keys = [k.item() if hasattr(k, "item") and not isinstance(k, str) else k for k in index]
    mapping: dict[Hashable, int] = {}
    ids = [mapping.setdefault(k, len(mapping)) for k in keys]
    return torch.tensor(ids, dtype=torch.long, device=dev)


@dataclass(frozen=True)
class GroupStats:
    """Per-sample group statistics, each ``(B,)``.

    Attributes:
        ids: dense group id of each sample.
        count: size of the sample's group.
        mean: group mean (0 for singleton groups).
        std: unbiased group std (1 for singleton groups; 0 when all rewards are equal).
        sum: group sum.
    """

    ids: Tensor
    count: Tensor
    mean: Tensor
    std: Tensor
    sum: Tensor


def group_stats(scores: Tensor, index: GroupIndex) -> GroupStats:
    """Group mean/std of ``scores (B,)`` broadcast back to samples.

    ``std`` is the unbiased (Bessel) std, as ``torch.std`` in verl and ROLL.
    Singleton groups get mean 0 and std 1 (see module docstring).
    """
    ids = as_group_ids(index, device=scores.device)
    if ids.numel() != scores.numel():
        raise ValueError(
            f"group index has {ids.numel()} entries but there are {scores.numel()} scores"
        )
    x = scores.reshape(-1)
    n_groups = int(ids.max().item()) + 1 if ids.numel() else 0
    count = torch.zeros(n_groups, dtype=x.dtype, device=x.device).index_add_(
        0, ids, torch.ones_like(x)
    )
    total = torch.zeros(n_groups, dtype=x.dtype, device=x.device).index_add_(0, ids, x)
    mean = total / count.clamp(min=1)
    sq = torch.zeros(n_groups, dtype=x.dtype, device=x.device).index_add_(
        0, ids, (x - mean[ids]) ** 2
    )
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    single = count <= 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return GroupStats(ids=ids, count=count[ids], mean=mean[ids], std=std[ids], sum=total[ids])
