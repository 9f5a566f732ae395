"""Megatron's load-balanced context-parallel layout (:mod:`temper.training.megatron_cp`),
against hand-written indices."""

from __future__ import annotations

import pytest
import torch

from temper.training.megatron_cp import (
    causal_mask,
    cp_multiple,
    cp_positions,
    gathered_order,
    held_positions,
    rotary_rows,
    split_sequence,
)


def test_positions_pair_an_early_chunk_with_a_late_one() -> None:
    # 8 positions, CP = 2: four chunks of 2; rank 0 holds chunks 0 and 3, rank 1 1 and 2
    assert cp_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert cp_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    # 12 positions, CP = 3: six chunks of 2: rank r holds chunks r and 5 − r
    assert cp_positions(12, 3, 0).tolist() == [0, 1, 10, 11]
    assert cp_positions(12, 3, 1).tolist() == [2, 3, 8, 9]
    assert cp_positions(12, 3, 2).tolist() == [4, 5, 6, 7]
    # CP = 1: the whole sequence (two chunks, in order)
    assert cp_positions(4, 1, 0).tolist() == [0, 1, 2, 3]


def test_positions_need_a_multiple_of_twice_cp() -> None:
    with pytest.raises(ValueError, match="multiple of 2·CP = 4"):
        cp_positions(6, 2, 0)


def test_multiple_covers_sequence_parallel() -> None:
    assert cp_multiple(2) == 4
    assert cp_multiple(2, 2) == 4  # TP without sequence parallelism does not split positions
    assert cp_multiple(2, 2, sequence_parallel=True) == 8
    assert cp_multiple(1) == 1  # no split: no padding
    assert cp_multiple(1, 2, sequence_parallel=True) == 2


def test_split_then_gathered_order_gives_the_sequence_back() -> None:
    x = torch.arange(24).reshape(2, 12) * 10
    shares = [split_sequence(x, 3, r) for r in range(3)]
    assert shares[1].tolist() == [[20, 30, 80, 90], [140, 150, 200, 210]]
    held = torch.cat(shares, dim=1)
    assert held_positions(12, 3).tolist() == [0, 1, 10, 11, 2, 3, 8, 9, 4, 5, 6, 7]
    order = gathered_order(12, 3)
    assert torch.equal(held[:, order], x)


def test_causal_mask_by_global_positions() -> None:
    # rank 1 of CP = 2 over 8 positions holds queries at 2, 3, 4, 5; keys as gathered
    q = cp_positions(8, 2, 1)
    k = held_positions(8, 2)  # [0, 1, 6, 7, 2, 3, 4, 5]
    mask = causal_mask(q, k).int().tolist()
    assert mask == [
        [1, 1, 0, 0, 1, 0, 0, 0],  # query 2 sees 0, 1, 2
        [1, 1, 0, 0, 1, 1, 0, 0],  # query 3
        [1, 1, 0, 0, 1, 1, 1, 0],  # query 4
        [1, 1, 0, 0, 1, 1, 1, 1],  # query 5
    ]


def test_rotary_rows_are_megatrons_selection() -> None:
    # Megatron's get_pos_emb_on_this_cp_rank: view (2·CP, L/2CP, …), take [r, 2CP−1−r]
    emb = torch.arange(16.0).reshape(16, 1, 1, 1)
    for rank in range(2):
        mine = emb.view(4, 4, 1, 1, 1)[[rank, 3 - rank]].reshape(-1, 1, 1, 1)
        assert torch.equal(rotary_rows(emb, 2, rank), mine)
