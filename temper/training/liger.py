"""``model.use_liger``: Liger's fused Triton kernels (RMSNorm, SwiGLU MLP, rotary
embedding) in place of a Hugging Face model's own modules, as verl applies them to the
models it trains with FSDP.

A transformer layer in HF's modeling code runs a dozen small elementwise kernels around
its matmuls (the fp32 RMSNorm's upcast, square, mean, rsqrt and scale; SiLU and the gate
product; the rotary halves); on a GPU they cost as much time as the matmuls at the widths
RL trains. Liger fuses each into one kernel with the same forward and backward math, so
log-probs agree with HF's to rounding. Liger's cross-entropy kernels stay off: temper
computes log-probs and entropy from the logits itself
(:func:`temper.algorithms.logprobs.logprobs_and_entropy`).

Liger patches the model's modeling module as well as the instance (its rotary function
and module classes), so every model of that family built later in the process gets the
kernels too; an engine applies it only on CUDA, where every model of the process runs.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from temper.config.errors import ConfigError

log = logging.getLogger(__name__)

#: Liger's kernels temper asks for: fused, same math (the loss kernels stay off)
KERNELS = {
    "rope": True,
    "rms_norm": True,
    "swiglu": True,
    "cross_entropy": False,
    "fused_linear_cross_entropy": False,
}


def hf_model(model: nn.Module) -> PreTrainedModel | None:
    """The transformers model inside ``model`` (itself, a peft model's base, a value
    model's backbone): the first :class:`PreTrainedModel` among its modules."""
    return next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)


def apply_liger(model: nn.Module, device: torch.device, role: str) -> bool:
    """Put Liger's kernels into ``model`` when it runs on CUDA; return whether they went
    in. On another device the model keeps HF's modules (a warning says so: the option is
    speed only, results are the same)."""
    if device.type != "cuda":
        log.warning(
            "%s: model.use_liger needs CUDA (Liger's kernels are Triton); the model on %s "
            "keeps its own modules (same results)",
            role,
            device.type,
        )
        return False
    try:
        from liger_kernel.transformers.monkey_patch import (
            MODEL_TYPE_TO_APPLY_LIGER_FN,
            _apply_liger_kernel_to_instance,
        )
    except ImportError:
        raise ConfigError(
            "model.use_liger",
            "liger-kernel is not installed",
            "pip install liger-kernel, or set model.use_liger=false",
        ) from None
    hf: Any = hf_model(model)
    if hf is None:
        raise ConfigError(
            "model.use_liger",
            f"the {role} model is not a transformers model ({type(model).__name__})",
            "set model.use_liger=false",
        )
    model_type = hf.config.model_type
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        log.warning(
            "%s: model.use_liger: Liger has no kernels for model type %r; the model keeps "
            "its own modules",
            role,
            model_type,
        )
        return False
    _apply_liger_kernel_to_instance(model=hf, **KERNELS)
    return True
