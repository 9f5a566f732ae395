"""Ulysses' column arithmetic by hand (the collectives run in
``tests/integration/test_ulysses.py``), and what pre-flight refuses of a model."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from temper.config.errors import ConfigError
from temper.pipelines.ulysses_check import splits_sequences
from temper.training.micro_batching import ModelInputs
from temper.training.packing import pack, plan_packing, scored_positions
from temper.training.ulysses import (
    PACKED_KERNEL,
    ULYSSES_KERNEL,
    SequenceGroup,
    check_model,
    packed_rows,
    padded_rows,
    rank_columns,
    sequence_mask,
    shard_columns,
    split_language_model,
    use_ulysses,
)


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


def test_padded_rows_rotate_their_padding_last_and_attend_causally() -> None:
    inp = inputs([3, 1, 2], [4, 2, 1])  # L = 7 columns, r = 4
    valid = scored_positions(inp)
    rows = padded_rows(inp, valid)
    assert rows.mask is None  # every row's tokens are contiguous once rotated
    lengths = inp.attention_mask.sum(dim=1)
    for i in range(3):
        real = inp.input_ids[i][inp.attention_mask[i] > 0]
        assert torch.equal(rows.input_ids[i, : len(real)], real)
        assert torch.equal(rows.position_ids[i, : len(real)], torch.arange(int(lengths[i])))
    # the logits at a scored column predict the token in the next one
    assert torch.equal(rows.input_ids[rows.row, rows.column + 1], rows.label)
    assert torch.equal(rows.label, inp.response_ids[valid.mask])
    # a gap inside a row keeps an explicit mask: causal over real keys, never empty
    inp.attention_mask[1, 3] = 0  # row 1: prompt at column 2, response at 3 (now a gap), 4
    gap = padded_rows(inp, scored_positions(inp))
    assert gap.mask is not None and gap.mask.shape == (3, 1, 7, 7)
    rotated = gap.mask[1, 0]  # rotated by the 2 padding columns: the gap is column 1
    assert bool(rotated[2, 0]) and not bool(rotated[2, 1]) and bool(rotated[1, 1])


def test_the_explicit_mask_is_causal_over_real_keys_and_never_empty() -> None:
    got = sequence_mask(torch.tensor([[0, 1, 1]]))[0, 0]
    want = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 1, 1]], dtype=torch.bool)
    assert torch.equal(got, want)


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_every_scored_token_is_owned_by_the_rank_holding_its_logits(size: int, layout: str) -> None:
    """Rows 0 and 2 share a prompt: packed, its last token scores both first response
    tokens (one column, two owned tokens)."""
    inp = inputs([3, 1, 3], [4, 2, 1])  # L = 7 columns, r = 4
    inp.input_ids[2, :3] = inp.input_ids[0, :3]
    valid = scored_positions(inp)
    if layout == "padded":
        rows = padded_rows(inp, valid)
    else:
        plan = plan_packing(inp, share_prompts=True)
        rows = packed_rows(inp, pack(inp, PACKED_KERNEL, torch.float32, plan))
        assert plan.tokens == int(inp.attention_mask.sum()) - 3  # the prompt once
        assert rows.column.unique().numel() == rows.column.numel() - 1
    L = rows.input_ids.shape[1]
    shards = [shard_columns(rows, group(size, rank)) for rank in range(size)]
    width = -(-L // size)
    assert width * size >= L > width * (size - 1)
    owners = torch.stack([sh.owned for sh in shards]).long().sum(dim=0)
    assert torch.equal(owners, torch.ones_like(owners))  # each token by one rank
    assert rows.label.numel() == int(valid.mask.sum())
    for rank, shard in enumerate(shards):
        # the rank's columns, right-padded, with the whole rows' positions
        ids = shard.model_inputs["input_ids"]
        assert ids.shape == (rows.input_ids.shape[0], width)
        real = slice(rank * width, min(L, (rank + 1) * width))
        n = real.stop - real.start
        assert torch.equal(ids[:, :n], rows.input_ids[:, real])
        assert torch.equal(shard.model_inputs["position_ids"][:, :n], rows.position_ids[:, real])
        # the owned tokens: scored at (row, keep[at]) with their labels
        assert torch.equal(shard.keep[shard.at] + rank * width, rows.column[shard.owned])
        assert torch.equal(shard.row, rows.row[shard.owned])
        assert torch.equal(shard.label, rows.label[shard.owned])
        assert shard.context.mask is None  # causal rows, or a packed row's segments
        assert (shard.context.layout is None) == (layout == "padded")


def test_preflight_refuses_a_model_ulysses_cannot_split() -> None:
    llama = {"num_attention_heads": 4, "num_key_value_heads": 2}
    check_model(llama, "actor", 2)
    check_model(llama, "actor", 4)  # key/value heads repeated to 4
    with pytest.raises(ConfigError) as err:
        check_model(llama, "actor", 3)
    assert err.value.key == "actor.ulysses_sequence_parallel_size"
    assert "4 attention heads cannot be split over 3 ranks" in err.value.reason
    with pytest.raises(ConfigError, match="vision-language families"):
        check_model({**llama, "vision_config": {}, "model_type": "llava"}, "critic", 2)
    check_model({**llama, "vision_config": {}, "model_type": "llava"}, "critic", 1)
    # a Qwen-VL family splits its text decoder: the text config's heads count
    qwen_vl = {"model_type": "qwen2_5_vl", "vision_config": {}, "text_config": llama}
    check_model(qwen_vl, "actor", 2)
    with pytest.raises(ConfigError, match="4 attention heads"):
        check_model(qwen_vl, "actor", 3)


def test_a_model_whose_layers_drop_their_keywords_is_refused_at_load(tmp_path, tiny_path) -> None:
    """Nemotron declares transformers' attention backend, but its decoder layers do not
    pass their forward keywords on: Ulysses' kernel would never get its context. The
    engine's load refuses it by key (one line, no traceback at the first forward); a
    model that passes them on gets the kernel, and its probe leaves no trace."""
    from transformers import AutoModelForCausalLM, NemotronConfig

    from temper.config.schema import ModelConfig
    from temper.training.spec import EngineSpec
    from temper.utils.tiny import build_tokenizer, save_seeded, tiny_fields

    config = NemotronConfig(**tiny_fields(build_tokenizer(tmp_path), head_dim=16))
    path = save_seeded(config, tmp_path, 0)
    spec = EngineSpec(model=ModelConfig(path=path), device=torch.device("cpu"))
    nemotron = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa")
    with pytest.raises(ConfigError) as err:
        use_ulysses(nemotron, spec, 2)
    assert err.value.key == "actor.ulysses_sequence_parallel_size"
    assert "nemotron's decoder layers do not pass their forward keywords" in err.value.reason
    assert nemotron.config._attn_implementation == "sdpa"
    llama = AutoModelForCausalLM.from_pretrained(tiny_path, attn_implementation="sdpa")
    use_ulysses(llama, spec, 2)
    assert llama.config._attn_implementation == ULYSSES_KERNEL


def test_the_text_decoder_of_a_vl_model_gets_the_rank_columns_of_whole_rows() -> None:
    """What :func:`split_language_model` hands a VL model's text decoder: the rank's
    columns of the whole rows' embeddings and M-RoPE positions (rotated as the padded
    rows), and — Qwen3-VL's deepstack — the features of exactly the vision tokens in
    those columns, in order: over the group, each once."""
    inp = inputs([3, 1, 2], [4, 2, 1])  # L = 7, rows rotated by their left padding
    rows = padded_rows(inp, scored_positions(inp))
    R, L = inp.input_ids.shape
    embeds = inp.input_ids.float()[..., None].expand(R, L, 2)
    positions = torch.stack([inp.input_ids * k for k in (1, 10, 100)])  # (3, R, L)
    visual = torch.zeros(R, L, dtype=torch.bool)
    visual[0, 2:6] = visual[2, 4:6] = True  # vision tokens on both sides of the split
    n = int(visual.sum())
    deepstack = [torch.arange(n).float()[:, None] * s for s in (1.0, -1.0)]
    seen: list[torch.Tensor] = []
    for rank in range(2):
        got: dict[str, Any] = {}
        decoder = torch.nn.Module()
        decoder.forward = lambda got=got, **kw: got.update(kw)  # type: ignore[method-assign]
        with split_language_model(decoder, rows, group(2, rank)):
            decoder(
                inputs_embeds=embeds,
                position_ids=positions,
                attention_mask=inp.attention_mask,
                visual_pos_masks=visual,
                deepstack_visual_embeds=deepstack,
            )
        ids = rank_columns(inp.input_ids, rows, group(2, rank), fill=-1)
        shard = shard_columns(rows, group(2, rank))  # the text path's columns
        assert torch.equal(ids.clamp(min=0), shard.model_inputs["input_ids"])
        assert torch.equal(got["inputs_embeds"][..., 0], ids.clamp(min=0).float())
        assert torch.equal(got["position_ids"][1], ids.clamp(min=0) * 10)
        assert got["attention_mask"] is None
        mine = got["deepstack_visual_embeds"]
        assert len(mine[0]) == int(got["visual_pos_masks"].sum())
        assert torch.equal(mine[1], -mine[0])
        seen.append(mine[0][:, 0])
    assert seen[0].numel() and seen[1].numel()  # the split falls inside the vision tokens
    assert sorted(torch.cat(seen).tolist()) == list(range(n))


def test_data_parallel_engines_split_sequences() -> None:
    assert splits_sequences("fsdp2") and splits_sequences("deepspeed")
    assert not splits_sequences("torch") and not splits_sequences("megatron")
