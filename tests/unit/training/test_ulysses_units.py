"""Ulysses' column arithmetic by hand (the collectives run in
``tests/integration/test_ulysses.py``), and what pre-flight refuses of a model."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from temper.config.errors import ConfigError
from temper.pipelines.ulysses_check import check_ulysses_model, splits_sequences
from temper.training.micro_batching import ModelInputs
from temper.training.packing import scored_positions
from temper.training.ulysses import SequenceGroup, sequence_mask, shard_columns


def group(size: int, rank: int) -> SequenceGroup:
    none: Any = None  # the column arithmetic runs no collective
    return SequenceGroup(size=size, rank=rank, group=none, data=none)


def inputs(prompt: list[int], response: list[int]) -> ModelInputs:
    """Rows of ``p`` real prompt tokens (left-padded) and ``r`` response tokens."""
    P, R = max(prompt), max(response)
    pm = torch.arange(P)[None] >= P - torch.tensor(prompt)[:, None]
    rm = torch.arange(R)[None] < torch.tensor(response)[:, None]
    mask = torch.cat([pm, rm], dim=1).long()
    ids = torch.arange(mask.numel()).view(mask.shape)
    return ModelInputs(
        input_ids=ids,
        attention_mask=mask,
        position_ids=(mask.cumsum(1) - 1).clamp(min=0),
        response_ids=ids[:, P:],
        response_len=R,
        full_response_len=R,
    )


def test_the_mask_is_causal_over_real_keys_and_never_empty() -> None:
    got = sequence_mask(torch.tensor([[0, 1, 1]]))[0, 0]
    want = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 1, 1]], dtype=torch.bool)
    assert torch.equal(got, want)


@pytest.mark.parametrize("size", [2, 3, 4])
def test_the_ranks_columns_score_every_response_token_once(size: int) -> None:
    inp = inputs([3, 1, 2], [4, 2, 1])  # L = 7 columns, r = 4
    L, r = inp.input_ids.shape[1], inp.response_len
    shards = [shard_columns(inp, group(size, rank)) for rank in range(size)]
    width = shards[0].width
    assert width * size >= L > width * (size - 1)
    scored: list[int] = []
    for rank, shard in enumerate(shards):
        assert shard.first == L - r - 1
        # the rank's columns, right-padded, with the whole sequence's positions
        ids = shard.model_inputs["input_ids"]
        assert ids.shape == (3, width)
        real = slice(rank * width, min(L, (rank + 1) * width))
        n = real.stop - real.start
        assert torch.equal(ids[:, :n], inp.input_ids[:, real])
        assert torch.equal(shard.model_inputs["position_ids"][:, :n], inp.position_ids[:, real])
        # keep: local columns whose logits score the response tokens ``responses``
        cols = shard.keep + rank * width
        assert torch.equal(cols - shard.first, torch.arange(r)[shard.responses])
        scored += (cols - shard.first).tolist()
        assert shard.context.mask.shape == (3, 1, width * size, width * size)
    assert scored == list(range(r))
    assert scored_positions(inp).shape == (3, r)


def test_preflight_refuses_a_model_ulysses_cannot_split() -> None:
    llama = {"num_attention_heads": 4, "num_key_value_heads": 2}
    check_ulysses_model(llama, "actor", 2)
    check_ulysses_model(llama, "actor", 4)  # key/value heads repeated to 4
    with pytest.raises(ConfigError) as err:
        check_ulysses_model(llama, "actor", 3)
    assert err.value.key == "actor.ulysses_sequence_parallel_size"
    assert "4 attention heads cannot be split over 3 ranks" in err.value.reason
    with pytest.raises(ConfigError, match="vision-language"):
        check_ulysses_model({**llama, "vision_config": {}}, "critic", 2)
    check_ulysses_model({**llama, "vision_config": {}}, "critic", 1)


def test_data_parallel_engines_split_sequences() -> None:
    assert splits_sequences("fsdp2") and splits_sequences("deepspeed")
    assert not splits_sequences("torch") and not splits_sequences("megatron")
