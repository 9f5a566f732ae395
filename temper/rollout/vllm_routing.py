"""vLLM's routed experts → the batch's ``routed_experts`` (router replay R3).

With ``enable_return_routed_experts`` (vLLM 0.32: its V2 model runner, GPU builds) every
``CompletionOutput`` carries ``routed_experts`` ``[seq_len, layers, topk]`` (unsigned
integers): the experts each decoder layer chose for each token of the sequence the
completion ends — its prompt tokens, then its generated ones — ``seq_len`` being all of
them but the last generated token, which no forward ran. ``layers`` counts every decoder
layer of the model, dense ones too (their rows hold nothing meaningful); temper's routing
keeps the MoE layers only (:func:`~temper.utils.router_replay_hf.moe_layer_indices`), in
the batch's columns (:func:`~temper.data.routing.routing_columns`).

Pure: runs without vLLM (arrays in, a tensor out).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from temper.data.routing import routing_columns
from temper.utils.router_replay_hf import moe_layer_indices


def moe_num_experts(config: Mapping[str, Any]) -> int:
    """Experts per MoE layer of an HF config.json: ``num_experts`` (Qwen2-/Qwen3-MoE) or
    ``num_local_experts`` (Mixtral)."""
    return int(config.get("num_experts") or config.get("num_local_experts") or 0)


def completion_routing(
    arrays: Sequence[np.ndarray],
    moe_layers: Sequence[int],
    num_experts: int,
    prompt_mask: torch.Tensor,
    response_mask: torch.Tensor,
) -> torch.Tensor:
    """``(B, P + R, L, k)`` from one ``[seq_len_i, layers, topk]`` array per row.

    Row ``i``'s array is cut to the ``L`` = ``len(moe_layers)`` MoE layers (decoder
    layer indices) and its tokens put in the row's real columns of ``prompt_mask ‖
    response_mask``, in order; every other column is ``-1``."""
    layers = list(moe_layers)
    rows = []
    for i, array in enumerate(arrays):
        a = np.asarray(array)
        if a.ndim != 3 or (layers and a.shape[1] <= max(layers)):
            raise ValueError(
                f"vLLM's routed experts of row {i} have shape {a.shape}: expected "
                f"[tokens, layers > {max(layers, default=-1)}, topk]"
            )
        rows.append(torch.from_numpy(a[:, layers].astype(np.int64)))
    return routing_columns(rows, prompt_mask, response_mask, num_experts)


def model_routing_shape(config: Mapping[str, Any]) -> tuple[list[int], int]:
    """The MoE layers and experts per layer of the model's config.json (its text config
    for a vision-language model)."""
    return moe_layer_indices(config), moe_num_experts(config)


__all__ = ["completion_routing", "model_routing_shape", "moe_num_experts"]
