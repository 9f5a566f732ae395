"""The segment attention kernel (``temper_segments``): its layout by hand, and its output
and gradients equal to dense SDPA over the packed row's prefix-tree mask."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from temper.config.schema import ModelConfig
from temper.training.packing import prefix_tree_mask
from temper.training.segment_attention import (
    LAYOUT_KWARG,
    SEGMENT_KERNEL,
    segment_attention,
    segment_layout,
)

from .conftest import make_engine

# two segments: prompt [0, 1] shared by responses of rows 0 ([2, 3]) and 1 ([4]);
# prompt [5] with the response of row 2 ([6, 7, 8])
SEGMENT = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 1])
OWNER = torch.tensor([-1, -1, 0, 0, 1, -1, 2, 2, 2])


def test_layout_by_hand() -> None:
    lay = segment_layout(SEGMENT, OWNER)
    assert lay.prompt_index.tolist() == [[0, 1], [5, 0]]
    assert lay.prompt_real.tolist() == [[True, True], [True, False]]
    assert lay.response_index.tolist() == [[2, 3, 0], [4, 0, 0], [6, 7, 8]]
    assert lay.response_real.sum().item() == 6
    assert lay.response_segment.tolist() == [0, 0, 1]
    # row 1's response token (position 4) sees the prompt [0, 1] and itself
    assert lay.response_mask[1, 0, 0].tolist() == [True, True, True, False, False]
    # row 2's last token sees prompt [5] (not the padded slot) and its three tokens
    assert lay.response_mask[2, 0, 2].tolist() == [True, False, True, True, True]
    # a padded query still has a key (no empty row, so no NaN)
    assert lay.prompt_mask[1, 0, 1].any() and lay.response_mask[1, 0, 2].any()


class _Attention(torch.nn.Module):
    """What transformers' attention modules expose to an attention function."""

    is_causal = True
    num_key_value_groups = 2


def test_output_and_gradients_equal_dense_prefix_tree_attention() -> None:
    g = torch.Generator().manual_seed(0)
    T, H, Hkv, D = SEGMENT.numel(), 4, 2, 8
    q = torch.randn(1, H, T, D, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, Hkv, T, D, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, Hkv, T, D, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(1, T, H, D, generator=g, dtype=torch.float64)
    lay = segment_layout(SEGMENT, OWNER)
    got, _ = segment_attention(_Attention(), q, k, v, None, scaling=0.3, **{LAYOUT_KWARG: lay})
    grads = torch.autograd.grad((got * w).sum(), (q, k, v))
    mask = prefix_tree_mask(SEGMENT, OWNER)
    want = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=0.3, enable_gqa=True
    ).transpose(1, 2)
    want_grads = torch.autograd.grad((want * w).sum(), (q, k, v))
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    for a, b in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_prompts_only_and_no_layout_is_sdpa() -> None:
    """A row of prompts alone (no response token) and a forward without a layout (the
    padded layout, generation: transformers' sdpa)."""
    g = torch.Generator().manual_seed(1)
    seg, owner = torch.tensor([0, 0, 1]), torch.tensor([-1, -1, -1])
    q, k, v = (torch.randn(1, 2, 3, 4, generator=g, dtype=torch.float64) for _ in range(3))
    got, _ = segment_attention(
        _Attention(), q, k, v, None, **{LAYOUT_KWARG: segment_layout(seg, owner)}
    )
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=prefix_tree_mask(seg, owner))
    torch.testing.assert_close(got, want.transpose(1, 2), atol=1e-12, rtol=0)
    plain, _ = segment_attention(_Attention(), q, k, v, None)
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(plain, causal.transpose(1, 2), atol=1e-12, rtol=0)


def test_packing_loads_the_kernel_and_exports_a_plain_model(tiny_path: str, tmp_path: Path) -> None:
    """``use_remove_padding`` with sdpa trains with the segment kernel; without packing
    the model keeps sdpa; a saved model's config names no temper kernel."""
    packed = make_engine(tiny_path, model=ModelConfig(path=tiny_path, use_remove_padding=True))
    plain = make_engine(tiny_path, model=ModelConfig(path=tiny_path, use_remove_padding=False))
    assert packed._attn_impl() == SEGMENT_KERNEL
    assert plain._attn_impl() == "sdpa"
    packed.save_hf(str(tmp_path / "out"))
    assert SEGMENT_KERNEL not in (tmp_path / "out" / "config.json").read_text()
    json.loads((tmp_path / "out" / "config.json").read_text())


def test_unpacked_grouped_heads_under_a_mask_equal_sdpa_without_copying_them(
    monkeypatch,
) -> None:
    """A padded forward or a decoding step (a mask, grouped key/value heads), also with
    query rows that see no key: the same output and gradients as transformers' sdpa
    function, which copies each key/value head per query head; here they are never
    copied."""
    from transformers.integrations import sdpa_attention

    g = torch.Generator().manual_seed(2)
    B, H, Hkv, D = 3, 4, 2, 8
    # a padded forward, a decoding step, and a padded forward whose padding queries see
    # no key at all (left padding under a causal mask): no NaN, the same zeros as sdpa's
    for q_len, kv_len, empty in ((5, 5, False), (1, 7, False), (5, 5, True)):
        q = torch.randn(B, H, q_len, D, generator=g, dtype=torch.float64, requires_grad=True)
        k = torch.randn(B, Hkv, kv_len, D, generator=g, dtype=torch.float64, requires_grad=True)
        v = torch.randn(B, Hkv, kv_len, D, generator=g, dtype=torch.float64, requires_grad=True)
        mask = torch.ones(B, 1, q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)
        mask[0, :, :, :2] = False  # row 0 is left-padded
        if not empty:
            mask[0, :, :, -1] = True  # no query row is empty
        w = torch.randn(B, q_len, H, D, generator=g, dtype=torch.float64)
        want, _ = sdpa_attention.sdpa_attention_forward(_Attention(), q, k, v, mask, scaling=0.3)
        want_grads = torch.autograd.grad((want * w).sum(), (q, k, v))
        with monkeypatch.context() as m:
            m.setattr(sdpa_attention, "repeat_kv", None)  # called: a TypeError
            got, _ = segment_attention(_Attention(), q, k, v, mask, scaling=0.3)
            grads = torch.autograd.grad((got * w).sum(), (q, k, v))
        if empty:
            assert not mask[0, 0, :2].any()
            assert torch.equal(got[0, :2], torch.zeros_like(got[0, :2]))
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
        for a, b in zip(grads, want_grads, strict=True):
            assert not a.isnan().any()
            torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
