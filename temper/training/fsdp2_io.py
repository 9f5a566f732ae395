"""State of an FSDP2 engine: sharded checkpoints (DCP), full weights, HF export.

* Checkpoints are ``torch.distributed.checkpoint`` directories: each rank writes its own
  shards (no gather, no rank-0 memory peak) and a load reshards, so a run saved on N
  ranks resumes on M. The model part holds the trainable parameters only (LoRA: the
  adapters), like the torch engine's checkpoints; optimizer state is keyed by parameter
  name (``get_state_dict``), and the LR schedule rides along as a plain object.
* Full weights for rollout sync are gathered one tensor at a time (``full_tensor``), with
  LoRA merged on the sharded tensors first (DTensor matmul), so no rank ever holds two
  copies of the model.
* ``save_hf`` gathers the full state dict to rank 0's host memory (``cpu_offload``) and
  writes a directory ``transformers`` and vLLM load.

:class:`FSDP2Checkpointer` holds the parts of an engine these need — its sharded model,
optimizer, schedule and spec — and nothing of the engine class, so an engine owns its
checkpointer and never the reverse. Everything here is a collective over the engine's
ranks unless it says otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from temper.training.hf_export import hf_tokenizer, save_gathered_hf, save_processor_files
from temper.training.schedule import LRSchedule
from temper.training.spec import EngineSpec
from temper.training.weights import hf_named_weights, is_peft_model

_FSDP_PREFIX = "FSDP"  # fully_shard renames the root class FSDP<Class>


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor (all-gather); a plain tensor unchanged."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def full_named_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``hf_named_weights`` of a sharded model, each tensor gathered as it is yielded."""
    for name, tensor in hf_named_weights(model):
        yield name, full_tensor(tensor)


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Move every tensor of the optimizer state (Adam moments) to ``device`` (local)."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                state[key] = value.to(device, non_blocking=True)


def _full_state_on_rank0(model: nn.Module) -> dict[str, torch.Tensor]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=opts)
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


def _unwrap_architectures(path: Path) -> None:
    """``save_pretrained`` records the class name, which fully_shard prefixed with FSDP."""
    config = path / "config.json"
    if not config.is_file():
        return
    data = json.loads(config.read_text())
    archs = data.get("architectures") or []
    fixed = [a[len(_FSDP_PREFIX) :] if a.startswith(_FSDP_PREFIX) else a for a in archs]
    if fixed != archs:
        data["architectures"] = fixed
        config.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


@dataclass(frozen=True)
class FSDP2Checkpointer:
    """Checkpoints and HF export of one FSDP2 engine's state (see module doc).

    Attributes:
        model: the ``fully_shard``-ed model (DTensor parameters).
        optimizer: its AdamW, ``None`` for a frozen model (then so is ``schedule``).
        schedule: the LR schedule, saved beside the optimizer.
        spec: what the engine was built from (role, model section, kind).
        rank: this process's rank (rank 0 writes HF directories).
        trainable: a trained model; its checkpoints leave frozen parameters out.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    schedule: LRSchedule | None
    spec: EngineSpec
    rank: int
    trainable: bool

    def _options(self, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(ignore_frozen_params=self.trainable, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        """``{"model", "optimizer", "scheduler"}`` with DTensor shards (frozen: model only)."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if self.optimizer is None or self.schedule is None:
            return {"model": get_model_state_dict(self.model, options=self._options())}
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=self._options())
        return {"model": model_sd, "optimizer": optim_sd, "scheduler": self.schedule.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if self.optimizer is None or "optimizer" not in state:
            set_model_state_dict(self.model, state["model"], options=self._options())
            return
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optimizer"],
            options=self._options(),
        )
        if self.schedule is not None and "scheduler" in state:
            self.schedule.load_state_dict(state["scheduler"])

    def save(self, path: str | Path) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.save(self.state_dict(), checkpoint_id=str(path))

    def load(self, path: str | Path) -> None:
        import torch.distributed.checkpoint as dcp

        if not Path(path).is_dir():
            raise FileNotFoundError(f"{self.spec.role}: no checkpoint directory at {path}")
        state = self.state_dict()
        dcp.load(state, checkpoint_id=str(path))
        self.load_state_dict(state)

    def save_hf(self, path: str | Path, *, merge_lora: bool = True) -> None:
        """HF directory at ``path`` written by rank 0 (same layout as the torch engine's)."""
        model = self.model
        spec = self.spec
        out = Path(path)
        full = _full_state_on_rank0(model)
        merged: dict[str, torch.Tensor] = {}
        if is_peft_model(model) and merge_lora and not spec.value_head:
            for name, tensor in full_named_weights(model):
                if self.rank == 0:
                    merged[name] = tensor.detach().cpu().contiguous()
        if self.rank == 0:
            save_gathered_hf(
                model,
                out,
                full=full,
                merged=merged,
                value=spec.value_head,
                merge_lora=merge_lora,
                tokenizer=hf_tokenizer(spec.model, spec.model_path, out),
            )
            _unwrap_architectures(out)
            save_processor_files(spec.model, out, spec.model_path)  # VL models
        dist.barrier()
