"""vLLM's ``CompletionOutput.routed_experts`` → the batch's ``routed_experts``
(:mod:`temper.rollout.vllm_routing`), on hand-made arrays: the MoE layers kept, each
token in its column, ``-1`` elsewhere; and the engine argument that asks vLLM for them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from temper.config.errors import ConfigError
from temper.config.schema import ModelConfig, RolloutConfig
from temper.rollout.vllm_args import engine_args
from temper.rollout.vllm_kv import EngineDemand
from temper.rollout.vllm_routing import completion_routing, model_routing_shape
from temper.utils.router_replay_hf import moe_layer_indices


def _array(tokens: int, layers: int, base: int) -> np.ndarray:
    """``[tokens, layers, 2]`` uint8: token t of layer l chose ``(base + 10 l + t, 9)``."""
    t = np.arange(tokens)[:, None]
    first = base + 10 * np.arange(layers)[None, :] + t
    return np.stack([first, np.full_like(first, 9)], axis=-1).astype(np.uint8)


def test_completion_routing_keeps_moe_layers_in_the_batch_columns() -> None:
    # a 3-layer model whose layer 0 is dense (mlp_only_layers=[0]): MoE layers 1, 2
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    response_mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    # row 0: 2 prompt + 3 generated → 4 routed tokens; row 1: 3 + 1 generated → 3
    arrays = [_array(4, 3, 0), _array(3, 3, 50)]
    out = completion_routing(arrays, [1, 2], 16, prompt_mask, response_mask)
    assert out.shape == (2, 6, 2, 2) and out.dtype == torch.int8
    # row 0, layer 1 (column 0 of L): 10 + t at its real columns 1..4, -1 at the rest
    assert out[0, :, 0, 0].tolist() == [-1, 10, 11, 12, 13, -1]
    assert out[0, :, 1, 0].tolist() == [-1, 20, 21, 22, 23, -1]
    assert out[1, :, 0, 0].tolist() == [60, 61, 62, -1, -1, -1]
    assert (out[0, 1:5, :, 1] == 9).all()


def test_a_malformed_array_is_named() -> None:
    with pytest.raises(ValueError, match="row 0"):
        completion_routing([np.zeros((3, 1, 2))], [1], 4, torch.ones(1, 2), torch.ones(1, 2))


@pytest.mark.parametrize(
    ("config", "layers"),
    [
        ({"model_type": "mixtral", "num_hidden_layers": 3, "num_local_experts": 8}, [0, 1, 2]),
        ({"model_type": "qwen3_moe", "num_hidden_layers": 3, "mlp_only_layers": [0]}, [1, 2]),
        ({"model_type": "qwen2_moe", "num_hidden_layers": 4, "decoder_sparse_step": 2}, [1, 3]),
    ],
)
def test_moe_layers_follow_transformers_rule(config: dict, layers: list[int]) -> None:
    assert moe_layer_indices(config) == layers


def test_model_routing_shape_reads_experts_of_either_spelling() -> None:
    qwen = {"model_type": "qwen3_moe", "num_hidden_layers": 2, "num_experts": 128}
    assert model_routing_shape(qwen) == ([0, 1], 128)
    mixtral = {"model_type": "mixtral", "num_hidden_layers": 1, "num_local_experts": 8}
    assert model_routing_shape(mixtral) == ([0], 8)


def _args(on_cpu: bool, routed: bool) -> dict:
    demand = EngineDemand(64, ("rollout.prompt_length",), 4, routed_experts=routed)
    kwargs, _ = engine_args(
        RolloutConfig(), ModelConfig(path="m"), on_cpu=on_cpu, seed=0, demand=demand
    )
    return kwargs


def test_r3_asks_vllm_for_routed_experts_on_gpu() -> None:
    assert _args(on_cpu=False, routed=True)["enable_return_routed_experts"] is True
    assert "enable_return_routed_experts" not in _args(on_cpu=False, routed=False)


def test_r3_with_vllm_on_cpu_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        _args(on_cpu=True, routed=True)
    assert err.value.key == "actor.router_replay"
    assert "Triton" in str(err.value) and "rollout.engine=hf" in str(err.value)
    assert "\n" not in str(err.value)
