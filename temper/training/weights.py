"""Weights under Hugging Face names, for syncing to a rollout engine and for export.

A rollout engine (vLLM, HF generate) loads plain ``*ForCausalLM`` weights, so LoRA is
merged on the fly: ``W = W_base + scale·B·A`` per adapted layer, computed into a new
tensor. The model itself is never merged in place — merge then unmerge would add
``W + Δ - Δ`` round-off to the frozen base weights at every sync.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

_LORA_PARAM_MARKERS = (
    ".lora_A.",
    ".lora_B.",
    ".lora_embedding_A.",
    ".lora_embedding_B.",
    ".lora_magnitude_vector.",
)
_BASE_LAYER = ".base_layer."


def is_peft_model(model: nn.Module) -> bool:
    """True for a peft-wrapped model (has adapters)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def _lora_delta(module: Any) -> torch.Tensor | None:
    """``Σ_adapters scale·B·A`` of an un-merged, enabled LoRA layer (None if nothing to add)."""
    if getattr(module, "disable_adapters", False) or getattr(module, "merged", False):
        return None
    delta = None
    for name in module.active_adapters:
        if name not in module.lora_A and name not in getattr(module, "lora_embedding_A", {}):
            continue
        d = module.get_delta_weight(name)
        delta = d if delta is None else delta + d
    return delta


def hf_named_weights(
    model: nn.Module, keep: Callable[[str], bool] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(hf_name, tensor)`` of the full model; LoRA merged, adapter tensors left out.

    Tensors are detached views of the live weights (merged ones are new tensors): copy
    them before the next optimizer step if they must outlive it. ``keep`` selects
    state-dict keys of the HF model (the peft base model under LoRA): a ZeRO-3 engine
    exports one gathered block at a time.
    """
    if not is_peft_model(model):
        for name, tensor in model.state_dict().items():
            if keep is None or keep(name):
                yield name, tensor.detach()
        return
    from peft.tuners.lora import LoraLayer

    peft: Any = model  # a peft model (is_peft_model), duck-typed
    base = peft.get_base_model()
    lora_layers = {n: m for n, m in base.named_modules() if isinstance(m, LoraLayer)}
    with torch.no_grad():
        for key, tensor in base.state_dict().items():
            if any(marker in key for marker in _LORA_PARAM_MARKERS):
                continue
            if keep is not None and not keep(key):
                continue
            if _BASE_LAYER not in key:
                yield key, tensor.detach()
                continue
            module_name, _, param = key.partition(_BASE_LAYER)
            out = tensor.detach()
            if param == "weight" and module_name in lora_layers:
                delta = _lora_delta(lora_layers[module_name])
                if delta is not None:
                    out = out + delta.to(out.dtype)
            yield f"{module_name}.{param}", out
