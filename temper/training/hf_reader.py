"""Tensors of a Hugging Face checkpoint directory (safetensors, single file or indexed),
read one at a time by name, so a model is never held whole to be converted (the
megatron engine fills each rank's shards from it)."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from temper.training.models import VALUE_HEAD_FILE, is_value_model_dir


class HFCheckpoint:
    """Tensors of a Hugging Face checkpoint directory, read one at a time by name.

    Names are given without the causal LM's ``model.`` prefix (a value-model backbone
    has none); ``lm_head.weight``, ``value_head.*`` and ``score.weight`` are looked up as
    they are. A vision-language checkpoint names its language model ``model.*`` (the
    original layout) or ``model.language_model.*`` (the layout of transformers' state
    dict), and its vision tower ``visual.*`` or ``model.visual.*``: both are read.
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self._files: dict[str, Path] = {}
        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            self._files = {k: self.path / v for k, v in weight_map.items()}
        elif (self.path / "model.safetensors").is_file():
            from safetensors import safe_open

            single = self.path / "model.safetensors"
            with safe_open(str(single), framework="pt") as f:
                self._files = {k: single for k in f.keys()}  # noqa: SIM118 (not a dict)
        else:
            raise FileNotFoundError(
                f"{self.path} has no safetensors weights (model.safetensors or an index); "
                "the megatron engine reads safetensors checkpoints"
            )
        if "model.language_model.embed_tokens.weight" in self._files:
            self.prefix = "model.language_model."
        else:
            self.prefix = "model." if "model.embed_tokens.weight" in self._files else ""
        self._value_head: dict[str, torch.Tensor] = {}
        if is_value_model_dir(self.path):
            from safetensors.torch import load_file

            head = load_file(str(self.path / VALUE_HEAD_FILE))
            self._value_head = {f"value_head.{k}": v for k, v in head.items()}
        self._stack = ExitStack()
        self._open: dict[Path, Any] = {}

    def has(self, name: str) -> bool:
        return name in self._value_head or self._key(name) in self._files

    def _key(self, name: str) -> str:
        if name.startswith("visual."):
            return name if name in self._files else "model." + name
        # a sequence classifier's ``score.weight`` sits beside its ``model.`` backbone
        return name if name.startswith(("lm_head.", "score.")) else self.prefix + name

    def get(self, name: str) -> torch.Tensor:
        if name in self._value_head:
            return self._value_head[name]
        from safetensors import safe_open

        key = self._key(name)
        file = self._files[key]
        if file not in self._open:
            self._open[file] = self._stack.enter_context(safe_open(str(file), framework="pt"))
        return self._open[file].get_tensor(key)

    def close(self) -> None:
        self._stack.close()
        self._open.clear()
