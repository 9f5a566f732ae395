"""When a streaming rollout may start its next chunk (the bound of :mod:`streaming`'s
module docstring), and the default chunk size."""

from __future__ import annotations

from typing import Literal

Strategy = Literal["wait", "drop"]


def chunk_size(setting: int, batch_groups: int) -> int:
    """``async_training.stream_chunk``; 0 is a quarter of the batch (at least 1)."""
    return setting if setting > 0 else max(1, batch_groups // 4)


def may_start(
    *,
    strategy: Strategy,
    version: int,
    next_step: int,
    queued: int,
    chunk: int,
    batch_groups: int,
    staleness: int,
) -> bool:
    """Whether a chunk of ``chunk`` groups generated with weights ``version`` may start
    behind ``queued`` groups not yet trained, the trainer's next batch being step
    ``next_step`` (the module docstring's bounds)."""
    if strategy == "drop":
        return queued + chunk <= (staleness + 1) * batch_groups
    trained_at = next_step + (queued + chunk - 1) // batch_groups
    return version >= trained_at - staleness - 1
