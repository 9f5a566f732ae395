"""Which models attend as temper's packed masks, segment kernel and Ulysses kernel do
(plain causal softmax over whole sequences), and what happens to the others: their
forwards stay padded, so packed and padded compute the same, and Ulysses is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from temper.config.errors import ConfigError
from temper.training.attention_kind import attention_limit
from temper.training.ulysses import check_model

from .test_packing import _batch, _engine


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ({"model_type": "llama"}, None),
        ({"model_type": "qwen2", "sliding_window": None, "use_sliding_window": False}, None),
        ({"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": False}, None),
        ({"model_type": "qwen3", "layer_types": ["full_attention"] * 2}, None),
        ({"model_type": "phi3", "sliding_window": None}, None),
        ({"model_type": "mistral", "sliding_window": 4096}, "sliding window of 4096"),
        (
            {"model_type": "qwen2", "sliding_window": 64, "use_sliding_window": True},
            "sliding window of 64",
        ),
        (
            {
                "model_type": "gemma3_text",
                "sliding_window": 512,
                "layer_types": ["sliding_attention", "full_attention"],
            },
            "sliding window of 512",
        ),
        ({"model_type": "gemma2", "attn_logit_softcapping": 50.0}, "soft-caps"),
        ({"model_type": "gpt_oss", "sliding_window": 128}, "sinks"),
        (
            {"model_type": "qwen3_next", "layer_types": ["linear_attention", "full_attention"]},
            "not attention (linear_attention)",
        ),
        ({"model_type": "mamba2"}, "state-space"),
        ({"model_type": "bloom"}, "ALiBi"),
        ({"model_type": "falcon", "alibi": True}, "ALiBi"),
        ({"model_type": "falcon", "alibi": False}, None),
        ({"model_type": "mpt", "attn_config": {"alibi": True}}, "ALiBi"),
        (
            {
                "model_type": "qwen3_5",
                "text_config": {
                    "model_type": "qwen3_5_text",
                    "layer_types": ["linear_attention", "full_attention"],
                },
            },
            "linear_attention",
        ),
    ],
)
def test_attention_limit(config, words):
    limit = attention_limit(config)
    assert (limit is None) if words is None else (words in limit)


def test_ulysses_refuses_a_model_that_is_not_plain_attention():
    cfg = {"model_type": "mistral", "sliding_window": 8, "num_attention_heads": 4}
    with pytest.raises(ConfigError, match="sliding window of 8") as err:
        check_model(cfg, "actor", 2)
    assert str(err.value).startswith("actor.ulysses_sequence_parallel_size: ")
    check_model(cfg, "actor", 1)  # no group: nothing to split


def _tiny(tmp_path: Path, family: str) -> str:
    from transformers import Gemma2Config, GptOssConfig, MistralConfig

    from temper.utils.tiny import build_tokenizer, save_seeded, tiny_fields

    tok = build_tokenizer(tmp_path)
    fields = tiny_fields(tok, sliding_window=4, head_dim=16)
    if family == "mistral":
        return save_seeded(MistralConfig(**fields), tmp_path, 0)
    if family == "gemma2":
        return save_seeded(Gemma2Config(**fields, attn_logit_softcapping=5.0), tmp_path, 0)
    layers = ["sliding_attention", "full_attention"]
    config = GptOssConfig(**fields, num_local_experts=4, num_experts_per_tok=2, layer_types=layers)
    return save_seeded(config, tmp_path, 0, drawn=("sinks",))


@pytest.mark.parametrize("family", ["mistral", "gemma2", "gpt_oss"])
def test_a_model_with_a_window_sinks_or_softcap_stays_padded(tmp_path, family):
    """A sliding window of 4 tokens (and Gemma 2's soft-cap, gpt-oss's sinks) over rows of
    up to 22: a packed row's masks would attend past the window (log-probs off by tenths
    of a nat), so the engine that would pack runs them padded and computes what the
    padded engine does."""
    path = _tiny(tmp_path, family)
    kw = {"micro": 5, "train": False}  # attn_implementation auto: gpt-oss takes eager
    padded, packable = _engine(path, packed=False, **kw), _engine(path, packed=True, **kw)
    batch = _batch(2)
    a = padded.forward(batch, temperature=0.7)["log_probs"]
    b = packable.forward(batch, temperature=0.7)["log_probs"]
    assert packable.layouts["packed"] == 0 and packable.layouts["padded"] == 1
    torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-6)
    kernel = packable.model.config._attn_implementation
    assert kernel == ("eager" if family == "gpt_oss" else "sdpa")  # not temper's segments


def test_sdpa_asked_of_a_model_without_it_is_refused_by_key(tmp_path):
    path = _tiny(tmp_path, "gpt_oss")
    with pytest.raises(ConfigError, match="model.attn_implementation: gpt_oss does not run"):
        _engine(path, packed=True, micro=5, train=False, model_kw={"attn_implementation": "sdpa"})


def test_a_model_that_drops_the_packed_layout_runs_padded(tmp_path, caplog):
    """Nemotron's decoder layers do not hand their forward keywords to attention (though
    it declares transformers' attention backend), so the segment kernel never sees a
    packed row's layout and SDPA would attend across the whole row: the engine sees the
    layout unused, discards that forward and runs padded."""
    from transformers import NemotronConfig

    from temper.utils.tiny import build_tokenizer, save_seeded, tiny_fields

    config = NemotronConfig(**tiny_fields(build_tokenizer(tmp_path), head_dim=16))
    path = save_seeded(config, tmp_path, 0)
    kw = {"micro": 5, "train": False}
    padded, packable = _engine(path, packed=False, **kw), _engine(path, packed=True, **kw)
    assert packable.model.config._attn_implementation == "temper_segments"
    batch = _batch(2)
    a = padded.forward(batch, temperature=0.7)["log_probs"]
    with caplog.at_level("WARNING"):
        b = packable.forward(batch, temperature=0.7)["log_probs"]
    torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-6)
    assert "hands the packed row's layout to 0 of its 2 attention layers" in caplog.text
    assert packable.layouts["padded"] == 1  # the discarded packed try is counted too
    mb = batch.select([0, 1, 3])  # the reference's side runs padded from now on
    cut = (mb["response_mask"] > 0)[:, : mb["response_mask"].shape[1]]
    ref_a, ref_b = padded.response_logits(mb), packable.response_logits(mb)
    torch.testing.assert_close(ref_b[cut[:, : ref_a.shape[1]]], ref_a[cut[:, : ref_a.shape[1]]])


@pytest.mark.parametrize("alibi", [False, True])
def test_a_model_outside_the_attention_interface_packs_with_masks(tmp_path, alibi):
    """Falcon attends through its own classes, not transformers' attention interface: it
    keeps SDPA and packs with the block mask (correct), except with ALiBi, whose biases
    it builds from a 2-D padding mask: then it stays padded."""
    from transformers import FalconConfig

    from temper.utils.tiny import build_tokenizer, save_seeded, tiny_fields

    fields = tiny_fields(build_tokenizer(tmp_path), alibi=alibi)
    path = save_seeded(FalconConfig(**fields), tmp_path, 0)
    kw = {"micro": 5, "train": False}
    padded, packable = _engine(path, packed=False, **kw), _engine(path, packed=True, **kw)
    assert packable.model.config._attn_implementation == "sdpa"
    batch = _batch(2)
    a = padded.forward(batch, temperature=0.7)["log_probs"]
    b = packable.forward(batch, temperature=0.7)["log_probs"]
    assert packable.layouts["packed" if not alibi else "padded"] == 1
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


def test_ulysses_refuses_a_model_outside_the_attention_interface(tmp_path):
    """Falcon's layers never call a registered attention function, so Ulysses' kernel
    would not run and each rank would attend over its own columns only."""
    from transformers import AutoModelForCausalLM, FalconConfig

    from temper.config.schema import ModelConfig
    from temper.training.spec import EngineSpec
    from temper.training.ulysses import use_ulysses
    from temper.utils.tiny import build_tokenizer, save_seeded, tiny_fields

    path = save_seeded(FalconConfig(**tiny_fields(build_tokenizer(tmp_path))), tmp_path, 0)
    model = AutoModelForCausalLM.from_pretrained(path)
    spec = EngineSpec(model=ModelConfig(path=path), device=torch.device("cpu"))
    with pytest.raises(ConfigError, match="attention interface") as err:
        use_ulysses(model, spec, 2)
    assert str(err.value).startswith("actor.ulysses_sequence_parallel_size: ")
