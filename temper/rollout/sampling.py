"""Drawing one token per row from a categorical distribution given by logits.

``torch.multinomial`` (what ``transformers.generate`` samples with) draws one exponential
variate per vocabulary entry; on CPU that pass costs several times the softmax, cumulative
sum and search below together (``benchmarks/hf_sampling.py``), and at a small model's
decoding step it is a visible share of the step. Inverse-transform sampling needs one
uniform variate per row instead.
"""

from __future__ import annotations

import torch


def inverse_cdf_sample(scores: torch.Tensor) -> torch.Tensor:
    """One index per row of ``scores`` (B, V), drawn from ``softmax(scores)``.

    With p = softmax(scores), F_i = Σ_{j ≤ i} p_j (accumulated in float64) and
    u = U · F_V, U ~ Uniform[0, 1) from torch's generator of ``scores``' device, the draw
    is the first i with F_i > u, so P(i) = (F_i − F_{i−1}) / F_V = p_i up to float64
    rounding. u is kept strictly below F_V, so the first such i always has F_i > F_{i−1}:
    an entry with p_i = 0 (a ``-inf`` score: filtered by top-k/top-p) is never drawn.

    Returns (B, 1) int64.
    """
    cdf = torch.softmax(scores.float(), dim=-1).cumsum(dim=-1, dtype=torch.float64)
    total = cdf[:, -1:]
    u = torch.rand(total.shape, dtype=torch.float64, device=scores.device) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, u, right=True)
