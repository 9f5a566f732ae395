"""Rows of batches whose prompts and responses end at different widths, as one batch.

Rounds of generation (dynamic sampling, streaming groups) and the slices of several
rollout engines (the Ray backend) each pad their responses to their own longest: joined,
every ``(B, P)`` tensor is left-padded to the widest prompt and every ``(B, R)`` tensor
right-padded to the widest response, with the pad id for token ids and 0 elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from temper.data.batch import Batch
from temper.data.routing import ROUTED_EXPERTS, pad_routing

#: tensors padded on the left (prompts are left-padded); the rest on the right
_LEFT = ("prompt_ids", "prompt_mask")
_PAD_ID_KEYS = ("prompt_ids", "response_ids")


def concat_padded(batches: Sequence[Batch], pad_token_id: int = 0) -> Batch:
    """Rows of ``batches`` in order, their prompts and responses padded to one width
    (rounds of generation end at different lengths). ``attention_mask`` (prompt ‖
    response) is split at the prompt width, padded part by part and joined again;
    ``routed_experts`` likewise, with -1."""
    if (
        len({b["prompt_ids"].shape[1] for b in batches}) == 1
        and len({b["response_ids"].shape[1] for b in batches}) == 1
    ):
        return Batch.concat(list(batches))
    width_p = max(b["prompt_ids"].shape[1] for b in batches)
    width_r = max(b["response_ids"].shape[1] for b in batches)
    padded = []
    for b in batches:
        p, r = b["prompt_ids"].shape[1], b["response_ids"].shape[1]
        out = Batch(b.tensors.clone(recurse=False), dict(b.objects), dict(b.meta))
        for key in [str(k) for k in b.tensors.keys()]:  # noqa: SIM118 (TensorDict keys)
            t = b[key]
            if t.dim() < 2:
                continue
            fill = pad_token_id if key in _PAD_ID_KEYS else 0
            if key == "attention_mask":
                out[key] = torch.cat(
                    [_pad(t[:, :p], width_p, 0, left=True), _pad(t[:, p:], width_r, 0)], dim=1
                )
            elif key == ROUTED_EXPERTS:  # prompt ‖ response columns, -1 where none
                out[key] = pad_routing(t, p, width_p, width_r)
            elif t.shape[1] == p and key in _LEFT:
                out[key] = _pad(t, width_p, fill, left=True)
            elif t.shape[1] == r:
                out[key] = _pad(t, width_r, fill)
        padded.append(out)
    return Batch.concat(padded)


def _pad(t: Tensor, width: int, value: float, left: bool = False) -> Tensor:
    extra = width - t.shape[1]
    if extra == 0:
        return t
    pad = torch.full((t.shape[0], extra, *t.shape[2:]), value, dtype=t.dtype, device=t.device)
    return torch.cat([pad, t] if left else [t, pad], dim=1)


__all__ = ["concat_padded"]
