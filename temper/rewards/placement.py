"""Where a sequence-level score goes in the (B, R) token-level reward tensor.

Convention (verl/ROLL): the score sits on the last token the policy generated — the
last 1 of ``response_mask`` — and every other position is 0, so
``token_level_scores.sum(-1) == scores``. A zero-length response (mask all 0) gets its
score at position 0: the sum still recovers it (group baselines in GRPO see it), while
the all-zero mask keeps it out of any loss.
"""

from __future__ import annotations

import torch
from torch import Tensor


def last_token_index(response_mask: Tensor) -> Tensor:
    """``(B, R) -> (B,)`` index of the last nonzero mask entry, 0 for an all-zero row."""
    positions = torch.arange(response_mask.shape[-1], device=response_mask.device)
    return (positions * (response_mask != 0).long()).argmax(dim=-1)


def place_at_last_token(scores: Tensor, response_mask: Tensor) -> Tensor:
    """``(B,), (B, R) -> (B, R)``: ``scores[i]`` at ``last_token_index(mask)[i]``, 0 elsewhere."""
    out = torch.zeros(response_mask.shape, dtype=scores.dtype, device=scores.device)
    rows = torch.arange(response_mask.shape[0], device=scores.device)
    out[rows, last_token_index(response_mask).to(scores.device)] = scores
    return out
