"""State of a megatron engine: sharded checkpoints, HF-name export, HF directories.

* **Checkpoints** are ``torch.distributed.checkpoint`` directories (the FSDP2 engine's
  format). Each parameter and its AdamW moments are DTensors over a ``(dp, tp)`` mesh
  laid out like Megatron's groups — sharded along the TP dimension Megatron splits,
  replicated over DP — so each rank writes only its shards, replicas are written once,
  and a run saved at one TP × DP layout resumes at another (DCP reshards). Under
  pipeline parallelism each stage writes its own parameters (those of every model chunk
  it holds, under interleaved stages) under their names in the whole model (global
  layer index; a tied embedding's last-stage copy is left out and restored from the
  first stage), so a checkpoint also resumes at another PP or virtual PP size. Megatron-
  Core's own ``dist_checkpointing`` is not used: its only save strategy (``torch_dist``)
  calls ``torch.cuda.synchronize`` and cannot run on CPU; this layout is the same idea
  (global tensors, per-rank shards) through torch's API, on CPU and GPU alike. The LR
  schedule and AdamW's step count ride along; each rank's RNG state is a file of its
  own under ``rng/`` (restored when the world size matches).
* **Export** (:meth:`MegatronCheckpointer.hf_named_weights`, :mod:`megatron_export`):
  for weight sync and HF directories, each parameter fetched from a rank holding it and
  its TP shards gathered, one at a time.
* **Experts** with their own TP size (ETP ≠ TP) are DTensors over an ``(edp × ep, etp)``
  mesh of Megatron's expert groups instead, so their checkpoints reshard over ETP too.
* **HF directories** (:meth:`MegatronCheckpointer.save_hf`): rank 0 writes safetensors
  (sharded at 5 GB), ``config.json``, the generation config and the tokenizer; a critic
  writes the layout of :class:`temper.training.models.ValueModel` (backbone +
  ``value_head.safetensors``).

:class:`MegatronCheckpointer` holds the parts of an engine these need — the GPTModel and
its conversion maps, the parallel groups, optimizer, schedule and spec — and nothing of
the engine class, so an engine owns its checkpointer and never the reverse. Every public
method is a collective over the engine's ranks.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from temper.training.hf_export import load_tokenizer, save_processor_files
from temper.training.megatron_convert import Kind, ParamMap
from temper.training.megatron_export import MegatronExport
from temper.training.megatron_lora import LoraAdapters
from temper.training.megatron_model import MegatronModel, model_dir
from temper.training.megatron_moe import is_expert_param
from temper.training.megatron_parallel import Parallel
from temper.training.megatron_pipeline import StageLink, sync_tied_state
from temper.training.models import VALUE_HEAD_FILE, VALUE_MODEL_STAMP
from temper.training.schedule import LRSchedule
from temper.training.spec import EngineSpec

log = logging.getLogger(__name__)

RNG_DIR = "rng"


def _causal_architecture(config: Any) -> str:
    return {
        "llama": "LlamaForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "qwen3": "Qwen3ForCausalLM",
        "qwen2_moe": "Qwen2MoeForCausalLM",
        "qwen3_moe": "Qwen3MoeForCausalLM",
        "mixtral": "MixtralForCausalLM",
        "qwen2_vl": "Qwen2VLForConditionalGeneration",
        "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    }[config.model_type]


def _base_architecture(config: Any) -> str:
    return {
        "llama": "LlamaModel",
        "qwen2": "Qwen2Model",
        "qwen3": "Qwen3Model",
        "qwen2_moe": "Qwen2MoeModel",
        "qwen3_moe": "Qwen3MoeModel",
        "mixtral": "MixtralModel",
    }[config.model_type]


def _checkpoint_name(name: str) -> str:
    """A tensor's name in a saved HF directory: a vision-language model's state-dict
    names (``model.language_model.*``, ``model.visual.*``) in the checkpoint layout that
    ``save_pretrained`` writes and the source model has (``model.*``, ``visual.*``)."""
    if name.startswith("model.language_model."):
        return "model." + name.removeprefix("model.language_model.")
    if name.startswith("model.visual."):
        return name.removeprefix("model.")
    return name


def _copy_generation_config(spec: EngineSpec, out: Path) -> None:
    from transformers import GenerationConfig

    try:
        gen = GenerationConfig.from_pretrained(model_dir(spec.model_path or spec.model.path))
    except OSError:
        return
    gen.save_pretrained(str(out))


@dataclass(frozen=True)
class MegatronCheckpointer:
    """Checkpoints, HF-name export and HF directories of one megatron engine (see module
    doc).

    Attributes:
        model: this rank's GPTModel (its TP shard of every parameter).
        built: the model's HF layout, config and Megatron ↔ HF parameter maps.
        parallel: the TP, PP and DP groups this rank belongs to.
        optimizer: AdamW over the local shards, ``None`` when frozen.
        schedule: the LR schedule, saved beside the optimizer.
        spec: what the engine was built from (role, model section, kind).
        device: this rank's device (the checkpoint mesh's device type).
        trainable: a trained model; its checkpoints leave frozen parameters out.
        adapters: the LoRA adapters (``model.lora``): exported merged into their base
            weights and as peft's adapter files; checkpoints hold them (the base frozen).
    """

    model: nn.Module
    built: MegatronModel
    parallel: Parallel
    optimizer: torch.optim.Optimizer | None
    schedule: LRSchedule | None
    spec: EngineSpec
    device: torch.device
    trainable: bool
    adapters: LoraAdapters | None = None

    # ----------------------------------------------------------------------- export

    @cached_property
    def export(self) -> MegatronExport:
        """The HF-name export of this engine's parameters (:mod:`megatron_export`)."""
        return MegatronExport(
            self.model, self.built, self.parallel, self.device, self.adapters, self.spec.value_head
        )

    def hf_named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """:meth:`MegatronExport.hf_named_weights` (a collective)."""
        return self.export.hf_named_weights()

    def peft_named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """:meth:`MegatronExport.peft_named_weights` (a collective)."""
        return self.export.peft_named_weights()

    def save_adapter(self, out: Path) -> None:
        """peft's adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``)
        at ``out``, written by rank 0 (every rank gathers)."""
        from safetensors.torch import save_file

        from temper.training.models import lora_config

        tensors = {k: v.detach().to("cpu").clone() for k, v in self.peft_named_weights()}
        if dist.get_rank() != 0:
            return
        out.mkdir(parents=True, exist_ok=True)
        config = lora_config(self.spec.model.lora)
        if self.adapters is not None:  # HF module names (the section may use Megatron's)
            config.target_modules = self.adapters.hf_targets()
        config.base_model_name_or_path = self.spec.model_path
        config.save_pretrained(str(out))
        save_file(tensors, str(out / "adapter_model.safetensors"))

    def save_hf(self, path: str | Path, *, merge_lora: bool = True) -> None:
        """A Hugging Face directory at ``path``, written by rank 0 (every rank gathers);
        under LoRA the merged model + ``lora_adapter/``, or the adapter alone without
        ``merge_lora`` (the torch engine's layout, :func:`hf_export.save_hf_model`)."""
        from huggingface_hub import save_torch_state_dict

        spec = self.spec
        out = Path(path)
        rank0 = dist.get_rank() == 0
        if self.adapters is not None:
            self.save_adapter(out / "lora_adapter" if merge_lora else out)
            if not merge_lora:
                dist.barrier()
                return
        state: dict[str, torch.Tensor] = {}
        head: dict[str, torch.Tensor] = {}
        tied = self.built.layout.tied_embeddings
        for name, tensor in self.hf_named_weights():
            if not rank0 or (tied and name == "lm_head.weight"):  # HF ties it on load
                continue
            t = tensor.detach().to("cpu").clone()  # own memory: no shared or oversized storage
            if name.startswith("value_head."):
                head[name.removeprefix("value_head.")] = t
            else:
                state[_checkpoint_name(name)] = t
        if rank0:
            out.mkdir(parents=True, exist_ok=True)
            config = self.built.hf_config
            if spec.value_head:
                config.architectures = [_base_architecture(config)]
            else:
                config.architectures = [_causal_architecture(config)]
            config.save_pretrained(str(out))
            save_torch_state_dict(state, str(out), max_shard_size="5GB")
            if spec.value_head:
                from safetensors.torch import save_file

                save_file(head, str(out / VALUE_HEAD_FILE))
                stamp = {"hidden_size": self.built.layout.hidden_size}
                (out / VALUE_MODEL_STAMP).write_text(json.dumps(stamp))
            else:
                _copy_generation_config(spec, out)
            try:
                tok = load_tokenizer(spec.model, spec.model_path)
                tok.save_pretrained(str(out))
            except (OSError, ValueError) as err:
                log.warning("no tokenizer saved with %s: %s", out, err)
            if not spec.value_head:
                save_processor_files(spec.model, out, spec.model_path)  # VL models
        dist.barrier()

    # ----------------------------------------------------------------------- checkpoints

    @cached_property
    def _mesh(self) -> Any:
        """A ``(dp, tp)`` device mesh over this pipeline stage's ranks, laid out like
        Megatron's groups (rank = ((pp_index × DP + dp_index) × CP + cp_index) × TP +
        tp_index); its ``dp`` dimension spans DP × CP (CP ranks hold the same weights, like
        DP ranks: both replicate); made at the first checkpoint."""
        from torch.distributed.device_mesh import init_device_mesh

        p = self.parallel
        device = "cuda" if self.device.type == "cuda" else "cpu"
        dp = p.dp * p.cp
        if p.pp == 1:
            return init_device_mesh(device, (dp, p.tp), mesh_dim_names=("dp", "tp"))
        mesh = init_device_mesh(device, (p.pp, dp, p.tp), mesh_dim_names=("pp", "dp", "tp"))
        return mesh["dp", "tp"]

    @cached_property
    def _expert_mesh(self) -> Any:
        """The mesh an expert's weight is laid out on: :attr:`_mesh` when ETP = TP, else an
        ``(edp × ep, etp)`` mesh over this stage's ranks (Megatron's expert groups: rank =
        pp_index × stage + (edp_index × EP + ep_index) × ETP + etp_index), so that an
        expert's shards are a ``Shard`` over its ETP group whatever the TP size."""
        from torch.distributed.device_mesh import init_device_mesh

        p = self.parallel
        if p.etp == p.tp:
            return self._mesh
        device = "cuda" if self.device.type == "cuda" else "cpu"
        rest = p.world // (p.pp * p.etp)
        names = ("pp", "edp", "etp")
        return init_device_mesh(device, (p.pp, rest, p.etp), mesh_dim_names=names)["edp", "etp"]

    @cached_property
    def _kinds(self) -> dict[str, Kind]:
        """How each Megatron parameter is split over TP (by parameter name)."""
        return {pm.megatron: pm.kind for pm in self._all_maps}

    @property
    def _all_maps(self) -> list[ParamMap]:
        """The model's parameter maps and its LoRA adapters'."""
        return self.built.maps + (self.adapters.maps() if self.adapters is not None else [])

    @cached_property
    def _saved(self) -> dict[str, str]:
        """The parameters a checkpoint holds, by module name, with their names in the
        whole model (a stage's layers under their global index; a tied copy left out)."""
        return {pm.megatron: pm.global_name for pm in self._all_maps if not pm.tied_copy}

    def _pieces(self, name: str, local: torch.Tensor, key: str) -> dict[str, Any]:
        """``local`` (a parameter-shaped tensor of this rank) as DTensors whose global shape
        does not depend on the TP (ETP) size: the fused GLU weight is kept as its gate and up
        halves (Megatron's ``[gate_r; up_r]`` per rank is no slice of one global tensor)."""
        from torch.distributed.tensor import DTensor, Replicate, Shard

        kind = self._kinds[name]
        mesh = self._expert_mesh if is_expert_param(name) else self._mesh
        if kind == "rep":
            return {
                key: DTensor.from_local(local, mesh, [Replicate(), Replicate()], run_check=False)
            }
        dim = 1 if kind == "row" else 0
        place = [Replicate(), Shard(dim)]
        if kind != "glu":
            return {key: DTensor.from_local(local, mesh, place, run_check=False)}
        gate, up = local.chunk(2, dim=0)
        return {
            f"{key}.gate": DTensor.from_local(gate, mesh, place, run_check=False),
            f"{key}.up": DTensor.from_local(up, mesh, place, run_check=False),
        }

    def _adam_state(self) -> dict[str, dict[str, torch.Tensor]]:
        """AdamW's per-parameter state by parameter name, created (zeros) where the
        optimizer has not stepped yet, so a fresh engine has tensors to load into."""
        assert self.optimizer is not None
        out: dict[str, dict[str, torch.Tensor]] = {}
        for name, p in self.model.named_parameters():
            if not p.requires_grad:
                continue
            state = self.optimizer.state[p]
            if not state:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            out[name] = state
        return out

    def _checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint holds, as DTensors over the current layout (see
        :meth:`_pieces`)."""
        state: dict[str, Any] = {}
        saved = self._saved
        for name, p in self.model.named_parameters():
            if (self.trainable and not p.requires_grad) or name not in saved:
                continue
            pieces = self._pieces(name, p.data, saved[name])
            state.update({f"model.{k}": v for k, v in pieces.items()})
        if self.optimizer is None or self.schedule is None:
            return state
        steps = set()
        for name, st in self._adam_state().items():
            steps.add(float(st["step"]))
            if name not in saved:
                continue
            for key in ("exp_avg", "exp_avg_sq"):
                pieces = self._pieces(name, st[key], saved[name])
                state.update({f"optimizer.{key}.{k}": v for k, v in pieces.items()})
        state["optimizer.step"] = steps.pop() if len(steps) == 1 else 0.0
        state["scheduler"] = self.schedule.state_dict()
        return state

    def _sync_tied_copy(self) -> None:
        """A tied embedding's last-stage copy (not in checkpoints) from the first stage:
        weight, and AdamW moments when training."""
        p = self.parallel
        if p.pp == 1 or not self.built.layout.tied_embeddings or self.spec.value_head:
            return
        if not (p.first_stage or p.last_stage):
            return
        params = dict(self.model.named_parameters())
        if p.first_stage:
            name = self.built.name_of("embed_tokens.weight")
        else:
            name = self.built.name_of("lm_head.weight", tied_copy=True)
        assert name is not None  # the first and last stage hold the embedding or its copy
        tensors = [params[name].data]
        # AdamW moments of a trained embedding (under LoRA it is frozen and has none)
        if self.optimizer is not None and self.schedule is not None and params[name].requires_grad:
            st = self._adam_state()[name]
            tensors += [st["exp_avg"], st["exp_avg_sq"]]
        comm = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        sync_tied_state(StageLink(p, self.device, comm), tensors)

    def save(self, path: str | Path) -> None:
        """Each rank writes its shards (``torch.distributed.checkpoint``); replicas once."""
        import torch.distributed.checkpoint as dcp

        out = Path(path)
        dcp.save(self._checkpoint_state(), checkpoint_id=str(out))
        (out / RNG_DIR).mkdir(exist_ok=True)
        rng = {"torch": torch.get_rng_state(), "world": dist.get_world_size()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state()
        torch.save(rng, out / RNG_DIR / f"rank{dist.get_rank()}.pt")
        dist.barrier()

    def load(self, path: str | Path) -> None:
        """Inverse of :meth:`save`, at this engine's (possibly other) TP × PP × DP."""
        import torch.distributed.checkpoint as dcp

        src = Path(path)
        if not src.is_dir():
            raise FileNotFoundError(f"{self.spec.role}: no checkpoint directory at {src}")
        state = self._checkpoint_state()
        with torch.no_grad():
            dcp.load(state, checkpoint_id=str(src))  # fills the parameters and moments in place
        if self.optimizer is not None and self.schedule is not None:
            step = float(state["optimizer.step"])
            for st in self._adam_state().values():
                st["step"] = torch.tensor(step)
            self.schedule.load_state_dict(state["scheduler"])
        self._sync_tied_copy()
        rng_file = src / RNG_DIR / f"rank{dist.get_rank()}.pt"
        if rng_file.is_file():
            rng = torch.load(rng_file, weights_only=True)
            if int(rng["world"]) == dist.get_world_size():
                torch.set_rng_state(rng["torch"])
                if "cuda" in rng and torch.cuda.is_available():
                    torch.cuda.set_rng_state(rng["cuda"])
            else:
                log.info(
                    "%s: checkpoint saved on %s ranks, resumed on %s: RNG states start afresh",
                    self.spec.role,
                    rng["world"],
                    dist.get_world_size(),
                )
