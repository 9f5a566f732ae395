"""Model-loading plumbing of the one-process engine (:mod:`temper.training.torch_engine`):
the HF model in its storage dtype, the sparse gradient of a tied embedding, whether the
model takes ``logits_to_keep``, and the (maybe compiled) log-prob/entropy kernel."""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel

from temper.algorithms.logprobs import logprobs_and_entropy
from temper.training.models import (
    freeze_modules,
    load_causal_lm,
    load_value_model,
    master_dtype,
)
from temper.training.spec import EngineSpec
from temper.training.weights import is_peft_model

log = logging.getLogger(__name__)


def fused_fn(spec: EngineSpec, device: torch.device) -> Any:
    """``logprobs_and_entropy``, compiled with ``torch.compile`` under the role's
    ``use_torch_compile`` on GPU, as verl compiles its entropy kernel. On CPU it stays
    eager: inductor's CPU backend compiles C++ for every new shape, which costs far more
    than it saves on the small batches CPU runs have."""
    if spec.train is None or not spec.train.use_torch_compile:
        return logprobs_and_entropy
    if device.type != "cuda":
        log.warning("%s.use_torch_compile: the entropy kernel stays eager on CPU", spec.role)
        return logprobs_and_entropy
    return torch.compile(logprobs_and_entropy, dynamic=True)


def load_model(
    spec: EngineSpec, device: torch.device, compute_dtype: torch.dtype, *, trainable: bool
) -> nn.Module:
    """The HF model (or value model) an engine trains, on ``device``, in its storage
    dtype: the role's ``master_dtype`` when trained (AdamW then keeps its state in it
    too), else ``compute_dtype``."""
    storage = master_dtype(spec.train.master_dtype) if trainable and spec.train else compute_dtype
    loader = load_value_model if spec.value_head else load_causal_lm
    kwargs: dict[str, Any] = (
        {"seed": spec.seed, "score_head": spec.kind == "score"} if spec.value_head else {}
    )
    model = loader(
        spec.model,
        device=device,
        dtype=storage,
        path=spec.model_path,
        trainable=trainable,
        **kwargs,
    )
    if spec.train is not None:  # freeze_vision_tower / freeze_module_prefix
        model = freeze_modules(model, spec.train, spec.role)
    return model


def sparse_tied_embedding_grad(model: nn.Module) -> None:
    """With tied input/output embeddings, let the input embedding's backward return
    its few touched rows (``nn.Embedding.sparse``): autograd adds them into the LM
    head's dense gradient of the same weight, instead of materialising a second
    vocab × hidden dense gradient per micro-batch (~50 ms each for SmolLM2's 49k×576).
    The summed gradient is dense, so AdamW and clipping see what they always did:
    every causal-LM forward runs the LM head, whose backward is dense even with no
    scored token (zeros). Single-process engines only: sharded engines keep their
    dense gradients."""
    hf: Any = model
    if not isinstance(hf, PreTrainedModel) or is_peft_model(model):
        return
    emb, head = hf.get_input_embeddings(), hf.get_output_embeddings()
    if (
        isinstance(emb, nn.Embedding)
        and head is not None
        and emb.weight is head.weight
        and emb.weight.requires_grad
    ):
        emb.sparse = True


def accepts_logits_to_keep(model: nn.Module, value_head: bool) -> bool:
    """Whether the causal LM's forward takes ``logits_to_keep`` (value models: no)."""
    if value_head:
        return False
    hf: Any = model  # a transformers (or peft) model, duck-typed
    base = hf.get_base_model() if is_peft_model(model) else hf
    return "logits_to_keep" in inspect.signature(base.forward).parameters
