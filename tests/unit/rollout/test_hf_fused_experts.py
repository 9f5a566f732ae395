"""The HF rollout takes an MoE model's experts by their checkpoint names (one tensor per
expert, as the megatron engine exports and vLLM loads them) into transformers' fused
in-memory expert tensors."""

from __future__ import annotations

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, MixtralConfig, Qwen3MoeConfig

from temper.rollout.hf import fused_expert_slice

COMMON = dict(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=24,
    num_hidden_layers=1,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_experts_per_tok=2,
)


def test_every_saved_expert_tensor_is_a_view_of_the_fused_ones(tmp_path) -> None:
    for name, config in (
        ("qwen3_moe", Qwen3MoeConfig(**COMMON, num_experts=4, moe_intermediate_size=8)),
        ("mixtral", MixtralConfig(**COMMON, num_local_experts=4)),
    ):
        model = AutoModelForCausalLM.from_config(config)
        model.save_pretrained(tmp_path / name)
        saved = load_file(str(tmp_path / name / "model.safetensors"))
        state = model.state_dict()
        experts = [k for k in saved if ".experts." in k]
        assert len(experts) == 4 * 3
        for key in experts:
            view = fused_expert_slice(key, state)
            assert view is not None and torch.equal(view, saved[key]), key
        # writing through the view changes the model (load_weights copies into it)
        view = fused_expert_slice(experts[0], state)
        assert view is not None
        view.fill_(0.5)
        assert (model.state_dict()[view_key(experts[0])] == 0.5).any()
        assert fused_expert_slice("model.layers.0.mlp.gate.weight", state) is None


def view_key(name: str) -> str:
    layer = name.split(".experts.")[0].replace("block_sparse_moe", "mlp")
    fused = "down_proj" if name.endswith(("down_proj.weight", "w2.weight")) else "gate_up_proj"
    return f"{layer}.experts.{fused}"
