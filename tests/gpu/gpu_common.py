"""The small batch every GPU test trains on (same folder: pytest puts it on sys.path).

Four prompts of 4 tokens and responses of 3, left-padded prompts and right-padded
responses of different lengths, pad id 259 (outside the tiny vocabulary's ids drawn
here); ``rows`` takes the first rows (the same values a batch of that many rows drawn
from seed 0 has).
"""

from __future__ import annotations

import torch

from temper.data.batch import Batch

PROMPT_MASK = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1]])
RESPONSE_MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]])
ADVANTAGES = torch.tensor([[1.0] * 3, [-1.0, 0, 0], [0.5, 0.5, 0], [-0.5] * 3])
PAD = 259


def tiny_batch(rows: int = 4, advantages: bool = True) -> Batch:
    """``rows`` (≤ 4) samples of random ids from seed 0, with advantages unless told."""
    g = torch.Generator().manual_seed(0)
    pm, rm = PROMPT_MASK[:rows], RESPONSE_MASK[:rows]
    data = {
        "prompt_ids": torch.where(pm > 0, torch.randint(0, 256, (rows, 4), generator=g), PAD),
        "prompt_mask": pm,
        "response_ids": torch.where(rm > 0, torch.randint(0, 256, (rows, 3), generator=g), PAD),
        "response_mask": rm,
    }
    if advantages:
        data["advantages"] = ADVANTAGES[:rows]
    return Batch.from_dict(data)
