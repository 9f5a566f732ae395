"""Worker groups: the ranks of one role, driven by the single controller.

The driver never talks to a rank directly. It asks the role's :class:`WorkerGroup` to

* ``call_all(method, …)``: run the same role method on every rank (set_total_steps,
  checkpoints, weight export — collectives that every rank must join);
* ``dispatch(method, batch, …)``: cut the batch into equal data-parallel shards, run the
  method on each rank with its shard, and concatenate the returned batches in the
  original row order (compute_log_probs, compute_values);
* ``scatter(method, batch, …)``: the same without concatenation, one result per rank
  (update: every rank returns the same globally reduced metrics).

Shards go by *data-parallel index* (``data_ranks``): ranks of a model-parallel group
(Megatron's tensor-parallel ranks) share an index and get the same shard; without model
parallelism every rank is its own index.

Shards are balanced by token count (:mod:`temper.cluster.balance`) when asked. A batch
whose size the ranks do not divide is padded with copies of its first rows whose
``response_mask`` is zeroed (they add no token to any loss or count) and the padding is
removed from the results; training updates refuse padding instead, since a padded
mini-batch would not be the configured one.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any

import torch

from temper.cluster.balance import balance_order, inverse_permutation
from temper.data.batch import Batch
from temper.training.micro_batching import real_lengths


class WorkerGroupError(RuntimeError):
    """A rank of a role failed: raised, died, or did not answer in time."""

    def __init__(self, role: str, rank: int | Sequence[int], cause: str) -> None:
        ranks = rank if isinstance(rank, int) else ", ".join(map(str, rank))
        super().__init__(f"{role} rank {ranks}: {cause}")
        self.role, self.rank, self.cause = role, rank, cause


def pad_batch(batch: Batch, multiple: int) -> tuple[Batch, int]:
    """``batch`` grown to a multiple of ``multiple`` rows with masked copies; pad count."""
    pad = -len(batch) % multiple
    if pad == 0:
        return batch, 0
    extra = batch.select([i % len(batch) for i in range(pad)])
    if "response_mask" in extra:
        extra["response_mask"] = torch.zeros_like(extra["response_mask"])
    return Batch.concat([batch, extra]), pad


def shard_batch(
    batch: Batch, world: int, *, balance: bool = False, allow_pad: bool = True
) -> tuple[list[Batch], list[int] | None, int]:
    """``world`` equal shards, the row order used (None: identity) and the pad count."""
    if len(batch) == 0:
        raise ValueError("cannot dispatch an empty batch")
    if not allow_pad and len(batch) % world:
        raise ValueError(
            f"{len(batch)} samples cannot be split evenly over {world} data-parallel ranks; "
            f"use a batch (and mini_batch_size) that is a multiple of {world}"
        )
    padded, pad = pad_batch(batch, world)
    order = None
    if balance and world > 1:
        order = balance_order(real_lengths(padded).tolist(), world)
        padded = padded.select(order)
    return padded.chunk(world), order, pad


def unshard_batch(parts: Sequence[Batch], order: list[int] | None, pad: int) -> Batch:
    """Inverse of :func:`shard_batch` on per-row results."""
    out = Batch.concat(list(parts))
    if order is not None:
        out = out.select(inverse_permutation(order))
    return out.slice(0, len(out) - pad) if pad else out


class WorkerGroup(abc.ABC):
    """The ranks of one role (``actor``, ``critic``, ``reference``)."""

    role: str
    world_size: int
    # rank r's data-parallel index (ranks with one index compute on the same samples);
    # None: every rank its own
    data_ranks: list[int] | None = None

    @property
    def data_size(self) -> int:
        """Number of distinct data shards (the role's data-parallel size)."""
        return self.world_size if self.data_ranks is None else max(self.data_ranks) + 1

    def _rank_args(self, shards: Sequence[Batch]) -> list[tuple[Any, ...]]:
        index = self.data_ranks or list(range(self.world_size))
        return [(shards[index[r]],) for r in range(self.world_size)]

    def _shard_results(self, results: list[Any]) -> list[Any]:
        """One result per data shard (the first rank of each index)."""
        if self.data_ranks is None:
            return results
        return [results[self.data_ranks.index(d)] for d in range(self.data_size)]

    @property
    def alive(self) -> bool:
        """The ranks are up (not shut down)."""
        return self.world_size > 0

    @abc.abstractmethod
    def call_ranks(self, method: str, per_rank_args: Sequence[tuple[Any, ...]], **kw: Any) -> list:
        """Run ``role.method(*per_rank_args[r], **kw)`` on every rank r; results by rank."""

    def call_all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """The same call on every rank (a collective on the role's process group)."""
        return self.call_ranks(method, [args] * self.world_size, **kwargs)

    def call_first(self, method: str, per_rank_args: Sequence[tuple[Any, ...]]) -> list[Any]:
        """``method`` on ranks ``0..len(per_rank_args)-1`` only (independent ranks, e.g.
        rollout engines with less work than ranks; never a collective)."""
        if not 0 < len(per_rank_args) <= self.world_size:
            raise ValueError(f"{self.role}: {len(per_rank_args)} calls for {self.world_size} ranks")
        return self.call_ranks(method, per_rank_args)

    def share(self, value: Any) -> Any:
        """``value`` as an argument every rank can read without one copy per call (Ray:
        one object-store entry; in process: the value itself)."""
        return value

    def scatter(
        self,
        method: str,
        batch: Batch,
        *,
        balance: bool = False,
        allow_pad: bool = False,
        **kw: Any,
    ) -> list[Any]:
        """``method(shard, **kw)`` on each rank's equal share of ``batch``; results by rank."""
        shards, _, _ = shard_batch(batch, self.data_size, balance=balance, allow_pad=allow_pad)
        return self.call_ranks(method, self._rank_args(shards), **kw)

    def dispatch(self, method: str, batch: Batch, *, balance: bool = True, **kw: Any) -> Batch:
        """Scatter, run, and gather the returned batches back into ``batch``'s row order."""
        shards, order, pad = shard_batch(batch, self.data_size, balance=balance)
        parts = self.call_ranks(method, self._rank_args(shards), **kw)
        return unshard_batch(self._shard_results(parts), order, pad)

    def shutdown(self) -> None:  # noqa: B027 (optional hook; nothing to release locally)
        """Release the ranks (processes, placement groups)."""
