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
        ({"model_type": "gemma2", "sliding_window": 8, "attn_logit_softcapping": 5.0}, "soft"),
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
    # a window alone is fine for the segment kernel, nothing else is
    windowed = attention_limit(config, windows=True)
    assert windowed == (None if words is None or "sliding window" in words else limit)


def test_ulysses_refuses_a_model_that_is_not_plain_attention():
    """A sliding window is Ulysses' kernel's to apply; soft-capped logits are not."""
    cfg = {"model_type": "gemma2", "attn_logit_softcapping": 50.0, "num_attention_heads": 4}
    with pytest.raises(ConfigError, match="soft-caps") as err:
        check_model(cfg, "actor", 2)
    assert str(err.value).startswith("actor.ulysses_sequence_parallel_size: ")
    check_model(cfg, "actor", 1)  # no group: nothing to split
    check_model(
        {"model_type": "mistral", "sliding_window": 8, "num_attention_heads": 4}, "actor", 2
    )


def _tiny(tmp_path: Path, family: str) -> str:
    from transformers import (
        Gemma2Config,
        Gemma3TextConfig,
        GptOssConfig,
        MistralConfig,
        Qwen2Config,
    )

    from temper.utils.tiny import build_tokenizer, save_seeded, tiny_fields

    tok = build_tokenizer(tmp_path)
    fields = tiny_fields(tok, sliding_window=4, head_dim=16)
    layers = ["sliding_attention", "full_attention"]
    config = {
        "mistral": lambda: MistralConfig(**fields),
        "gemma2": lambda: Gemma2Config(**fields, attn_logit_softcapping=5.0),
        "gemma3_text": lambda: Gemma3TextConfig(**fields, layer_types=layers),
        # Qwen2's window from layer max_window_layers on: layer 0 full, layer 1 windowed
        "qwen2": lambda: Qwen2Config(**fields, use_sliding_window=True, max_window_layers=1),
        "gpt_oss": lambda: GptOssConfig(
            **fields, num_local_experts=4, num_experts_per_tok=2, layer_types=layers
        ),
    }[family]()
    return save_seeded(config, tmp_path, 0, drawn=("sinks",) if family == "gpt_oss" else ())


def _packed_vs_padded(path: str, **model_kw):
    kw = {"micro": 5, "train": False, "model_kw": model_kw}
    padded, packable = _engine(path, packed=False, **kw), _engine(path, packed=True, **kw)
    batch = _batch(2)
    a = padded.forward(batch, temperature=0.7)["log_probs"]
    b = packable.forward(batch, temperature=0.7)["log_probs"]
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    return packable


@pytest.mark.parametrize("family", ["mistral", "gemma3_text", "qwen2"])
def test_sliding_window_layers_pack_with_the_segment_kernel(tmp_path, family):
    """A window of 4 tokens over rows of up to 22 (all layers, alternating, or from
    ``max_window_layers`` on): each layer hands the segment kernel its window, and the
    packed row computes what the padded layout does. The dense masked row (eager) has no
    window: it stays padded."""
    path = _tiny(tmp_path, family)
    packable = _packed_vs_padded(path)
    assert packable.model.config._attn_implementation == "temper_segments"
    assert packable.layouts["packed"] == 1
    eager = _packed_vs_padded(path, attn_implementation="eager")
    assert eager.layouts["padded"] == 1


def test_a_windowed_prefix_tree_trains_as_padded(tmp_path):
    """GRPO groups (a prompt shared by its responses, once in the packed row) under
    Gemma 3's alternating window of 4: log-probs, the loss and every gradient are the
    padded layout's (a response's positions go on from its prompt's end)."""
    from .test_packing import _grouped_batch

    path = _tiny(tmp_path, "gemma3_text")
    batch = _grouped_batch(7)
    runs = []
    for packed in (False, True):
        engine = _engine(path, packed=packed, micro=6)
        engine.model.train()
        out = engine._run(batch, temperature=0.8, with_entropy=False)
        mask = batch["response_mask"]
        loss = (-batch["advantages"] * out["log_probs"] * mask).sum() / mask.sum()
        loss.backward()
        runs.append((out["log_probs"], {n: p.grad for n, p in engine.model.named_parameters()}))
        assert engine.layouts["packed"] == int(packed)
    (lp_a, ga), (lp_b, gb) = runs
    torch.testing.assert_close(lp_b, lp_a, atol=1e-5, rtol=1e-5)
    for name in ga:
        torch.testing.assert_close(gb[name], ga[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss"])
def test_a_model_with_sinks_or_softcap_stays_padded(tmp_path, family):
    """Gemma 2's soft-capped logits and gpt-oss's sinks are not SDPA's softmax: a packed
    row would drop them (log-probs off by tenths of a nat), so the engine that would pack
    runs them padded and computes what the padded engine does."""
    path = _tiny(tmp_path, family)
    packable = _packed_vs_padded(path)  # attn_implementation auto: gpt-oss takes eager
    assert packable.layouts["packed"] == 0 and packable.layouts["padded"] == 1
    kernel = packable.model.config._attn_implementation
    assert kernel == ("eager" if family == "gpt_oss" else "sdpa")  # not temper's segments


def test_sdpa_asked_of_a_model_without_it_is_refused_by_key(tmp_path):
    path = _tiny(tmp_path, "gpt_oss")
    with pytest.raises(ConfigError, match="model.attn_implementation: gpt_oss does not run"):
        _engine(path, packed=True, micro=5, train=False, model_kw={"attn_implementation": "sdpa"})


def test_a_model_that_drops_the_packed_layout_packs_with_the_dense_mask(tmp_path, caplog):
    """Nemotron's decoder layers do not hand their forward keywords to attention (though
    it declares transformers' attention backend), so the segment kernel would never see a
    packed row's layout and SDPA would attend across the whole row. A tiny packed forward
    at load sees that (on every rank alike, before any sharding): the model keeps SDPA,
    packs with the block mask, and computes what the padded layout does."""
    from transformers import NemotronConfig

    from temper.utils.tiny import build_tokenizer, save_seeded, tiny_fields

    config = NemotronConfig(**tiny_fields(build_tokenizer(tmp_path), head_dim=16))
    path = save_seeded(config, tmp_path, 0)
    kw = {"micro": 5, "train": False}
    with caplog.at_level("WARNING"):
        packable = _engine(path, packed=True, **kw)
    assert "nemotron's layers do not hand their forward keywords" in caplog.text
    assert packable.model.config._attn_implementation == "sdpa"
    padded = _engine(path, packed=False, **kw)
    batch = _batch(2)
    a = padded.forward(batch, temperature=0.7)["log_probs"]
    b = packable.forward(batch, temperature=0.7)["log_probs"]
    assert packable.layouts["packed"] == 1
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)


def test_the_probe_sees_a_model_that_hands_the_layout_on(tiny_path):
    from transformers import AutoModelForCausalLM

    from temper.training.segment_attention import SEGMENT_KERNEL, reaches_every_layer, register

    register()
    model = AutoModelForCausalLM.from_pretrained(tiny_path, attn_implementation=SEGMENT_KERNEL)
    assert reaches_every_layer(model)


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


def test_check_refuses_what_loading_would():
    """Pre-flight reads config.json: SDPA asked of gpt-oss, and Ulysses on a family outside
    the attention interface, are refused at ``temper check``, before any load."""
    from temper.pipelines.model_files import check_sdpa

    with pytest.raises(ConfigError, match="model.attn_implementation: gpt_oss does not run"):
        check_sdpa({"model_type": "gpt_oss"}, "sdpa")
    check_sdpa({"model_type": "gpt_oss"}, "auto")  # auto picks eager
    check_sdpa({"model_type": "llama"}, "sdpa")
    check_sdpa({"model_type": "remote_thing"}, "sdpa")  # remote code decides when it loads
    with pytest.raises(ConfigError, match="attention interface"):
        check_model({"model_type": "falcon", "num_attention_heads": 4}, "critic", 2)
