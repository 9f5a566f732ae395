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
  optimizer partition; the model file under ZeRO-3 holds no weights, the master
  partitions are restored from the optimizer files), with temper's LR schedule as client
  state. Under LoRA only the trainable (adapter) parameters are written.

:class:`DeepSpeedCheckpointer` holds the parts of an engine these need — the model, the
DeepSpeed engine wrapping it, temper's optimizer and schedule, the spec — and nothing of
the engine class, so an engine owns its checkpointer and never the reverse. Every method
is a collective over the engine's ranks unless it says otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

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
from temper.training.schedule import LRSchedule
from temper.training.spec import EngineSpec
from temper.training.weights import hf_named_weights, is_peft_model

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


def _hf_root(model: nn.Module) -> nn.Module:
    return model.get_base_model() if is_peft_model(model) else model  # type: ignore[operator]


@dataclass(frozen=True)
class DeepSpeedCheckpointer:
    """Full weights, HF export and checkpoints of one DeepSpeed engine (see module doc).

    Attributes:
        model: the Hugging Face (or peft) module DeepSpeed wraps; ZeRO-3: partitioned.
        ds: the ``deepspeed.initialize`` engine around it (its optimizer, checkpoints).
        optimizer: temper's AdamW (DeepSpeed's client optimizer), ``None`` when frozen.
        schedule: temper's LR schedule (client state of DeepSpeed checkpoints).
        spec: what the engine was built from (role, model section, kind).
        deepspeed: the imported ``deepspeed`` package (``zero.GatheredParameters``).
        stage: the ZeRO stage (3: parameters are partitioned and gathered per block).
        plain: DeepSpeed steps ``optimizer`` itself (stage 0 in fp32), whose state is
            then torch's own rather than a DeepSpeed optimizer's.
        rank: this process's rank (rank 0 writes HF directories).
        world: the number of ranks (ZeRO partitions load on as many).
    """

    model: nn.Module
    ds: Any
    optimizer: torch.optim.Optimizer | None
    schedule: LRSchedule | None
    spec: EngineSpec
    deepspeed: ModuleType
    stage: int
    plain: bool
    rank: int
    world: int

    def _gathered(self, root: nn.Module, items: Items) -> Iterator[tuple[str, torch.Tensor]]:
        """``items(keep)`` of every block while its ZeRO-3 partitions are gathered, copied."""
        gather = self.deepspeed.zero.GatheredParameters
        for keep, params in _blocks(self.model, root):
            with gather(params):
                for name, tensor in items(keep):
                    yield name, tensor.detach().clone()

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``hf_named_weights`` of the model, whole (see module doc)."""
        model = self.model
        if self.stage != 3:
            return hf_named_weights(model)
        return self._gathered(_hf_root(model), lambda keep: hf_named_weights(model, keep))

    def _module_state(self, trainable_only: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
        """The module's own state dict (peft names under LoRA), whole; optionally only the
        trainable parameters."""
        model = self.model
        wanted = (
            {n for n, p in model.named_parameters() if p.requires_grad} if trainable_only else None
        )

        def items(keep: Keep) -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in model.state_dict().items():
                if keep(name) and (wanted is None or name in wanted):
                    yield name, tensor

        if self.stage != 3:
            return ((n, t.detach()) for n, t in items(lambda _: True))
        return self._gathered(model, items)

    # ----------------------------------------------------------------------- HF export

    def save_hf(self, path: str | Path, *, merge_lora: bool = True) -> None:
        """HF directory at ``path``, written by rank 0 (the torch engine's layout)."""
        spec = self.spec
        if self.stage != 3:
            if self.rank == 0:
                save_hf_dir(self.model, spec, str(path), merge_lora=merge_lora)
            dist.barrier()
            return
        model = self.model
        first = self.rank == 0
        full = {n: t.cpu() for n, t in self._module_state() if first}
        merged: dict[str, torch.Tensor] = {}
        if is_peft_model(model) and merge_lora and not spec.value_head:
            merged = {n: t.cpu() for n, t in self.named_weights() if first}
        if first:
            save_gathered_hf(
                model,
                path,
                full=full,
                merged=merged,
                value=spec.value_head,
                merge_lora=merge_lora,
                tokenizer=hf_tokenizer(spec.model, spec.model_path, path),
            )
            save_processor_files(spec.model, path, spec.model_path)  # VL models
        dist.barrier()

    # ----------------------------------------------------------------------- state

    def state_dict(self) -> dict[str, Any]:
        """``{"model": whole trainable weights, "optimizer": this rank's DeepSpeed optimizer
        state (its ZeRO partition, master weights included), "scheduler"}``; frozen: model
        only."""
        state: dict[str, Any] = {"model": dict(self._module_state(trainable_only=True))}
        if self.optimizer is not None and self.schedule is not None:
            state["optimizer"] = self.ds.optimizer.state_dict()
            state["scheduler"] = self.schedule.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict` on the same number of ranks (each loads its own)."""
        params = dict(self.model.named_parameters())
        saved = state["model"]
        unknown = [n for n in saved if n not in params]
        if unknown:
            raise ValueError(
                f"{self.spec.role} state does not match the model: unexpected {unknown[:5]}"
            )
        targets = [params[n] for n in saved]
        gathered = contextlib.nullcontext()
        if self.stage == 3:  # every rank holds the same whole copy; rank 0's is written back
            gathered = self.deepspeed.zero.GatheredParameters(targets, modifier_rank=0)
        with gathered, torch.no_grad():
            for name, tensor in saved.items():
                params[name].copy_(tensor.to(params[name].device, params[name].dtype))
        if self.optimizer is None or "optimizer" not in state:
            return
        if self.plain:
            self.optimizer.load_state_dict(state["optimizer"])
        else:  # DeepSpeed's loaders take one state per rank and read their own
            per_rank: list[Any] = [None] * self.world
            per_rank[self.rank] = state["optimizer"]
            self.ds.optimizer.load_state_dict(
                state_dict_list=per_rank, load_optimizer_states=True, load_from_fp32_weights=True
            )
        if self.schedule is not None and "scheduler" in state:
            self.schedule.load_state_dict(state["scheduler"])

    def save(self, path: str | Path) -> None:
        """DeepSpeed checkpoint ``path/deepspeed/`` + the LR schedule as client state."""
        client = {"scheduler": self.schedule.state_dict()} if self.schedule is not None else {}
        self.ds.save_checkpoint(
            str(path),
            tag=TAG,
            client_state=client,
            exclude_frozen_parameters=is_peft_model(self.model),
        )

    def load(self, path: str | Path) -> None:
        """Inverse of :meth:`save` (same number of ranks: ZeRO partitions)."""
        role = self.spec.role
        if not (Path(path) / TAG).is_dir():
            raise FileNotFoundError(f"{role}: no DeepSpeed checkpoint at {path}/{TAG}")
        saved = len(list((Path(path) / TAG).glob("*zero_pp_rank_*_optim_states.pt")))
        if saved and saved != self.world:
            raise ConfigError(
                f"{role}.deepspeed",
                f"{path} holds ZeRO partitions of {saved} ranks but this run has {self.world}; "
                "DeepSpeed ZeRO checkpoints resume on the same number of ranks",
                f"resume with {saved} {role} devices (resources), or start from the "
                "checkpoint's Hugging Face directory (model.path) with a fresh optimizer",
            )
        loaded, client = self.ds.load_checkpoint(
            str(path),
            tag=TAG,
            load_module_strict=not is_peft_model(self.model),
            load_optimizer_states=self.optimizer is not None,
            load_lr_scheduler_states=False,
        )
        if loaded is None:
            raise FileNotFoundError(f"{role}: DeepSpeed could not load {path}/{TAG}")
        if self.schedule is not None:
            self.schedule.load_state_dict(client["scheduler"])
