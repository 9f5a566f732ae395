"""Balanced data-parallel shards: partition quality, shard/unshard round trips."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from temper.cluster.balance import (
    balance_order,
    greedy_partition,
    inverse_permutation,
    karmarkar_karp,
    spread,
)
from temper.cluster.base import WorkerGroup, shard_batch, unshard_batch
from temper.data.batch import Batch


@pytest.mark.parametrize("part", [karmarkar_karp, greedy_partition])
def test_partitions_are_equal_sized_and_cover_every_row(part) -> None:
    lengths = [random.Random(s).randint(1, 500) for s in range(24)]
    for k in (1, 2, 3, 4, 6, 8):
        parts = part(lengths, k)
        assert len(parts) == k
        assert sorted(i for p in parts for i in p) == list(range(len(lengths)))
        assert {len(p) for p in parts} == {len(lengths) // k}


def test_karmarkar_karp_balances_a_known_case() -> None:
    # 8,7,6,5,4 / ... : the perfect split of [8,7,6,5,4,3,2,1] into 2 sets of 4 is 18/18
    lengths = [8, 7, 6, 5, 4, 3, 2, 1]
    assert spread(lengths, karmarkar_karp(lengths, 2)) == 0
    # skewed lengths: contiguous chunks are far off, KK is near perfect
    rng = random.Random(0)
    lengths = sorted(rng.randint(10, 2000) for _ in range(64))
    contiguous = [list(range(i, i + 16)) for i in range(0, 64, 16)]
    assert spread(lengths, karmarkar_karp(lengths, 4)) <= 0.02 * spread(lengths, contiguous)
    assert spread(lengths, karmarkar_karp(lengths, 4)) <= spread(
        lengths, greedy_partition(lengths, 4)
    )


def test_indivisible_partition_is_refused() -> None:
    with pytest.raises(ValueError, match="equal partitions"):
        karmarkar_karp([1, 2, 3], 2)


def test_balance_order_is_a_permutation_and_inverts() -> None:
    lengths = [5, 1, 9, 3, 7, 2]
    order = balance_order(lengths, 2)
    assert sorted(order) == list(range(6))
    assert [order[i] for i in inverse_permutation(order)] == list(range(6))


def _batch(n: int) -> Batch:
    lengths = torch.arange(1, n + 1)
    R = n
    mask = (torch.arange(R)[None] < lengths[:, None]).long()
    return Batch.from_dict(
        {
            "prompt_ids": torch.ones(n, 2, dtype=torch.long),
            "prompt_mask": torch.ones(n, 2, dtype=torch.long),
            "response_ids": torch.arange(n)[:, None].expand(n, R).clone(),
            "response_mask": mask,
        },
        objects={"uid": [f"s{i}" for i in range(n)]},
    )


@pytest.mark.parametrize(("n", "world", "balance"), [(8, 2, True), (7, 2, True), (5, 4, False)])
def test_shard_pads_balances_and_round_trips(n: int, world: int, balance: bool) -> None:
    batch = _batch(n)
    shards, order, pad = shard_batch(batch, world, balance=balance)
    assert pad == -n % world
    assert len({len(s) for s in shards}) == 1
    # padding rows carry no trained token
    assert sum(int(s["response_mask"].sum()) for s in shards) == int(batch["response_mask"].sum())
    back = unshard_batch(shards, order, pad)
    assert torch.equal(back["response_ids"], batch["response_ids"])
    assert back["uid"] == batch["uid"]


def test_update_refuses_padding() -> None:
    with pytest.raises(ValueError, match="multiple of 2"):
        shard_batch(_batch(3), 2, allow_pad=False)


class InProcessGroup(WorkerGroup):
    """``world_size`` ranks that are one role object in this process: the base class's
    sharding, balancing and gathering with nothing remote."""

    def __init__(self, worker: Any, world_size: int) -> None:
        self.role, self.world_size, self.worker = "actor", world_size, worker

    def call_ranks(self, method: str, per_rank_args: Sequence[tuple[Any, ...]], **kw: Any) -> list:
        return [getattr(self.worker, method)(*args, **kw) for args in per_rank_args]


def test_group_calls_every_rank_and_dispatch_keeps_the_row_order() -> None:
    class Role:
        def double(self, batch: Batch) -> Batch:
            return Batch.from_dict({"x": batch["response_ids"] * 2})

        def hello(self, name: str) -> str:
            return f"hi {name}"

    group = InProcessGroup(Role(), world_size=2)
    assert group.call_all("hello", "you") == ["hi you", "hi you"]
    out = group.dispatch("double", _batch(5))  # balanced shards, one padding row
    assert torch.equal(out["x"], _batch(5)["response_ids"] * 2)
