"""Clipped value-function loss for the PPO critic."""

from __future__ import annotations

import torch
from torch import Tensor

from temper.algorithms.aggregation import LossAggregator
from temper.algorithms.masked import masked_mean


def value_loss(
    vpreds: Tensor,
    returns: Tensor,
    old_values: Tensor,
    response_mask: Tensor,
    agg: LossAggregator,
    cliprange_value: float | None = 0.5,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO value loss with value clipping (verl ``critic.cliprange_value``, ROLL ``value_clip``).

    Shapes: ``vpreds, returns, old_values, response_mask (B, T)`` -> scalar.
    Formula: ``v_c = clip(v, V_old - ε_v, V_old + ε_v)``,
    ``L = ½·agg(max((v - R)², (v_c - R)²))``; ``cliprange_value=None`` gives
    ``½·agg((v - R)²)``. Metrics: ``vf_loss``, ``vf_clipfrac`` (share of tokens where the
    clipped error is the larger one), ``vpred_mean``.
    """
    err = (vpreds - returns) ** 2
    if cliprange_value is None:
        losses = err
        clipfrac = torch.zeros((), device=vpreds.device)
    else:
        v_c = old_values + torch.clamp(vpreds - old_values, -cliprange_value, cliprange_value)
        err_c = (v_c - returns) ** 2
        losses = torch.maximum(err, err_c)
        clipfrac = masked_mean((err_c > err).float(), response_mask)
    loss = 0.5 * agg(losses, response_mask)
    return loss, {
        "vf_loss": loss.detach(),
        "vf_clipfrac": clipfrac.detach(),
        "vpred_mean": masked_mean(vpreds.detach(), response_mask),
    }
