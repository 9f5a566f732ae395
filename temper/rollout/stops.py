"""Where a generated response ends, and the masks that follow from it.

Engines stop early for speed (EOS criteria, stop-string criteria), but a batch
keeps generating for rows that already finished, and a stop string may end in
the middle of a token. This module is the single place that decides, per row,
the last token that belongs to the response: the first EOS / stop token, or the
token that completes the first stop string (the stop string is kept). Everything
after it becomes padding with mask 0 and log-prob 0, so training never sees it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

import torch


@dataclasses.dataclass
class FinishedResponses:
    """Right-padded responses after end-of-response detection."""

    response_ids: torch.Tensor  # (B, R) long, pad id after the end
    response_mask: torch.Tensor  # (B, R) long, 1 up to and including the last token
    log_probs: torch.Tensor | None  # (B, R) float, 0 where masked
    truncated: list[bool]  # ran to max_new_tokens without EOS / stop token / stop string


def _first_stop_token(row: torch.Tensor, stop_ids: torch.Tensor) -> int | None:
    """Index of the first token of ``row`` in ``stop_ids`` (None if absent)."""
    if stop_ids.numel() == 0:
        return None
    hits = torch.isin(row, stop_ids).nonzero()
    return int(hits[0]) if hits.numel() else None


def _stop_string_end(
    ids: Sequence[int], stop: Sequence[str], tokenizer: Any, limit: int
) -> int | None:
    """Smallest token count ``k <= limit`` whose decoded prefix contains a stop string.

    "Prefix contains a stop string" is monotone in ``k``, so a binary search needs
    ~log2(R) decodes instead of R: the decode of the whole row is done first so
    rows without any stop string cost one decode.
    """

    def contains(k: int) -> bool:
        text = tokenizer.decode(list(ids[:k]), skip_special_tokens=False)
        return any(s in text for s in stop)

    if limit <= 0 or not contains(limit):
        return None
    lo, hi = 1, limit  # contains(hi) is True
    while lo < hi:
        mid = (lo + hi) // 2
        if contains(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def finish_responses(
    response_ids: torch.Tensor,
    log_probs: torch.Tensor | None,
    *,
    stop_token_ids: Collection[int],
    stop_strings: Sequence[str],
    tokenizer: Any,
    pad_token_id: int,
) -> FinishedResponses:
    """Cut every row of ``response_ids`` (B, R) at its end of response.

    The end is the first token in ``stop_token_ids`` (EOS unless ``ignore_eos``, plus
    extra stop ids) or the token completing the first of ``stop_strings``, whichever
    comes first; both are kept (mask 1). A row with neither is ``truncated``.
    """
    ids = response_ids.clone()
    rows, width = ids.shape
    stops = torch.tensor(sorted(set(stop_token_ids)), dtype=ids.dtype, device=ids.device)
    lengths: list[int] = []
    truncated: list[bool] = []
    for i in range(rows):
        end = _first_stop_token(ids[i], stops)
        length = width if end is None else end + 1
        if stop_strings:
            k = _stop_string_end(ids[i].tolist(), stop_strings, tokenizer, length)
            if k is not None:
                length, end = k, k - 1
        lengths.append(length)
        truncated.append(end is None)
    positions = torch.arange(width, device=ids.device).unsqueeze(0)
    mask = (positions < torch.tensor(lengths, device=ids.device).unsqueeze(1)).long()
    ids = ids.masked_fill(mask == 0, pad_token_id)
    if log_probs is not None:
        log_probs = log_probs.masked_fill(mask == 0, 0.0)
    return FinishedResponses(ids, mask, log_probs, truncated)


def right_pad(tensors: Sequence[torch.Tensor], value: float | int) -> torch.Tensor:
    """Concatenate (b_i, r_i) tensors along rows, right-padding to the widest."""
    width = max(t.shape[1] for t in tensors)
    padded = [torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value) for t in tensors]
    return torch.cat(padded, dim=0)
