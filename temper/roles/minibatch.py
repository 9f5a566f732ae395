"""PPO's outer loops, shared by actor and critic: epochs × (shuffled) mini-batches.

One mini-batch is one optimizer step. Shuffling is seeded by ``(seed, update index)``
so a resumed run replays the same order; metrics of the steps are averaged (``lr``:
the last step's value, which is what the schedule is at).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from temper.data.batch import Batch


def mini_batches(
    batch: Batch, mini_batch_size: int | None, epochs: int, *, shuffle: bool, seed: int
) -> Iterator[Batch]:
    """``epochs`` passes over ``batch`` in pieces of ``mini_batch_size`` samples (None: all)."""
    n = len(batch)
    size = mini_batch_size or n
    if size <= 0 or n == 0:
        raise ValueError(f"cannot cut {n} samples into mini-batches of {size}")
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = batch.select(torch.randperm(n, generator=gen)) if shuffle else batch
        yield from order.split(size)


def pair_mini_batches(
    batch: Batch, pairs_per_mini_batch: int | None, epochs: int, *, shuffle: bool, seed: int
) -> Iterator[Batch]:
    """:func:`mini_batches` of a batch of pairs (rows ``2i``, ``2i + 1``: pair ``i``),
    which shuffles and cuts whole pairs, so each mini-batch keeps its pairs' two rows
    together and in order."""
    n = len(batch) // 2
    size = pairs_per_mini_batch or n
    if size <= 0 or n == 0 or len(batch) % 2:
        raise ValueError(f"cannot cut {len(batch)} rows into mini-batches of {size} pairs")
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen) if shuffle else torch.arange(n)
        for start in range(0, n, size):
            pairs = order[start : start + size]
            yield batch.select(torch.stack([2 * pairs, 2 * pairs + 1], dim=1).reshape(-1))


def per_rank_mini_batch(mini_batch_size: int | None, dp_size: int) -> int | None:
    """A rank's share of a global ``mini_batch_size`` (config validation checks that
    ``dp_size`` divides it); ``None`` (the whole batch) stays ``None``."""
    if mini_batch_size is None or dp_size == 1:
        return mini_batch_size
    if mini_batch_size % dp_size:
        raise ValueError(f"mini_batch_size {mini_batch_size} is not a multiple of dp {dp_size}")
    return mini_batch_size // dp_size


class StepMetrics:
    """Mean over optimizer steps of each metric; ``lr`` keeps the last value."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._last: dict[str, float] = {}

    def add(self, metrics: dict[str, float]) -> None:
        for k, v in metrics.items():
            self._sums[k] = self._sums.get(k, 0.0) + float(v)
            self._counts[k] = self._counts.get(k, 0) + 1
            self._last[k] = float(v)

    def result(self, prefix: str) -> dict[str, float]:
        out = {}
        for k, total in self._sums.items():
            out[f"{prefix}/{k}"] = self._last[k] if k == "lr" else total / self._counts[k]
        return out
