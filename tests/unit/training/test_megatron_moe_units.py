"""The megatron engine's mixture-of-experts parts without a process group: the MoE
layout of Qwen2-MoE / Qwen3-MoE / Mixtral configs, the parameter maps under expert
parallelism, what is refused (EP on a dense model, a TP that does not split the experts'
FFN, an expert TP other than TP, DeepSeek-V3) or noted,
and the router losses' micro-batch weights."""

from __future__ import annotations

import pytest
from transformers import (
    DeepseekV3Config,
    LlamaConfig,
    MixtralConfig,
    Qwen2MoeConfig,
    Qwen3MoeConfig,
)

from temper.config.errors import ConfigError
from temper.config.schema import LoraConfig, MegatronConfig
from temper.training.megatron_check import check_divisible, check_section, unapplied_options
from temper.training.megatron_convert import hf_layout, param_maps
from temper.training.megatron_moe import (
    moe_config_kwargs,
    router_loss_scales,
    unavailable_moe_options,
)

COMMON = dict(
    vocab_size=300,
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts_per_tok=2,
)


def test_qwen2_moe_layout_sparse_step_mlp_only_layers_and_shared_expert() -> None:
    cfg = Qwen2MoeConfig(
        **COMMON,
        num_experts=8,
        moe_intermediate_size=8,
        shared_expert_intermediate_size=12,
        decoder_sparse_step=2,
        mlp_only_layers=[3],
    )
    layout = hf_layout(cfg)
    assert layout.qkv_bias and not layout.qk_norm and layout.moe is not None
    # transformers: MoE where (i + 1) % step == 0 and i is not MLP-only
    assert layout.moe.moe_layers == (False, True, False, False)
    assert layout.moe.shared_ffn_hidden_size == 12 and not layout.moe.norm_topk_prob
    kwargs = moe_config_kwargs(layout.moe, {"moe_aux_loss_coeff": 0.01}, "cpu")
    assert kwargs["moe_layer_freq"] == [0, 1, 0, 0]
    assert kwargs["moe_router_pre_softmax"] is True  # top-k of the full softmax, as is
    assert kwargs["moe_shared_expert_gate"] is True and kwargs["moe_aux_loss_coeff"] == 0.01
    assert kwargs["moe_token_dispatcher_type"] == "allgather"


def test_qwen3_moe_and_mixtral_renormalise_the_top_k() -> None:
    moe = dict(num_experts=4, moe_intermediate_size=8)
    qwen3 = hf_layout(Qwen3MoeConfig(**COMMON, **moe, norm_topk_prob=True))  # as Qwen3's
    mixtral = hf_layout(MixtralConfig(**COMMON, num_local_experts=4))
    assert qwen3.qk_norm and qwen3.moe is not None and qwen3.moe.norm_topk_prob
    assert mixtral.moe is not None and mixtral.moe.norm_topk_prob
    assert mixtral.moe.ffn_hidden_size == 24 and mixtral.moe.naming == "mixtral"
    for layout in (qwen3, mixtral):
        assert layout.moe is not None
        assert moe_config_kwargs(layout.moe, {}, "cpu")["moe_router_pre_softmax"] is False


def test_deepseek_v3_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="multi-latent attention"):
        hf_layout(DeepseekV3Config())


def test_expert_parallel_maps_hold_this_ranks_experts_under_global_names() -> None:
    """EP rank 1 of 2 holds experts 2 and 3 as its local experts 0 and 1; checkpoints
    and exports name them by their global index."""
    from temper.training.megatron_moe import moe_mlp_maps

    layout = hf_layout(Qwen3MoeConfig(**COMMON, num_experts=4, moe_intermediate_size=8))
    assert layout.moe is not None
    rows = moe_mlp_maps(layout.moe, "layers.1.", 2, 1)
    fc1 = [r for r in rows if r[0].endswith("linear_fc1.weight")]
    assert [r[0] for r in fc1] == [
        "mlp.experts.local_experts.0.linear_fc1.weight",
        "mlp.experts.local_experts.1.linear_fc1.weight",
    ]
    assert [r[3] for r in fc1] == [
        "mlp.experts.local_experts.2.linear_fc1.weight",
        "mlp.experts.local_experts.3.linear_fc1.weight",
    ]
    assert fc1[0][1] == (
        "layers.1.mlp.experts.2.gate_proj.weight",
        "layers.1.mlp.experts.2.up_proj.weight",
    )
    names = {f"decoder.layers.0.{r[0]}" for r in rows}
    names |= {
        f"decoder.layers.0.{n}"
        for n in (
            "self_attention.linear_qkv.weight",
            "self_attention.linear_proj.weight",
            "self_attention.q_layernorm.weight",
            "self_attention.k_layernorm.weight",
            "input_layernorm.weight",
            "pre_mlp_layernorm.weight",
        )
    }
    maps = param_maps(layout, names, layers=[1], first=False, last=False, ep=2, ep_rank=1)
    keys = {pm.global_name for pm in maps}
    assert "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight" in keys
    assert "decoder.layers.1.mlp.router.weight" in keys


@pytest.mark.parametrize(
    ("config", "m", "key", "words"),
    [
        (
            LlamaConfig(**{k: v for k, v in COMMON.items() if k != "num_experts_per_tok"}),
            MegatronConfig(expert_model_parallel_size=2),
            "actor.megatron.expert_model_parallel_size",
            "dense",
        ),
        (
            Qwen3MoeConfig(**COMMON, num_experts=4, moe_intermediate_size=8),
            MegatronConfig(expert_model_parallel_size=3),
            "actor.megatron.expert_model_parallel_size",
            "4 experts",
        ),
        (
            Qwen3MoeConfig(**COMMON, num_experts=4, moe_intermediate_size=6),
            MegatronConfig(tensor_model_parallel_size=4),
            "actor.megatron.tensor_model_parallel_size",
            "6 expert FFN columns",
        ),
    ],
)
def test_expert_parallel_needs_an_moe_model_whose_experts_split(
    config, m, key: str, words: str
) -> None:
    with pytest.raises(ConfigError) as err:
        check_divisible(hf_layout(config), m, "actor")
    assert err.value.key == key and words in err.value.reason and err.value.fix


def test_expert_parallelism_passes_the_section_check_and_gpu_moe_options_are_notes() -> None:
    extra = {
        "moe_grouped_gemm": True,
        "moe_token_dispatcher_type": "alltoall",
        "moe_shared_expert_overlap": True,
        "moe_permute_fusion": True,
    }
    m = MegatronConfig(expert_model_parallel_size=2, extra=extra)
    notes = check_section("actor", m, device_type="cpu")
    assert any("moe_grouped_gemm" in n and "allgather" in n for n in notes)
    # LoRA on an MoE model (its experts, shared expert and attention) passes; its router
    # is not adapted, and naming it is refused
    assert check_section("actor", m, device_type="cpu", lora=LoraConfig(rank=8)) == notes
    with pytest.raises(ConfigError, match="mixture-of-experts router") as err:
        lora = LoraConfig(rank=8, target_modules=["linear_qkv", "router"])
        check_section("actor", m, device_type="cpu", lora=lora)
    assert err.value.key == "model.lora.target_modules"
    assert unavailable_moe_options(extra, "cpu") == [
        "moe_grouped_gemm",
        "moe_permute_fusion",
        "moe_shared_expert_overlap",
        "moe_token_dispatcher_type",
    ]
    assert unavailable_moe_options(extra, "cuda") == ["moe_grouped_gemm"]
    honoured = MegatronConfig(use_distributed_optimizer=False, extra={"moe_aux_loss_coeff": 0.01})
    assert unapplied_options(honoured, "cpu") == []
    with pytest.raises(ConfigError) as err:
        check_section(
            "actor",
            MegatronConfig(extra={"moe_router_load_balancing_type": "global_aux_loss"}),
            device_type="cpu",
        )
    assert err.value.key == "actor.megatron.extra.moe_router_load_balancing_type"


def test_router_losses_are_averaged_over_the_data_parallel_micro_batches() -> None:
    """Megatron: each micro-batch's router loss × 1/micro-batches, gradients averaged
    over DP; temper sums over DP, so each real micro-batch weighs 1/(all of them)."""
    assert router_loss_scales([[0, 1], [2], []], 4.0) == [0.25, 0.25, 0.0]
    assert router_loss_scales([[]], 0.0) == [0.0]


def test_check_reads_a_local_models_config_to_refuse_ep_on_a_dense_model(tmp_path) -> None:
    """``temper check`` sees a local directory's ``config.json`` (no weights) — dense or
    MoE — so EP on a dense model fails there; a hub id is left to the engine."""
    from temper.config.schema import ModelConfig
    from temper.training.megatron_check import check_experts, local_layout

    dense = tmp_path / "dense"
    LlamaConfig(**{k: v for k, v in COMMON.items() if k != "num_experts_per_tok"}).save_pretrained(
        dense
    )
    moe = tmp_path / "moe"
    Qwen3MoeConfig(**COMMON, num_experts=4, moe_intermediate_size=8).save_pretrained(moe)
    model = ModelConfig(path=str(dense))
    layout = local_layout(model, str(dense))
    assert layout is not None and layout.moe is None
    with pytest.raises(ConfigError) as err:
        check_experts(layout, MegatronConfig(expert_model_parallel_size=2), "actor")
    assert "dense" in err.value.reason
    moe_layout = local_layout(ModelConfig(path=str(moe)), str(moe))
    assert moe_layout is not None and moe_layout.moe is not None
    check_experts(moe_layout, MegatronConfig(expert_model_parallel_size=2), "actor")
    assert local_layout(model, "Qwen/Qwen3-30B-A3B") is None


def test_expert_tensor_parallel_size_splits_the_expert_ffn_and_the_shared_expert_follows_tp() -> (
    None
):
    """An MoE model at TP > 1 splits each expert over ``expert_tensor_parallel_size`` ranks
    (TP when unset; 1: whole experts) and the shared expert over TP; each must divide its
    FFN, the error naming the key that set the size; the z-loss is noted."""
    layout = hf_layout(Qwen3MoeConfig(**COMMON, num_experts=4, moe_intermediate_size=8))
    m = MegatronConfig(tensor_model_parallel_size=2, expert_model_parallel_size=2)
    check_section("actor", m, device_type="cpu")  # no error
    check_divisible(layout, m, "actor")
    for etp in (1, 2, None):
        same = MegatronConfig(tensor_model_parallel_size=2, expert_tensor_parallel_size=etp)
        check_section("actor", same, device_type="cpu")
        check_divisible(layout, same, "actor")
        assert same.expert_tp == (etp or 2)
    odd = hf_layout(Qwen3MoeConfig(**COMMON, num_experts=4, moe_intermediate_size=6))
    with pytest.raises(ConfigError) as err:  # 4 does not divide the experts' 6 columns
        check_divisible(odd, MegatronConfig(expert_tensor_parallel_size=4), "actor")
    assert err.value.key == "actor.megatron.expert_tensor_parallel_size"
    assert "6 expert FFN columns" in err.value.reason
    # unset, the experts follow TP and the error names TP
    with pytest.raises(ConfigError) as err:
        check_divisible(odd, MegatronConfig(tensor_model_parallel_size=4), "actor")
    assert err.value.key == "actor.megatron.tensor_model_parallel_size"
    check_divisible(
        odd, MegatronConfig(tensor_model_parallel_size=2, expert_tensor_parallel_size=1), "actor"
    )
    z = MegatronConfig(tensor_model_parallel_size=2, extra={"moe_z_loss_coeff": 0.001})
    (note,) = [n for n in check_section("actor", z, device_type="cpu") if "z_loss" in n]
    assert "moe_z_loss_coeff" in note and "each TP × CP rank's share" in note
    cp = MegatronConfig(context_parallel_size=2, extra={"moe_z_loss_coeff": 0.001})
    assert [n for n in check_section("actor", cp, device_type="cpu") if "z_loss" in n]


def test_load_imbalance_is_max_over_mean_tokens_per_expert_averaged_over_moe_layers() -> None:
    import torch

    from temper.training.megatron_moe import load_imbalance

    layout = hf_layout(Qwen3MoeConfig(**COMMON, num_experts=4, moe_intermediate_size=8))
    assert layout.moe is not None
    counts = torch.zeros(4, 4, dtype=torch.float64)
    counts[0] = torch.tensor([2.0, 2.0, 2.0, 2.0])  # balanced: 1
    counts[1] = torch.tensor([4.0, 4.0, 0.0, 0.0])  # every token to the same 2 of 4: 2
    assert load_imbalance(counts, layout.moe) == pytest.approx(1.5)  # layers 2, 3: no tokens
