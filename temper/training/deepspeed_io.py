"""State of a DeepSpeed engine: full weights, HF export, checkpoints.

* Weights for rollout sync: under ZeRO 0-2 every rank holds whole parameters, so they
  are the module's own tensors. Under ZeRO-3 they are gathered one block at a time
  (``zero.GatheredParameters``): each decoder layer, then the rest (embeddings, final
  norm, head) — LoRA merged inside the block that holds both the base weight and its
  adapters — and copied out before the block is released, so no rank ever holds the
  whole model gathered.
* ``save_hf`` writes the same Hugging Face directory as the other engines (loads in
  transformers and vLLM), from rank 0.
* Checkpoints are DeepSpeed's own (``engine.save_checkpoint``: each rank writes its
  optimizer partition; the model file under ZeRO-3 holds no weights, the fp32 master
  partitions are restored from the optimizer files), with temper's LR schedule as client
  state. Under LoRA only the trainable (adapter) parameters are written.

Every function here is a collective over the engine's ranks unless it says otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from temper.config.errors import ConfigError
from temper.training.hf_export import (
    hf_tokenizer,
    save_gathered_hf,
    save_hf_dir,
    save_processor_files,
)
from temper.training.models import decoder_layers
from temper.training.weights import hf_named_weights, is_peft_model

if TYPE_CHECKING:
    from temper.training.deepspeed_engine import DeepSpeedEngine

TAG = "deepspeed"  # the checkpoint's sub-directory (DeepSpeed's "tag")

Keep = Callable[[str], bool]
Items = Callable[[Keep], Iterator[tuple[str, torch.Tensor]]]


def _blocks(model: nn.Module, root: nn.Module) -> list[tuple[Keep, list[nn.Parameter]]]:
    """What to gather together: each decoder layer, then everything else. ``Keep`` tells
    whether a state-dict key of ``root`` (the model, or a module inside it) is the block's."""
    layers = decoder_layers(model)
    names = {id(m): name for name, m in root.named_modules()}
    prefixes = tuple(f"{names[id(layer)]}." for layer in layers if id(layer) in names)
    if len(prefixes) != len(layers):  # layers outside root: gather the model as one block
        layers, prefixes = [], ()
    inside = {id(p) for layer in layers for p in layer.parameters()}
    blocks = [(_starts(pre), list(layer.parameters())) for pre, layer in zip(prefixes, layers)]
    rest = [p for p in model.parameters() if id(p) not in inside]
    blocks.append((_outside(prefixes), rest))
    return blocks


def _starts(prefix: str) -> Keep:
    return lambda key: key.startswith(prefix)


def _outside(prefixes: tuple[str, ...]) -> Keep:
    return lambda key: not key.startswith(prefixes)


def _gathered(
    engine: DeepSpeedEngine, root: nn.Module, items: Items
) -> Iterator[tuple[str, torch.Tensor]]:
    """``items(keep)`` of every block while its ZeRO-3 partitions are gathered, copied."""
    gather = engine.deepspeed.zero.GatheredParameters
    for keep, params in _blocks(engine.model, root):
        with gather(params):
            for name, tensor in items(keep):
                yield name, tensor.detach().clone()


def _hf_root(model: nn.Module) -> nn.Module:
    return model.get_base_model() if is_peft_model(model) else model  # type: ignore[operator]


def named_weights(engine: DeepSpeedEngine) -> Iterator[tuple[str, torch.Tensor]]:
    """``hf_named_weights`` of the engine's model, whole (see module doc)."""
    model = engine.model
    if engine.stage != 3:
        return hf_named_weights(model)
    return _gathered(engine, _hf_root(model), lambda keep: hf_named_weights(model, keep))


def _module_state(
    engine: DeepSpeedEngine, trainable_only: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """The module's own state dict (peft names under LoRA), whole; optionally only the
    trainable parameters."""
    model = engine.model
    wanted = {n for n, p in model.named_parameters() if p.requires_grad} if trainable_only else None

    def items(keep: Keep) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in model.state_dict().items():
            if keep(name) and (wanted is None or name in wanted):
                yield name, tensor

    if engine.stage != 3:
        return ((n, t.detach()) for n, t in items(lambda _: True))
    return _gathered(engine, model, items)


# --------------------------------------------------------------------------- HF export


def save_hf(engine: DeepSpeedEngine, path: str | Path, *, merge_lora: bool = True) -> None:
    """HF directory at ``path``, written by rank 0 (the torch engine's layout)."""
    if engine.stage != 3:
        if engine.rank == 0:
            save_hf_dir(engine.model, engine.spec, str(path), merge_lora=merge_lora)
        dist.barrier()
        return
    model = engine.model
    first = engine.rank == 0
    full = {n: t.cpu() for n, t in _module_state(engine) if first}
    merged: dict[str, torch.Tensor] = {}
    if is_peft_model(model) and merge_lora and engine.spec.kind != "value":
        merged = {n: t.cpu() for n, t in named_weights(engine) if first}
    if first:
        save_gathered_hf(
            model,
            path,
            full=full,
            merged=merged,
            value=engine.spec.kind == "value",
            merge_lora=merge_lora,
            tokenizer=hf_tokenizer(engine.spec.model, engine.spec.model_path, path),
        )
        save_processor_files(engine.spec.model, path, engine.spec.model_path)  # VL models
    dist.barrier()


# --------------------------------------------------------------------------- state


def state_dict(engine: DeepSpeedEngine) -> dict[str, Any]:
    """``{"model": whole trainable weights, "optimizer": this rank's DeepSpeed optimizer
    state (its ZeRO partition, fp32 masters included), "scheduler"}``; frozen: model only."""
    state: dict[str, Any] = {"model": dict(_module_state(engine, trainable_only=True))}
    if engine.optimizer is not None and engine.schedule is not None:
        state["optimizer"] = engine.ds.optimizer.state_dict()
        state["scheduler"] = engine.schedule.state_dict()
    return state


def load_state_dict(engine: DeepSpeedEngine, state: dict[str, Any]) -> None:
    """Inverse of :func:`state_dict` on the same number of ranks (each loads its own)."""
    params = dict(engine.model.named_parameters())
    saved = state["model"]
    unknown = [n for n in saved if n not in params]
    if unknown:
        raise ValueError(
            f"{engine.spec.role} state does not match the model: unexpected {unknown[:5]}"
        )
    targets = [params[n] for n in saved]
    gathered = contextlib.nullcontext()
    if engine.stage == 3:  # every rank holds the same whole copy; rank 0's is written back
        gathered = engine.deepspeed.zero.GatheredParameters(targets, modifier_rank=0)
    with gathered, torch.no_grad():
        for name, tensor in saved.items():
            params[name].copy_(tensor.to(params[name].device, params[name].dtype))
    if engine.optimizer is None or "optimizer" not in state:
        return
    if engine._plain:
        engine.optimizer.load_state_dict(state["optimizer"])
    else:  # DeepSpeed's loaders take one state per rank and read their own
        per_rank: list[Any] = [None] * engine.world
        per_rank[engine.rank] = state["optimizer"]
        engine.ds.optimizer.load_state_dict(
            state_dict_list=per_rank, load_optimizer_states=True, load_from_fp32_weights=True
        )
    if engine.schedule is not None and "scheduler" in state:
        engine.schedule.load_state_dict(state["scheduler"])


def save_checkpoint(engine: DeepSpeedEngine, path: str | Path) -> None:
    """DeepSpeed checkpoint ``path/deepspeed/`` + the LR schedule as client state."""
    client = {"scheduler": engine.schedule.state_dict()} if engine.schedule is not None else {}
    engine.ds.save_checkpoint(
        str(path),
        tag=TAG,
        client_state=client,
        exclude_frozen_parameters=is_peft_model(engine.model),
    )


def load_checkpoint(engine: DeepSpeedEngine, path: str | Path) -> None:
    """Inverse of :func:`save_checkpoint` (same number of ranks: ZeRO partitions)."""
    if not (Path(path) / TAG).is_dir():
        raise FileNotFoundError(f"{engine.spec.role}: no DeepSpeed checkpoint at {path}/{TAG}")
    saved = len(list((Path(path) / TAG).glob("*zero_pp_rank_*_optim_states.pt")))
    if saved and saved != engine.world:
        raise ConfigError(
            f"{engine.spec.role}.deepspeed",
            f"{path} holds ZeRO partitions of {saved} ranks but this run has {engine.world}; "
            "DeepSpeed ZeRO checkpoints resume on the same number of ranks",
            f"resume with {saved} {engine.spec.role} devices (resources), or start from the "
            "checkpoint's Hugging Face directory (model.path) with a fresh optimizer",
        )
    loaded, client = engine.ds.load_checkpoint(
        str(path),
        tag=TAG,
        load_module_strict=not is_peft_model(engine.model),
        load_optimizer_states=engine.optimizer is not None,
        load_lr_scheduler_states=False,
    )
    if loaded is None:
        raise FileNotFoundError(f"{engine.spec.role}: DeepSpeed could not load {path}/{TAG}")
    if engine.schedule is not None:
        engine.schedule.load_state_dict(client["scheduler"])
