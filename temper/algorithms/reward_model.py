"""Reward-model losses on the scalar scores of chosen/rejected pairs (Bradley–Terry).

A reward model scores a whole sequence (prompt and response) with one number ``r``; a
preference pair gives ``r_c`` for the chosen and ``r_r`` for the rejected response. Under
the Bradley–Terry model the chosen one is preferred with probability ``σ(r_c − r_r)``,
and training maximises the likelihood of the data's preferences. Every loss of
:data:`REWARD_MODEL_LOSSES` has one signature::

    loss_fn(chosen, rejected, params) -> (P,) per-pair losses

with ``chosen, rejected (P,)`` scores; the caller averages over pairs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from temper.registry import Registry


@dataclasses.dataclass(frozen=True)
class RewardLossParams:
    """``center_coef``: weight ``c`` of the centring term ``c·(r_c + r_r)²`` (Eisenstein et
    al., 2023; TRL's ``center_rewards_coefficient``), which pins the scores' free offset
    near 0 — the Bradley–Terry likelihood sees only differences. 0: none."""

    center_coef: float = 0.0

    def __post_init__(self) -> None:
        if self.center_coef < 0:
            raise ValueError(f"center_coef must be >= 0, got {self.center_coef}")


RewardLossFn = Callable[[Tensor, Tensor, RewardLossParams], Tensor]
REWARD_MODEL_LOSSES: Registry[RewardLossFn] = Registry("reward_model_loss")


def centering(chosen: Tensor, rejected: Tensor, p: RewardLossParams) -> Tensor:
    """``c·(r_c + r_r)²``, ``(P,)`` -> ``(P,)`` (0 when ``c = 0``)."""
    if not p.center_coef:
        return torch.zeros_like(chosen)
    return p.center_coef * (chosen + rejected) ** 2


@REWARD_MODEL_LOSSES.register("bradley_terry", "bt", "sigmoid")
def bradley_terry_loss(chosen: Tensor, rejected: Tensor, p: RewardLossParams) -> Tensor:
    """Bradley–Terry (Ouyang et al., 2022): ``L = −log σ(r_c − r_r) + c·(r_c + r_r)²``.
    Shapes ``(P,)`` -> ``(P,)``."""
    return -F.logsigmoid(chosen - rejected) + centering(chosen, rejected, p)


def score_pair_metrics(chosen: Tensor, rejected: Tensor) -> dict[str, Tensor]:
    """Per pair, detached (``(P,)`` each): ``rewards/chosen`` ``r_c``, ``rewards/rejected``
    ``r_r``, ``rewards/margin`` ``r_c − r_r`` and ``rewards/accuracy`` (1 where
    ``r_c > r_r``)."""
    with torch.no_grad():
        r_c, r_r = chosen.detach(), rejected.detach()
        return {
            "rewards/chosen": r_c,
            "rewards/rejected": r_r,
            "rewards/margin": r_c - r_r,
            "rewards/accuracy": (r_c > r_r).to(r_c.dtype),
        }
