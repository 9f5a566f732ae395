"""Megatron's interleaved layer layout (:mod:`temper.training.megatron_chunks`), by hand
and against Megatron-Core's own ``get_num_layers_to_build`` /
``get_transformer_layer_offset``."""

from __future__ import annotations

import pytest
import torch

from temper.training.megatron_chunks import PipelineSplit, split_of


def _table(split: PipelineSplit) -> list[list[list[int]]]:
    """``[rank][chunk] -> layers``."""
    return [[list(split.layers(r, c)) for c in range(split.vp)] for r in range(split.pp)]


def test_even_interleaved_layout_by_hand() -> None:
    # Megatron's example: 8 layers, 2 stages × 2 chunks, and 2 stages × 4 chunks
    assert _table(PipelineSplit(8, 2, 2)) == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]
    assert _table(PipelineSplit(8, 2, 4)) == [[[0], [2], [4], [6]], [[1], [3], [5], [7]]]
    assert _table(PipelineSplit(4, 2, 2)) == [[[0], [2]], [[1], [3]]]
    assert _table(PipelineSplit(6, 3)) == [[[0, 1]], [[2, 3]], [[4, 5]]]  # no interleaving
    split = PipelineSplit(12, 3, 2)
    assert _table(split) == [[[0, 1], [6, 7]], [[2, 3], [8, 9]], [[4, 5], [10, 11]]]
    # a micro-batch's path: rank 0 chunk 0, rank 1 chunk 0, rank 2 chunk 0, rank 0 chunk 1
    assert [split.virtual_stage(r, c) for c in range(2) for r in range(3)] == list(range(6))


def test_uneven_first_and_last_stages_by_hand() -> None:
    # 8 layers, 2 stages × 2 chunks, the first stage holds 2: rank 0 one layer per chunk
    assert _table(PipelineSplit(8, 2, 2, first=2)) == [[[0], [4]], [[1, 2, 3], [5, 6, 7]]]
    # 8 layers, 3 stages × 2 chunks, first and last 2 each: the middle rank holds 4
    table = _table(PipelineSplit(8, 3, 2, first=2, last=2))
    assert table == [[[0], [4]], [[1, 2], [5, 6]], [[3], [7]]]
    # 10 layers, 3 stages × 2 chunks, last stage 2: two middle ranks of 4
    assert _table(PipelineSplit(10, 3, 2, last=2)) == [
        [[0, 1], [5, 6]],
        [[2, 3], [7, 8]],
        [[4], [9]],
    ]
    # no interleaving: Megatron's uneven split as it was
    assert _table(PipelineSplit(7, 3, first=1, last=2)) == [[[0]], [[1, 2, 3, 4]], [[5, 6]]]


@pytest.mark.parametrize(
    ("split", "words"),
    [
        (PipelineSplit(6, 2, 2), "multiple of 4"),
        (PipelineSplit(8, 2, 3), "multiple of 6"),
        (PipelineSplit(8, 2, 2, first=3), "not multiples of 2"),
        (PipelineSplit(8, 2, 2, first=4, last=4), "need a middle stage"),
        (PipelineSplit(8, 2, 1, first=4, last=3), "left for no middle stage"),
        (PipelineSplit(8, 3, 2, first=2, last=2 * 3), "do not split"),
        (PipelineSplit(8, 2, 2, first=0), "at least one layer"),
    ],
)
def test_splits_that_cannot_be_made_say_why(split: PipelineSplit, words: str) -> None:
    problem = split.problem()
    assert problem is not None and words in problem[0] and problem[1]


def test_the_split_of_a_section_reads_megatron_s_fields() -> None:
    split = split_of(8, 2, 2, {"num_layers_in_first_pipeline_stage": 2})
    assert split == PipelineSplit(8, 2, 2, first=2) and split.problem() is None
    assert split_of(8, 2, None, {}) == PipelineSplit(8, 2, 1)


@pytest.mark.parametrize(
    "split",
    [
        PipelineSplit(8, 2, 2),
        PipelineSplit(8, 2, 4),
        PipelineSplit(12, 3, 2),
        PipelineSplit(8, 4, 2),
        PipelineSplit(8, 2, 2, first=2),
        PipelineSplit(8, 3, 2, first=2, last=2),
        PipelineSplit(10, 3, 2, last=2),
        PipelineSplit(16, 4, 2, first=2, last=2),
    ],
)
def test_the_layout_is_megatron_core_s(split: PipelineSplit) -> None:
    """The same layers per (rank, chunk) as Megatron-Core builds (``vp_stage``)."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    assert split.problem() is None
    config = TransformerConfig(
        num_layers=split.num_layers,
        hidden_size=8,
        num_attention_heads=2,
        pipeline_model_parallel_size=split.pp,
        virtual_pipeline_model_parallel_size=split.vp if split.vp > 1 else None,
        num_layers_in_first_pipeline_stage=split.first,
        num_layers_in_last_pipeline_stage=split.last,
        pipeline_dtype=torch.float32,
        cuda_graph_scope=[],  # the default only warns that it is deprecated
    )
    for r in range(split.pp):
        for c in range(split.vp):
            vp_stage = c if split.vp > 1 else None
            n = get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=r)
            offset = get_transformer_layer_offset(config, vp_stage=vp_stage, pp_rank=r)
            assert split.layers(r, c) == range(offset, offset + n), (r, c)
