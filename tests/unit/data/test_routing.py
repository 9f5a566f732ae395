"""``routed_experts`` in a batch's columns (:mod:`temper.data.routing`): an engine's
per-row token routing placed at the real columns of ``prompt ‖ response``, masked, and
padded with the batch (hand-built layouts)."""

from __future__ import annotations

import torch

from temper.data.batch import Batch
from temper.data.padded import concat_padded
from temper.data.routing import ROUTED_EXPERTS, mask_columns, pad_routing, routing_columns


def _tokens(n: int, layers: int = 1) -> torch.Tensor:
    """Token ``t``'s routing ``[[t, t + 10]]`` per layer: where each token lands is readable."""
    t = torch.arange(n)
    return torch.stack([t, t + 10], dim=-1)[:, None].expand(n, layers, 2)


def test_rows_fill_the_real_columns_in_order() -> None:
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])  # left padding
    response_mask = torch.tensor([[1, 1, 0], [1, 1, 1]])  # right padding
    # row 0: 2 prompt + 2 response tokens, 3 generated (a stop string cut the third):
    # the engine routed 2 + 3 - 1 = 4 tokens; row 1: 3 + 3 generated, 5 routed
    out = routing_columns([_tokens(4), _tokens(5)], prompt_mask, response_mask, 4)
    assert out.dtype == torch.int8 and out.shape == (2, 6, 1, 2)
    assert out[0, :, 0, 0].tolist() == [-1, 0, 1, 2, 3, -1]
    assert out[1, :, 0, 0].tolist() == [0, 1, 2, 3, 4, -1]  # the last token: no forward
    assert out[0, 1, 0].tolist() == [0, 10]


def test_a_short_row_leaves_its_last_real_columns_unrouted() -> None:
    out = routing_columns([_tokens(2)], torch.tensor([[1, 1]]), torch.tensor([[1, 1]]), 4)
    assert out[0, :, 0, 0].tolist() == [0, 1, -1, -1]


def test_wide_expert_counts_get_int16() -> None:
    out = routing_columns([_tokens(1) + 200], torch.tensor([[1]]), torch.tensor([[1]]), 256)
    assert out.dtype == torch.int16 and out[0, 0, 0].tolist() == [200, 210]


def test_mask_columns_pads_right_and_blanks_padding() -> None:
    routed = torch.arange(4).reshape(1, 4, 1, 1).expand(1, 4, 1, 2).clone()
    out = mask_columns(routed, torch.tensor([[0, 1]]), torch.tensor([[1, 1, 0]]))
    assert out[0, :, 0, 0].tolist() == [-1, 1, 2, 3, -1]


def test_pad_routing_widens_prompt_left_and_response_right() -> None:
    routed = torch.tensor([[5, 6, 7]]).reshape(1, 3, 1, 1)  # P = 2, R = 1
    out = pad_routing(routed, 2, 3, 2)
    assert out[0, :, 0, 0].tolist() == [-1, 5, 6, 7, -1]


def test_concat_padded_carries_routing_with_its_tokens() -> None:
    """Rounds of generation of different widths: each token keeps its routing."""

    def batch(p: int, r: int, start: int) -> Batch:
        cols = torch.arange(start, start + p + r).reshape(1, p + r, 1, 1)
        return Batch.from_dict(
            {
                "prompt_ids": torch.ones(1, p, dtype=torch.long),
                "prompt_mask": torch.ones(1, p, dtype=torch.long),
                "response_ids": torch.ones(1, r, dtype=torch.long),
                "response_mask": torch.ones(1, r, dtype=torch.long),
                ROUTED_EXPERTS: cols.to(torch.int8),
            }
        )

    out = concat_padded([batch(2, 1, 0), batch(1, 3, 10)])
    assert out[ROUTED_EXPERTS][:, :, 0, 0].tolist() == [[0, 1, 2, -1, -1], [-1, 10, 11, 12, 13]]
