"""Masked reductions and whitening over ``(batch, response_len)`` tensors.

All functions treat ``mask`` as 0/1 weights (bool, int or float) and never produce
inf/NaN for an empty mask: a mean over nothing is 0.
"""

from __future__ import annotations

import torch
from torch import Tensor


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``Σ values·mask`` over ``dim`` (all elements when ``None``)."""
    prod = values * mask.to(values.dtype)
    return prod.sum() if dim is None else prod.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """``Σ values·mask / Σ mask``; 0 where the mask is empty (no NaN)."""
    m = mask.to(values.dtype)
    num = (values * m).sum() if dim is None else (values * m).sum(dim=dim)
    den = m.sum() if dim is None else m.sum(dim=dim)
    return num / den.clamp(min=1.0)


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance of the masked elements (scalar).

    Unbiased (Bessel ``n/(n-1)``) by default like verl/ROLL; with ``n <= 1`` valid elements
    the variance is defined as 0 instead of raising (verl raises).
    """
    m = mask.to(values.dtype)
    n = m.sum()
    mean = masked_mean(values, m)
    var = masked_mean((values - mean) ** 2, m)
    if unbiased:
        var = torch.where(n > 1, var * n / (n - 1).clamp(min=1.0), torch.zeros_like(var))
    return var


def masked_whiten(
    values: Tensor, mask: Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> Tensor:
    """Whiten over the masked elements of the whole tensor.

    Formula: ``(x - μ) / sqrt(σ² + eps)`` with ``μ, σ²`` the masked mean and unbiased
    variance (verl ``masked_whiten`` / ROLL ``masked_whiten``). With ``shift_mean=False``
    the mean is added back. Masked-out positions are returned whitened too; callers
    multiply by the mask.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return whitened
