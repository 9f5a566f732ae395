"""Balanced data-parallel shards: equal sample counts, near-equal token counts.

A data-parallel step is as slow as its slowest rank, and a rank's cost grows with its
tokens, so the rows of a batch are assigned to ranks by token count (verl
``balance_batch``, ``get_seqlen_balanced_partitions``). Two pure partitioners, both
returning ``k`` lists of row indices of equal size (``n`` divisible by ``k``):

* :func:`karmarkar_karp` — the largest differencing method for ``k`` sets, with the
  equal-size constraint of verl: rows sorted by length are taken ``k`` at a time, each
  group a partial solution of ``k`` singleton sets; the two partial solutions with the
  largest spread are merged repeatedly, pairing the heaviest sets of one with the
  lightest of the other. Near-optimal in practice.
* :func:`greedy_partition` — longest row first onto the lightest set that still has
  room. Simple, a fallback and a baseline.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence


def _check(n: int, k: int) -> None:
    if k < 1:
        raise ValueError(f"need at least one partition, got {k}")
    if n % k:
        raise ValueError(f"{n} rows cannot be split into {k} equal partitions (pad first)")


def greedy_partition(lengths: Sequence[int], k: int) -> list[list[int]]:
    """Equal-size partitions: longest first onto the lightest set with room."""
    _check(len(lengths), k)
    cap = len(lengths) // k
    sets: list[list[int]] = [[] for _ in range(k)]
    loads = [0] * k
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        j = min((j for j in range(k) if len(sets[j]) < cap), key=lambda j: (loads[j], j))
        sets[j].append(i)
        loads[j] += lengths[i]
    return [sorted(s) for s in sets]


def karmarkar_karp(lengths: Sequence[int], k: int) -> list[list[int]]:
    """Equal-size ``k``-way partition by the largest differencing method (see module)."""
    _check(len(lengths), k)
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    tie = itertools.count()
    # a partial solution: k sets as (sum, indices), kept sorted by sum descending
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []
    for start in range(0, len(order), k):
        sets = sorted(((lengths[i], [i]) for i in order[start : start + k]), reverse=True)
        heapq.heappush(heap, (-(sets[0][0] - sets[-1][0]), next(tie), sets))
    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = [(sa + sb, ia + ib) for (sa, ia), (sb, ib) in zip(a, reversed(b))]
        merged.sort(key=lambda s: s[0], reverse=True)
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), next(tie), merged))
    return [sorted(indices) for _, indices in heap[0][2]]


def balance_order(lengths: Sequence[int], k: int, *, method: str = "kk") -> list[int]:
    """A permutation of the rows such that ``k`` contiguous equal slices are balanced.

    Reorder the batch with it before an even scatter; gather, then undo it with
    :func:`inverse_permutation`.
    """
    part = karmarkar_karp if method == "kk" else greedy_partition
    sets = sorted(part(lengths, k), key=lambda s: s[0])
    return [i for s in sets for i in s]


def inverse_permutation(order: Sequence[int]) -> list[int]:
    inv = [0] * len(order)
    for pos, i in enumerate(order):
        inv[i] = pos
    return inv


def spread(lengths: Sequence[int], parts: Sequence[Sequence[int]]) -> int:
    """Heaviest minus lightest partition load (0 is perfect balance)."""
    loads = [sum(lengths[i] for i in p) for p in parts]
    return max(loads) - min(loads)
