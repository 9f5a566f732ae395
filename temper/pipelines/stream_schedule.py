"""When a streaming rollout may start its next chunk (the bound of :mod:`streaming`'s
module docstring), the default chunk size and the cap on groups ahead."""

from __future__ import annotations

from typing import Literal

Strategy = Literal["wait", "drop"]


def chunk_size(setting: int, batch_groups: int) -> int:
    """``async_training.stream_chunk``; 0 is a quarter of the batch (at least 1)."""
    return setting if setting > 0 else max(1, batch_groups // 4)


def ahead_cap(max_ahead_batches: float, batch_groups: int) -> int:
    """``async_training.max_ahead_batches`` in groups: ``⌊batches × B⌋`` (0: no cap)."""
    return int(max_ahead_batches * batch_groups) if max_ahead_batches > 0 else 0


def may_start(
    *,
    strategy: Strategy,
    version: int,
    next_step: int,
    queued: int,
    chunk: int,
    batch_groups: int,
    staleness: int,
    max_ahead: int = 0,
) -> bool:
    """Whether a chunk of ``chunk`` groups generated with weights ``version`` may start
    behind ``queued`` groups not yet trained, the trainer's next batch being step
    ``next_step`` (the module docstring's bounds); ``max_ahead`` > 0 caps the groups then
    waiting, ``queued + chunk <= max_ahead`` — waived while fewer than ``batch_groups``
    are queued, which the trainer's next batch needs (no deadlock)."""
    if max_ahead and queued >= batch_groups and queued + chunk > max_ahead:
        return False
    if strategy == "drop":
        return queued + chunk <= (staleness + 1) * batch_groups
    trained_at = next_step + (queued + chunk - 1) // batch_groups
    return version >= trained_at - staleness - 1
