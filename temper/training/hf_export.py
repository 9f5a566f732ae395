"""Hugging Face directories written from a trained model: weights, tokenizer, processor.

Engines end their ``save_hf`` here, so a directory loads in ``transformers`` and vLLM
whichever engine wrote it:

* :func:`save_hf_dir` — a model this process holds whole (the torch engine; DeepSpeed
  ZeRO 0-2 on rank 0);
* :func:`save_gathered_hf` — a sharded model whose weights one rank has gathered (FSDP2,
  ZeRO-3), with the tokenizer (:func:`hf_tokenizer`) and a vision-language model's
  processor files (:func:`save_processor_files`) added by the caller.

With LoRA the directory holds the merged model and the adapter goes to ``lora_adapter/``
(:func:`save_hf_model`). The megatron engine writes its own layout (its module is no
Hugging Face model; see :mod:`temper.training.megatron_io`) with :func:`load_tokenizer`.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from torch import nn

from temper.config.schema import ModelConfig
from temper.training.spec import EngineSpec
from temper.training.weights import hf_named_weights, is_peft_model
from temper.utils.model_path import resolve_model_path

log = logging.getLogger(__name__)


def save_hf_dir(model: nn.Module, spec: EngineSpec, path: str, *, merge_lora: bool = True) -> None:
    """HF directory (+ tokenizer) of a model held whole; LoRA: merged model +
    ``lora_adapter/`` (see :func:`save_hf_model`); a value model: its own layout."""
    tokenizer = hf_tokenizer(spec.model, spec.model_path, path)
    if spec.value_head:
        value_model: Any = model  # models.ValueModel
        value_model.save_pretrained(path)
        if tokenizer is not None:
            tokenizer.save_pretrained(path)
    else:
        save_hf_model(model, path, tokenizer, merge_lora=merge_lora)
    save_processor_files(spec.model, path, spec.model_path)  # VL models


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


#: Files of a model's processor (image/video processors, chat template) that a saved
#: checkpoint needs beside the weights and tokenizer to load as a vision-language model.
PROCESSOR_FILES = (
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "processor_config.json",
    "chat_template.json",
    "chat_template.jinja",
)


def save_processor_files(cfg: ModelConfig, out: str | Path, path: str | None = None) -> None:
    """Copy the source model's processor files into the saved directory ``out`` (files
    the tokenizer already wrote there are kept)."""
    import shutil

    src = Path(resolve_model_path(cfg.tokenizer_path or path or cfg.path))
    if not src.is_dir():
        return
    for name in PROCESSOR_FILES:
        if (src / name).is_file() and not (Path(out) / name).exists():
            shutil.copyfile(src / name, Path(out) / name)


def load_tokenizer(cfg: ModelConfig, path: str | None = None) -> Any:
    """The tokenizer saved next to checkpoints (``tokenizer_path`` or the model path)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(
        resolve_model_path(cfg.tokenizer_path or path or cfg.path),
        trust_remote_code=cfg.trust_remote_code,
    )


def hf_tokenizer(cfg: ModelConfig, path: str | None, out: str | Path) -> Any | None:
    """The tokenizer to save next to the HF directory ``out`` (None, logged, if it does
    not load)."""
    try:
        return load_tokenizer(cfg, path)
    except (OSError, ValueError) as err:
        log.warning("no tokenizer saved with %s: %s", out, err)
        return None
