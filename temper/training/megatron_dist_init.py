"""Initial weights from a Megatron-Core distributed checkpoint (``megatron.dist_checkpoint_path``).

verl's ``use_dist_checkpointing`` starts a megatron role from a checkpoint that its
``scripts/converter_hf_to_mcore.py`` wrote once with ``dist_checkpointing.save`` (the
model's ``sharded_state_dict()``): for a large model that conversion is slow, so it is done
ahead of time. The checkpoint is keyed by Megatron's global, layout-free names (each
tensor with its global shape and the TP/PP slice a rank holds), so a rank of any
tensor × pipeline layout reads only its shard. Megatron's local layer spec (temper's on
CPU) maps its norms to TransformerEngine's names (``input_layernorm.`` ↔
``self_attention.linear_qkv.layer_norm_``), so a checkpoint written with either spec
loads into both.

A critic's value head is not in a policy's checkpoint: it is left out of the load and
initialised as the Hugging Face path does. ``GPTModel.sharded_state_dict`` cannot be asked
for a critic (Megatron's language model looks up ``output_layer.weight``, which the value
head replaces), so a critic's sharded state is gathered from the model's other children.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from temper.config.errors import ConfigError

#: What ``dist_checkpointing.save`` writes at the top of a checkpoint directory.
METADATA = "metadata.json"


def check_dist_checkpoint(path: str, key: str) -> None:
    """Pre-flight: ``path`` is a Megatron distributed checkpoint directory."""
    root = Path(path).expanduser()
    if not (root / METADATA).is_file():
        raise ConfigError(
            key,
            f"{root} is not a Megatron-Core distributed checkpoint (no {METADATA})",
            "point it at the directory dist_checkpointing.save wrote (verl's "
            "converter_hf_to_mcore.py --output_path), or remove it to convert model.path",
        )


def load_dist_checkpoint(
    chunks: list[torch.nn.Module],
    path: str,
    *,
    prefix: str = "",
    value_head: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
) -> None:
    """Fill the parameters of this rank's model ``chunks`` (its shards; one ``GPTModel``
    per virtual pipeline stage it holds) from the checkpoint at ``path``.

    The chunks are loaded in one call: Megatron checks that the ranks together read
    every part of each global tensor once, and a layer-stacked tensor spans the
    chunks of every rank. ``value_head(name, target)``: a critic's fresh head for each
    of its parameters, which the checkpoint (a policy's) does not hold. Tensors the
    checkpoint has beyond the model's (TransformerEngine's ``_extra_state``) are ignored;
    a parameter the checkpoint lacks fails the load, naming it.
    """
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import StrictHandling

    sharded: dict[str, dict[str, Any]] = {}
    for c, module in enumerate(chunks):
        if value_head is None:
            state: dict[str, Any] = module.sharded_state_dict(prefix=prefix)  # type: ignore[operator]
        else:
            state = body_sharded_state_dict(module, prefix)
        sharded[f"chunk{c}"] = state
    try:
        loaded = dist_checkpointing.load(
            sharded, str(Path(path).expanduser()), strict=StrictHandling.ASSUME_OK_UNEXPECTED
        )
    except Exception as err:  # Megatron raises CheckpointingException, KeyError, …
        raise ConfigError(
            "megatron.dist_checkpoint_path",
            f"{path} does not fit this model: {type(err).__name__}: {err}",
            "convert the checkpoint from the model at model.path (same architecture), or "
            "remove dist_checkpoint_path",
        ) from err
    for c, module in enumerate(chunks):
        _fill(module, loaded[f"chunk{c}"], prefix, value_head)


def body_sharded_state_dict(module: torch.nn.Module, prefix: str) -> dict[str, Any]:
    """The sharded state of ``module`` (a ``GPTModel``) without its output layer: what
    Megatron's ``MegatronModule.sharded_state_dict`` builds from each child, less the
    language model's output-layer handling (tying and vocabulary padding, which a value
    model has neither of: its head is not tied and has one output)."""
    from megatron.core.transformer.utils import (
        ensure_metadata_has_dp_cp_group,
        sharded_state_dict_default,
    )

    metadata = ensure_metadata_has_dp_cp_group(None)
    tp_group: Any = module.tp_group  # a LanguageModule's (set at construction)
    state: dict[str, Any] = {}
    for name, child in module.named_children():
        if name == "output_layer":
            continue
        state.update(
            sharded_state_dict_default(child, f"{prefix}{name}.", (), metadata, tp_group=tp_group)
        )
    return state


def _fill(
    module: torch.nn.Module,
    loaded: dict[str, Any],
    prefix: str,
    value_head: Callable[[str, torch.Tensor], torch.Tensor] | None,
) -> None:
    params = dict(module.named_parameters())
    with torch.no_grad():
        for key, tensor in loaded.items():
            name = key.removeprefix(prefix)
            if name in params and isinstance(tensor, torch.Tensor):
                target = params[name]
                if target.data_ptr() != tensor.data_ptr():  # loaded into a copy
                    target.copy_(tensor.to(target.dtype))
        if value_head is not None:
            for name, target in params.items():
                if name.startswith("output_layer."):
                    target.copy_(value_head(name, target))
