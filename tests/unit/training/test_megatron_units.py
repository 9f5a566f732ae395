"""The megatron engine's pure parts, without a process group: HF ↔ Megatron tensor
layouts at TP 1/2/4, vocabulary-parallel log-probs and entropy, row alignment, the
RoPE frequencies, what ``check`` refuses or notes, and sharding by data-parallel index."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
import torch

from temper.config.errors import ConfigError
from temper.config.schema import LoraConfig, MegatronConfig
from temper.training.megatron_check import check_section, unapplied_options
from temper.training.megatron_convert import (
    HFLayout,
    ParamMap,
    fuse_qkv,
    hf_inv_freq,
    hf_layout,
    split_qkv,
    to_hf,
    to_megatron_shard,
)
from temper.training.megatron_vocab import (
    VocabShard,
    log_probs_and_entropy,
    vocab_logsumexp,
    vocab_sum_pi_squared,
)
from temper.training.micro_batching import ModelInputs

LAYOUT = HFLayout(
    model_type="qwen3",
    num_layers=1,
    hidden_size=8,
    num_heads=8,
    num_kv_heads=4,
    head_dim=3,
    ffn_hidden_size=12,
    vocab_size=250,
    tied_embeddings=False,
    qkv_bias=True,
    qk_norm=True,
    norm_eps=1e-6,
)


def _hf_tensors(pm: ParamMap, g: torch.Generator) -> list[torch.Tensor]:
    L, H = LAYOUT, LAYOUT.hidden_size
    shapes = {
        "qkv": [(L.num_heads * L.head_dim, H), (L.num_kv_heads * L.head_dim, H)] * 1,
        "glu": [(L.ffn_hidden_size, H)] * 2,
        "col": [(L.vocab_size, H)],
        "row": [(H, L.num_heads * L.head_dim)],
        "rep": [(H,)],
    }[pm.kind]
    if pm.kind == "qkv":
        shapes = [shapes[0], shapes[1], shapes[1]]
    return [torch.randn(s, generator=g) for s in shapes]


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("kind", ["qkv", "glu", "col", "row", "rep"])
def test_shards_merge_back_to_the_hf_tensors(kind: str, tp: int) -> None:
    names = {"qkv": ("q", "k", "v"), "glu": ("gate", "up")}.get(kind, ("w",))
    pm = ParamMap("m", names, kind)  # type: ignore[arg-type]
    hf = _hf_tensors(pm, torch.Generator().manual_seed(tp))
    shards = [to_megatron_shard(pm, hf, LAYOUT, r, tp) for r in range(tp)]
    back = dict(to_hf(pm, shards, LAYOUT))
    for name, tensor in zip(names, hf):
        assert torch.equal(back[name], tensor), name


def test_fused_qkv_is_grouped_by_kv_head_and_split_whole_groups_per_rank() -> None:
    layout = replace(LAYOUT, num_heads=4, num_kv_heads=2, head_dim=1)
    q = torch.tensor([[10.0], [11.0], [12.0], [13.0]])  # heads 0,1 → group 0; 2,3 → group 1
    k = torch.tensor([[20.0], [21.0]])
    v = torch.tensor([[30.0], [31.0]])
    fused = fuse_qkv(q, k, v, layout)
    assert fused.squeeze(-1).tolist() == [10, 11, 20, 30, 12, 13, 21, 31]
    pm = ParamMap("m", ("q", "k", "v"), "qkv")
    rank1 = to_megatron_shard(pm, [q, k, v], layout, 1, 2)
    assert rank1.squeeze(-1).tolist() == [12, 13, 21, 31]
    assert [t.squeeze(-1).tolist() for t in split_qkv(fused, layout)] == [
        [10, 11, 12, 13],
        [20, 21],
        [30, 31],
    ]


def test_glu_shard_is_the_ranks_gate_then_up_slice() -> None:
    layout = replace(LAYOUT, ffn_hidden_size=4)
    gate = torch.arange(4.0)[:, None]
    up = 10 + torch.arange(4.0)[:, None]
    pm = ParamMap("m", ("gate", "up"), "glu")
    assert to_megatron_shard(pm, [gate, up], layout, 1, 2).squeeze(-1).tolist() == [2, 3, 12, 13]


def test_vocabulary_is_padded_to_a_tp_independent_multiple() -> None:
    assert LAYOUT.padded_vocab(1) == LAYOUT.padded_vocab(2) == LAYOUT.padded_vocab(8) == 256
    assert replace(LAYOUT, vocab_size=129).padded_vocab(3) == 384  # lcm(128, 3)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_vocab_log_probs_and_entropy_equal_softmax_ones(temperature: float) -> None:
    """One rank (no group); padded vocabulary columns are ignored."""
    g = torch.Generator().manual_seed(0)
    vocab, padded = 10, 16
    logits = torch.randn(3, 5, padded, generator=g, requires_grad=True)
    targets = torch.randint(0, vocab, (3, 5), generator=g)
    shard = VocabShard.of(0, 1, padded, vocab)
    log_p, ent = log_probs_and_entropy(
        logits, targets, shard, temperature=temperature, with_entropy=True
    )
    assert ent is not None
    ref = torch.log_softmax(logits[..., :vocab] / temperature, dim=-1)
    ref_lp = ref.gather(-1, targets[..., None]).squeeze(-1)
    ref_ent = -(ref.exp() * ref).sum(-1)
    torch.testing.assert_close(log_p, ref_lp)
    torch.testing.assert_close(ent, ref_ent)
    (g1,) = torch.autograd.grad((log_p + ent).sum(), logits)
    (g2,) = torch.autograd.grad((ref_lp + ref_ent).sum(), logits)
    torch.testing.assert_close(g1, g2)
    assert torch.count_nonzero(g1[..., vocab:]) == 0


def test_vocab_sum_pi_squared_equals_the_softmax_one() -> None:
    """One rank: Σ_v π_v² over the real columns (padded ones ignored), chunk by chunk."""
    logits = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(2)) * 2
    want = (torch.softmax(logits[..., :10] / 0.7, dim=-1) ** 2).sum(-1)
    shard = VocabShard.of(0, 1, 16, 10)
    for chunk in (1, 4, 2048):
        got = vocab_sum_pi_squared(logits, shard, temperature=0.7, chunk_size=chunk)
        torch.testing.assert_close(got, want)


def _sum_pi_squared_rank(rank: int, world: int, logits: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    shard = VocabShard.of(rank, world, 16, 10, group=dist.group.WORLD)
    mine = logits[..., shard.start : shard.start + shard.width]
    return vocab_sum_pi_squared(mine, shard, temperature=0.7, chunk_size=4)


@pytest.mark.parametrize("tp", [2, 4])
def test_vocab_sum_pi_squared_at_tp_equals_tp1(tp: int) -> None:
    """Vocabulary-parallel (gloo ranks, each its slice; at TP 4 one rank holds padding
    only): the max and both sums reduced over the group give TP 1's Σπ² on every rank."""
    from temper.cluster.process_group import spawn_ranks

    logits = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(4)) * 2
    want = vocab_sum_pi_squared(logits, VocabShard.of(0, 1, 16, 10), temperature=0.7)
    for got in spawn_ranks(_sum_pi_squared_rank, tp, logits):
        torch.testing.assert_close(got, want)


def test_vocab_logsumexp_normalizes_over_the_real_ids_below_the_limit() -> None:
    """One rank: the teacher's top-k normalizer of on-policy distillation's top-k loss."""
    logits = torch.randn(2, 3, 16, generator=torch.Generator().manual_seed(1))
    shard = VocabShard.of(0, 1, 16, 10)
    torch.testing.assert_close(vocab_logsumexp(logits, shard), logits[..., :10].logsumexp(-1))
    torch.testing.assert_close(vocab_logsumexp(logits, shard, 7), logits[..., :7].logsumexp(-1))


def test_vocab_shards_of_a_rank_with_only_padding() -> None:
    assert VocabShard.of(3, 4, 384, 260) == VocabShard(288, 96, 0)
    assert VocabShard.of(2, 4, 384, 260) == VocabShard(192, 96, 68)


def test_right_align_starts_every_row_at_position_zero() -> None:
    from temper.training.megatron_head import right_align

    pad = 0
    # prompt width 3, response width 2: [pad pad a | b c], [d e f | g pad]
    ids = torch.tensor([[pad, pad, 1, 2, 3], [4, 5, 6, 7, pad]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 0]])
    inp = ModelInputs(ids, mask, mask.cumsum(1) - 1, ids[:, 3:], 2, 2)
    shifted, index = right_align(inp)
    assert shifted[0, :3].tolist() == [1, 2, 3] and shifted[1].tolist() == [4, 5, 6, 7]
    # response token 0 of row 0 (id 2) is predicted at its shifted position 0 (id 1)
    assert index.tolist() == [[0, 1], [2, 3]]


def test_rope_frequencies_are_transformers_own() -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    for params in (None, rope):
        config = LlamaConfig(hidden_size=64, num_attention_heads=4, rope_parameters=params)
        torch.testing.assert_close(hf_inv_freq(config), LlamaRotaryEmbedding(config).inv_freq)
    yarn = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0},
    )
    with pytest.raises(ValueError, match="rope_type 'yarn' is not supported"):
        hf_inv_freq(yarn)


def test_unsupported_architectures_are_named() -> None:
    from transformers import GPT2Config, Qwen2Config

    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        hf_layout(GPT2Config())
    with pytest.raises(ValueError, match="sliding-window"):
        hf_layout(Qwen2Config(use_sliding_window=True))
    layout = hf_layout(Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2))
    assert layout.qkv_bias and not layout.qk_norm and layout.head_dim == 16


# ----------------------------------------------------------------------- check


def _check(device: str = "cpu", lora: LoraConfig | None = None, **m: Any) -> list[str]:
    return check_section("actor", MegatronConfig(**m), device_type=device, lora=lora)


@pytest.mark.parametrize(
    ("m", "key", "words"),
    [
        (
            {"virtual_pipeline_model_parallel_size": 2},
            "actor.megatron.virtual_pipeline_model_parallel_size",
            "there is one stage",
        ),
        (
            {"extra": {"moe_router_enable_expert_bias": True}},
            "actor.megatron.extra.moe_router_enable_expert_bias",
            "CUDA",
        ),
        ({"tensor_model_parallel_size": 0}, "actor.megatron.tensor_model_parallel_size", "≥ 1"),
        ({"expert_tensor_parallel_size": 0}, "actor.megatron.expert_tensor_parallel_size", "≥ 1"),
        ({"recompute_granularity": "most"}, "actor.megatron.recompute_granularity", "unknown"),
    ],
)
def test_what_cannot_run_is_a_config_error_naming_the_key(m: dict, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        _check(**m)
    assert err.value.key == key and words in err.value.reason and err.value.fix


def test_context_parallel_checks_with_tp_pp_sequence_parallel_lora_and_ep() -> None:
    for notes in (
        _check(context_parallel_size=2, expert_model_parallel_size=2),
        _check(context_parallel_size=2),
        _check(context_parallel_size=4, tensor_model_parallel_size=2, sequence_parallel=True),
        _check(context_parallel_size=2, pipeline_model_parallel_size=2),
        _check(lora=LoraConfig(rank=8), context_parallel_size=2),
    ):
        assert not [n for n in notes if "context" in n]


def test_cp_comm_type_off_transformer_engine_is_a_note() -> None:
    notes = _check(context_parallel_size=2, extra={"cp_comm_type": "a2a"})
    assert [n for n in notes if n.startswith("actor.megatron.extra.cp_comm_type=a2a")]
    assert not [n for n in _check(extra={"cp_comm_type": "a2a"}) if "cp_comm_type" in n]


def test_every_degree_is_a_megatron_core_keyword() -> None:
    """The engine passes ``MegatronConfig.degrees()`` to Megatron by name."""
    pytest.importorskip("megatron.core")
    import inspect
    from dataclasses import fields

    from megatron.core import parallel_state
    from megatron.core.transformer import TransformerConfig

    from temper.config.schema import MEGATRON_DEGREES

    takes = inspect.signature(parallel_state.initialize_model_parallel).parameters
    assert set(MEGATRON_DEGREES) <= set(takes)
    assert set(MEGATRON_DEGREES) <= {f.name for f in fields(TransformerConfig)}


@pytest.mark.parametrize(
    ("lora", "role", "key", "words"),
    [
        (LoraConfig(rank=8), "critic", "model.lora.rank", "critic"),
        (LoraConfig(rank=8, dropout=0.1), "actor", "model.lora.dropout", "dropout"),
        (
            LoraConfig(rank=8, target_modules=["q_proj", "lm_head"]),
            "actor",
            "model.lora.target_modules",
            "'lm_head'",
        ),
        (
            LoraConfig(rank=8, target_modules=["linear_qkv", "router"]),
            "actor",
            "model.lora.target_modules",
            "router",
        ),
    ],
)
def test_what_megatron_lora_cannot_run_names_its_key(lora, role, key, words) -> None:
    from temper.training.megatron_lora_targets import check_lora

    with pytest.raises(ConfigError) as err:
        check_lora(lora, role)
    assert err.value.key == key and words in err.value.reason and err.value.fix


def test_lora_targets_map_onto_the_fused_modules() -> None:
    from temper.training.megatron_lora_targets import lora_projections

    every = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert lora_projections("all-linear") == every
    assert lora_projections(["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]) == every
    assert lora_projections(["v_proj", "linear_q"]) == ("q_proj", "v_proj")
    assert lora_projections(["linear_fc1_up"]) == ("up_proj",)
    # Mixtral's expert names
    assert lora_projections(["w1", "w2", "w3"]) == ("gate_proj", "up_proj", "down_proj")
    _check(lora=LoraConfig(rank=8))  # a dense actor's LoRA passes the check


def test_interleave_qkv_is_megatrons_fused_layout() -> None:
    """Per query group: its query heads, then its key and value head (fuse_qkv's rows)."""
    from transformers import Qwen2Config

    from temper.training.megatron_lora import interleave_qkv

    layout = hf_layout(Qwen2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2))
    q, k, v = torch.randn(64, 3), torch.randn(32, 3), torch.randn(32, 3)
    want = fuse_qkv(q, k, v, layout)
    got = interleave_qkv(q.t(), k.t(), v.t(), layout.num_kv_heads).t()
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_a_missing_package_names_its_key(monkeypatch) -> None:
    monkeypatch.setattr("temper.training.megatron_check.megatron_installed", lambda: False)
    with pytest.raises(ConfigError) as err:
        _check()
    assert err.value.key == "actor.strategy" and "megatron-core" in err.value.reason
    assert "temper-rl[megatron]" in err.value.fix


def test_memory_options_are_notes_not_errors() -> None:
    assert _check(use_distributed_optimizer=False) == []
    notes = _check(
        sequence_parallel=True, use_distributed_optimizer=True, recompute_granularity="full"
    )
    assert any(n.startswith("actor.megatron.use_distributed_optimizer:") for n in notes)
    assert not any("sequence_parallel" in n for n in notes)  # applied (megatron_sp)
    lora = LoraConfig(rank=4)
    with_lora = _check(lora=lora, sequence_parallel=True, tensor_model_parallel_size=2)
    assert any(
        n.startswith("actor.megatron.sequence_parallel: not applied with LoRA") for n in with_lora
    )
    assert any("recompute_granularity" in n and "CUDA" in n for n in notes)
    on_gpu = unapplied_options(MegatronConfig(recompute_granularity="full"), "cuda")
    assert not any("recompute" in n for n in on_gpu)  # applied on CUDA
    moe = unapplied_options(MegatronConfig(extra={"moe_grouped_gemm": True}), "cuda")
    assert any("moe_grouped_gemm" in n and "SequentialMLP" in n for n in moe)


def test_kernel_fusions_that_cannot_run_here_are_dropped_with_a_note() -> None:
    """ROLL's async RLVR file sets apply_rope_fusion and bias_activation_fusion: on CPU
    both are CUDA kernels, and Megatron asserts Transformer Engine for the rope fusion;
    the layers compute the same unfused, so the config builds and the note says why."""
    import importlib.util

    from temper.training.megatron_check import unavailable_fusions
    from temper.training.megatron_model import transformer_config

    extra = {
        "apply_rope_fusion": True,
        "bias_activation_fusion": True,
        "bias_dropout_fusion": False,
    }
    assert unavailable_fusions(extra, "cpu") == ["bias_activation_fusion", "apply_rope_fusion"]
    te = importlib.util.find_spec("transformer_engine") is not None
    assert unavailable_fusions(extra, "cuda") == ([] if te else ["apply_rope_fusion"])
    (note,) = [n for n in unapplied_options(MegatronConfig(extra=extra), "cpu") if "fusion" in n]
    assert "a CUDA device" in note and "computes the same" in note
    tc = transformer_config(
        LAYOUT, None, MegatronConfig(extra=extra), role="actor", device=torch.device("cpu")
    )
    assert not tc.apply_rope_fusion and not tc.bias_activation_fusion


def test_temper_check_accepts_virtual_stages_that_split_the_layers(
    tmp_path, tiny_path, capsys
) -> None:
    """PP = 2 × VPP = 2 needs 4 layers per 4 chunks: a 4-layer model checks, the 2-layer
    one is refused at check (not at the engine's start), naming the key and the fix."""
    import yaml

    from temper.cli.main import main
    from temper.utils.tiny import make_tiny_model

    four = str(make_tiny_model(tmp_path / "four", num_layers=4))
    megatron: dict[str, Any] = {
        "pipeline_model_parallel_size": 2,
        "virtual_pipeline_model_parallel_size": 2,
    }
    cfg = {
        "experiment": {"device": "cpu"},
        "model": {"path": four},
        "data": {"train_files": ["task:arithmetic?n=8"]},
        "actor": {"strategy": "megatron", "megatron": megatron},
        "resources": {"backend": "ray", "devices_per_node": 2},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["check", str(path)]) == 0
    capsys.readouterr()
    cfg["model"] = {"path": tiny_path}  # 2 layers
    path.write_text(yaml.safe_dump(cfg))
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert "actor.megatron.virtual_pipeline_model_parallel_size" in err and "2 layers" in err


def test_pipeline_stages_must_split_the_layers_evenly() -> None:
    from temper.training.megatron_check import check_divisible

    three = replace(LAYOUT, num_layers=3, num_heads=4, num_kv_heads=2)
    with pytest.raises(ConfigError) as err:
        check_divisible(three, MegatronConfig(pipeline_model_parallel_size=2), "actor")
    assert err.value.key == "actor.megatron.pipeline_model_parallel_size"
    assert "3 layers" in err.value.reason and "divides 3" in err.value.fix
    check_divisible(three, MegatronConfig(pipeline_model_parallel_size=3), "actor")
    uneven = MegatronConfig(
        pipeline_model_parallel_size=2, extra={"num_layers_in_first_pipeline_stage": 1}
    )
    check_divisible(three, uneven, "actor")  # Megatron's own uneven split: its own check


def _stage_names(layout: HFLayout, layers: list[int], first: bool, last: bool) -> set[str]:
    names = set()
    if first:
        names.add("embedding.word_embeddings.weight")
    for j, _ in enumerate(layers):
        for p in (
            "self_attention.linear_qkv.weight",
            "self_attention.linear_qkv.bias",
            "self_attention.linear_proj.weight",
            "self_attention.q_layernorm.weight",
            "self_attention.k_layernorm.weight",
            "input_layernorm.weight",
            "pre_mlp_layernorm.weight",
            "mlp.linear_fc1.weight",
            "mlp.linear_fc2.weight",
        ):
            names.add(f"decoder.layers.{j}.{p}")
    if last:
        names |= {"decoder.final_layernorm.weight", "output_layer.weight"}
    return names


def test_stage_maps_name_layers_globally_and_mark_the_tied_copy() -> None:
    """A stage numbers its layers from 0; checkpoints and export use the global index.
    A tied model's last stage holds an output layer: the tied copy, read from the
    embedding and never exported or saved."""
    from temper.training.megatron_convert import param_maps

    layout = replace(LAYOUT, num_layers=4, tied_embeddings=True)
    first = param_maps(layout, _stage_names(layout, [0, 1], True, False), layers=[0, 1], last=False)
    last = param_maps(layout, _stage_names(layout, [2, 3], False, True), layers=[2, 3], first=False)
    assert first[0].megatron == "embedding.word_embeddings.weight"
    assert not any(pm.tied_copy for pm in first)
    qkv = next(
        pm for pm in last if pm.megatron == "decoder.layers.1.self_attention.linear_qkv.weight"
    )
    assert qkv.global_name == "decoder.layers.3.self_attention.linear_qkv.weight" and qkv.layer == 3
    assert qkv.hf[0] == "layers.3.self_attn.q_proj.weight"
    (copy,) = [pm for pm in last if pm.tied_copy]
    assert copy.megatron == "output_layer.weight" and copy.hf == ("lm_head.weight",)
    whole = param_maps(
        layout, _stage_names(layout, [0, 1, 2, 3], True, True) - {"output_layer.weight"}
    )
    assert [pm.global_name for pm in whole] == [
        pm.global_name for pm in first + last if not pm.tied_copy
    ]


# ----------------------------------------------------------------------- worker groups


def test_tensor_parallel_ranks_get_the_same_shard() -> None:
    """4 ranks, TP=2: ranks 0,1 share data index 0 and ranks 2,3 index 1."""
    from collections.abc import Sequence

    from temper.cluster.base import WorkerGroup
    from temper.data.batch import Batch

    class Group(WorkerGroup):
        role, world_size, data_ranks = "actor", 4, [0, 0, 1, 1]

        def call_ranks(self, method: str, per_rank_args: Sequence[tuple[Any, ...]], **kw: Any):
            return [a[0] for a in per_rank_args]  # each rank returns its shard

    batch = Batch.from_dict(
        {"response_ids": torch.arange(8)[:, None], "response_mask": torch.ones(8, 1)}
    )
    group = Group()
    shards = group.scatter("update", batch)
    assert [s["response_ids"].flatten().tolist() for s in shards] == [
        [0, 1, 2, 3],
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [4, 5, 6, 7],
    ]
    out = group.dispatch("f", batch, balance=False)
    assert out["response_ids"].flatten().tolist() == list(range(8))
    assert math.isclose(group.data_size, 2)


def test_virtual_stages_split_the_layers_into_equal_chunks() -> None:
    """PP × VPP must divide the layers; the message names the product."""
    from temper.training.megatron_check import check_divisible

    eight = replace(LAYOUT, num_layers=8, num_heads=4, num_kv_heads=2)
    check_divisible(
        eight,
        MegatronConfig(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=4),
        "critic",
    )
    with pytest.raises(ConfigError) as err:
        check_divisible(
            eight,
            MegatronConfig(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=3),
            "critic",
        )
    assert err.value.key == "critic.megatron.virtual_pipeline_model_parallel_size"
    assert "8 layers" in err.value.reason and "multiple of 6" in err.value.reason
    assert "divides the layers" in err.value.fix
    uneven = MegatronConfig(
        pipeline_model_parallel_size=2,
        virtual_pipeline_model_parallel_size=2,
        extra={"num_layers_in_first_pipeline_stage": 3},
    )
    with pytest.raises(ConfigError) as err:
        check_divisible(eight, uneven, "actor")
    assert "not multiples of 2" in err.value.reason
    both = replace(
        uneven,
        extra={"num_layers_in_first_pipeline_stage": 4, "num_layers_in_last_pipeline_stage": 4},
    )
    with pytest.raises(ConfigError) as err:
        check_divisible(eight, both, "actor")
    assert "middle stage" in err.value.reason and "set only one" in err.value.fix


# ----------------------------------------------------------------------- sequence parallel


def test_sequence_parallel_pads_to_a_multiple_of_tp_and_picks_the_tp_summed_grads() -> None:
    from temper.training.megatron_sp import (
        pad_sequence,
        padded_length,
        tp_summed_grads,
        uses_sequence_parallel,
    )

    assert [padded_length(n, 2) for n in (1, 2, 13, 14)] == [2, 2, 14, 14]
    ids = torch.tensor([[5, 6, 7]])
    assert pad_sequence(ids, 2).tolist() == [[5, 6, 7, 0]] and pad_sequence(ids, 3) is ids

    def param(tagged: bool | None) -> torch.nn.Parameter:
        p = torch.nn.Parameter(torch.ones(2))
        p.grad = torch.zeros(2)
        if tagged is not None:
            p.sequence_parallel = tagged  # type: ignore[attr-defined]
        return p

    named = [
        ("decoder.layers.0.input_layernorm.weight", param(True)),
        ("decoder.layers.0.self_attention.q_layernorm.weight", param(None)),
        ("decoder.layers.0.mlp.linear_fc1.weight", param(None)),
        ("decoder.final_layernorm.weight", param(False)),
    ]
    both = tp_summed_grads(named, sequence_parallel=True, qk_layernorm=True)
    assert [g is named[i][1].grad for i, g in zip((0, 1), both)] == [True, True]
    assert len(both) == 2
    assert len(tp_summed_grads(named, sequence_parallel=False, qk_layernorm=True)) == 1
    assert tp_summed_grads(named, sequence_parallel=False, qk_layernorm=False) == []

    sp = MegatronConfig(tensor_model_parallel_size=2, sequence_parallel=True)
    assert uses_sequence_parallel(sp, moe=False, lora=False)
    assert not uses_sequence_parallel(sp, moe=False, lora=True)
    assert not uses_sequence_parallel(
        replace(sp, tensor_model_parallel_size=1), moe=True, lora=False
    )
    assert uses_sequence_parallel(replace(sp, sequence_parallel=False), moe=True, lora=False)
    # an MoE model under LoRA keeps it (Megatron's MoE layer needs it under TP), with
    # temper's collectives around the TP layers, so the adapters see the whole sequence
    assert uses_sequence_parallel(replace(sp, sequence_parallel=False), moe=True, lora=True)
    from temper.training.megatron_sp import host_sequence_parallel

    assert host_sequence_parallel("cpu", lora=False) and host_sequence_parallel("cuda", lora=True)
    assert not host_sequence_parallel("cuda", lora=False)


def test_a_frozen_role_gets_no_notes_on_optimizer_or_gradient_options() -> None:
    """use_distributed_optimizer is on by default: a reference or reward model has no
    optimizer, so no note says it is not applied; param_offload is still noted."""
    m = MegatronConfig(param_offload=True)
    trained = unapplied_options(m, "cpu")
    assert any("use_distributed_optimizer" in n and "param_offload" in n for n in trained)
    (frozen,) = [n for n in unapplied_options(m, "cpu", trainable=False) if "offload" in n]
    assert frozen.startswith("param_offload: not applied")
    assert not any(
        "use_distributed_optimizer" in n for n in unapplied_options(m, "cpu", trainable=False)
    )
