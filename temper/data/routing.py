"""Where a batch holds MoE routing: ``routed_experts`` ``(B, P + R, L, k)``.

A mixture-of-experts model's ``L`` MoE layers each send a token to ``k`` experts. A batch
holds that choice for every column of ``prompt_ids ‖ response_ids`` — the batch's own
columns, left-padded prompts, right-padded responses — as the expert indices of each
layer, ``-1`` where nothing routed the token (padding, and the last generated token,
which no forward of the rollout engine saw). The rollout engine fills it under router
replay R3 (:mod:`temper.training.router_replay` states the modes and how trainers replay
it); the functions here put an engine's routing into those columns and carry it through
padding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

#: Batch key of the routing ``(B, P + R, L, k)``, ``-1`` where none.
ROUTED_EXPERTS = "routed_experts"


def routing_dtype(num_experts: int) -> torch.dtype:
    """The smallest signed integer type holding expert indices and the ``-1`` marker."""
    return torch.int8 if num_experts <= 127 else torch.int16


def real_columns(prompt_mask: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``(B, P + R)`` bool: the columns of ``prompt ‖ response`` that hold a token."""
    return torch.cat([prompt_mask, response_mask], dim=1) > 0


def routing_columns(
    rows: Sequence[torch.Tensor],
    prompt_mask: torch.Tensor,
    response_mask: torch.Tensor,
    num_experts: int,
) -> torch.Tensor:
    """Each row's token routing in the batch's columns.

    ``rows[i]`` ``(T_i, L, k)``: the routing of row ``i``'s tokens in sequence order —
    its prompt tokens, then its response tokens (an engine routes ``p_i + g_i - 1`` of
    them: it never runs the last of its ``g_i`` generated tokens through the model).
    Token ``t`` goes to the ``t``-th real column of ``prompt_mask ‖ response_mask``
    ``(B, P + R)``; real columns past ``T_i``, padding, and tokens past the last real
    column (generated, then cut at a stop string) get ``-1``. Returns ``(B, P + R, L, k)``
    of :func:`routing_dtype`."""
    real = real_columns(prompt_mask, response_mask).cpu()
    if len(rows) != real.shape[0]:
        raise ValueError(f"routing of {len(rows)} rows for a batch of {real.shape[0]}")
    shape = rows[0].shape[1:] if rows else (0, 0)
    out = torch.full((*real.shape, *shape), -1, dtype=routing_dtype(num_experts))
    for i, tokens in enumerate(rows):
        columns = real[i].nonzero().squeeze(1)
        n = min(len(columns), tokens.shape[0])
        out[i, columns[:n]] = tokens[:n].to(out.dtype)
    return out


def mask_columns(
    routed: torch.Tensor, prompt_mask: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """``routed`` ``(B, C, L, k)`` in the batch's column layout (``C ≤ P + R``: the
    columns a generation reached), right-padded to ``P + R`` columns, ``-1`` at every
    column that holds no token."""
    real = real_columns(prompt_mask, response_mask).to(routed.device)
    extra = real.shape[1] - routed.shape[1]
    if extra < 0:
        raise ValueError(f"routing of {routed.shape[1]} columns for {real.shape[1]}")
    padded = torch.nn.functional.pad(routed, (0, 0, 0, 0, 0, extra), value=-1)
    return padded.masked_fill(~real[..., None, None], -1)


def pad_routing(routed: torch.Tensor, prompt: int, width_p: int, width_r: int) -> torch.Tensor:
    """``routed`` ``(B, P + R, L, k)`` of a batch with ``prompt`` = ``P`` prompt columns,
    padded to ``width_p`` prompt columns (on the left) and ``width_r`` response columns
    (on the right) with ``-1``, as its prompts and responses are."""
    left, right = width_p - prompt, width_r - (routed.shape[1] - prompt)
    if left < 0 or right < 0:
        raise ValueError("pad_routing only widens")
    return torch.nn.functional.pad(routed, (0, 0, 0, 0, left, right), value=-1)


__all__ = [
    "ROUTED_EXPERTS",
    "mask_columns",
    "pad_routing",
    "real_columns",
    "routing_columns",
    "routing_dtype",
]
