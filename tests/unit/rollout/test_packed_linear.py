"""Linears on oneDNN-packed weights (temper.rollout.packed_linear) and the HF engine's use."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

from temper.rollout import packed_linear
from temper.rollout.base import SamplingParams
from temper.rollout.hf import HFRolloutEngine

pytestmark = pytest.mark.skipif(
    not packed_linear.available(torch.device("cpu")), reason="this torch build has no oneDNN"
)


def test_packed_forward_equals_linear_and_is_removed_on_exit():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(24, 40), nn.ReLU(), nn.Linear(40, 8, bias=False))
    x = torch.randn(3, 5, 24)  # 3-D input, as a decoder's (batch, positions, hidden)
    expected = model(x)
    calls = []
    model[2].register_forward_hook(lambda m, i, o: calls.append(o.shape))
    with packed_linear.packed_linears(model, rows=15) as n:
        assert n == 2
        got = model(x)
        assert "forward" in model[0].__dict__
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert calls == [(3, 5, 8)]  # hooks still run on the packed layer
    assert all("forward" not in m.__dict__ for m in model)
    assert torch.equal(model(x), expected)


def test_swapped_forwards_are_removed_after_an_exception():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    with pytest.raises(RuntimeError, match="boom"), packed_linear.packed_linears(model, 2):
        raise RuntimeError("boom")
    assert all("forward" not in m.__dict__ for m in model)


def test_only_plain_float32_linears_with_their_own_forward_are_packed():
    class Adapter(nn.Linear):  # a subclass keeps its forward (adapters, quantized layers)
        pass

    own = nn.Linear(4, 4)
    own.forward = lambda x: x  # e.g. an accelerate hook: left alone
    layers = {
        "plain": nn.Linear(4, 4),
        "subclass": Adapter(4, 4),
        "bf16": nn.Linear(4, 4).to(torch.bfloat16),
        "own_forward": own,
    }
    assert {k: packed_linear.eligible(m) for k, m in layers.items()} == {
        "plain": True,
        "subclass": False,
        "bf16": False,
        "own_forward": True,  # eligible, but packed_linears skips an instance forward
    }
    with packed_linear.packed_linears(nn.ModuleList(layers.values()), 4) as n:
        assert n == 1
        assert own.forward(torch.ones(1)) == torch.ones(1)
    assert "forward" in own.__dict__  # its own forward survives the context


def test_hf_engine_generates_the_same_tokens_with_packed_linears(
    tiny_model, tiny_tokenizer, prompts, monkeypatch
):
    """Greedy decoding of 12 tokens, one prompt per ``generate`` call: the weights packed
    once for the engine call, same tokens and log-probs (to float32 summation order) with
    and without packing, and the model's linears are plain again after."""
    packed_layers = []
    real = packed_linear.packed_linears

    def counting(model, rows):
        with real(model, rows) as n:
            packed_layers.append(n)
            yield n

    monkeypatch.setattr(packed_linear, "packed_linears", contextlib.contextmanager(counting))
    params = SamplingParams(n=2, max_new_tokens=12, temperature=0.0)
    engine = HFRolloutEngine(tiny_model, tiny_tokenizer, infer_batch_size=1)
    packed = engine.generate(prompts, params)  # two generate calls, packed once
    linears = sum(type(m) is nn.Linear for m in tiny_model.modules())
    assert packed_layers == [linears]
    engine.pack_linears = False
    plain = engine.generate(prompts, params)
    assert torch.equal(packed["response_ids"], plain["response_ids"])
    torch.testing.assert_close(
        packed["rollout_log_probs"], plain["rollout_log_probs"], atol=1e-5, rtol=0
    )
    assert not any("forward" in m.__dict__ for m in tiny_model.modules())
    assert packed_layers == [linears]  # pack_linears = False: not packed
    engine.pack_linears = True
    engine.generate(prompts, SamplingParams(max_new_tokens=packed_linear.MIN_NEW_TOKENS - 1))
    assert packed_layers == [linears]  # too short to earn the reorder back
