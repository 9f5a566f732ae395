"""Weights under Hugging Face names, for syncing to a rollout engine and for export.

A rollout engine (vLLM, HF generate) loads plain ``*ForCausalLM`` weights, so LoRA is
merged on the fly: ``W = W_base + scale·B·A`` per adapted layer, computed into a new
tensor. The model itself is never merged in place — merge then unmerge would add
``W + Δ - Δ`` round-off to the frozen base weights at every sync.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
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


def save_hf_model(
    model: nn.Module, path: str | Path, tokenizer: Any | None = None, *, merge_lora: bool = True
) -> None:
    """A Hugging Face model directory at ``path`` (+ tokenizer).

    With LoRA and ``merge_lora`` the directory holds the merged model (loads in
    ``transformers`` and vLLM) and the adapter goes to ``path/lora_adapter``; without
    ``merge_lora`` ``path`` is the peft adapter directory alone.
    """
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    hf: Any = model  # a transformers (or peft) model, duck-typed
    if is_peft_model(model):
        if merge_lora:
            merged = {k: v.contiguous() for k, v in hf_named_weights(model)}
            hf.get_base_model().save_pretrained(str(out), state_dict=merged)
            hf.save_pretrained(str(out / "lora_adapter"))
        else:
            hf.save_pretrained(str(out))
    else:
        hf.save_pretrained(str(out))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out))


def save_gathered_hf(
    model: nn.Module,
    path: str | Path,
    *,
    full: dict[str, torch.Tensor],
    merged: dict[str, torch.Tensor],
    value: bool,
    merge_lora: bool = True,
    tokenizer: Any | None = None,
) -> None:
    """:func:`save_hf_model` for a sharded model whose weights were gathered (one rank
    writes): ``full`` is the model's own state dict, ``merged`` its HF weights with LoRA
    merged (used with LoRA and ``merge_lora`` only); ``value`` for a value model."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    if value:
        model.save_pretrained(out, state_dict=full)  # type: ignore[operator]
    elif is_peft_model(model) and merge_lora:
        model.get_base_model().save_pretrained(str(out), state_dict=merged)  # type: ignore[operator]
        model.save_pretrained(str(out / "lora_adapter"), state_dict=full)  # type: ignore[operator]
    else:
        model.save_pretrained(str(out), state_dict=full)  # type: ignore[operator]
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out))
