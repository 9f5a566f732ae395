"""The ``deepspeed`` engine: the torch engine's computation under a DeepSpeed engine.

ROLL's ``deepspeed_train`` (actor, critic) and ``deepspeed_infer`` (reference): ZeRO
stage 0-3, optimizer/parameter offload, bf16/fp16, configured by the role's
``deepspeed`` section (see :mod:`temper.training.deepspeed_config`).

It runs inside the default ``torch.distributed`` process group, one process per rank
(Ray workers, ``torchrun``, ``spawn_ranks``); on the local backend, which has no group,
it creates a one-rank group itself (world size 1: ZeRO offload on one GPU is why a run
asks for DeepSpeed there). The forward, loss and micro-batching are the
:class:`TorchEngine`'s; the data-parallel rules are those of
:mod:`temper.training.data_parallel`. What DeepSpeed changes:

* the model is wrapped by ``deepspeed.initialize`` with temper's ``torch.optim.AdamW``
  as the client optimizer (ZeRO partitions its state; with ``offload_optimizer`` it
  steps on the CPU) and temper's LR schedule, which writes the lr into that optimizer;
* gradient accumulation is temper's: every micro-batch's loss is a partial sum of the
  mini-batch loss, so ``backward`` runs unscaled (``scale_wrt_gas=False``), times the
  data-parallel size (DeepSpeed averages over ranks), and the accumulation boundary is
  set explicitly on the last micro-batch (token-budget batches vary in count);
* clipping, the gradient norm and the finiteness check happen inside DeepSpeed's step
  for ZeRO and its bf16 optimizer (a non-finite norm makes DeepSpeed skip the step; the
  engine then raises :class:`NonFiniteError`); with stage 0 in fp32 DeepSpeed steps the
  client optimizer directly and temper checks the norm first, as the torch engine does;
* ZeRO-3 loads the model partitioned (``zero.Init`` through transformers' DeepSpeed
  integration), so no rank ever holds it whole.

Weights out and checkpoints are
:class:`~temper.training.deepspeed_io.DeepSpeedCheckpointer`'s, which the engine builds
from its model, DeepSpeed engine, optimizer, schedule and spec.

Importing DeepSpeed: see :func:`import_deepspeed` (the CPU accelerator, and the
``deepspeed_shm_comm`` op that would otherwise be compiled at the first start).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch
from torch import nn

from temper.config.errors import ConfigError
from temper.config.schema import ActorConfig
from temper.data.batch import Batch
from temper.training.base import NonFiniteError
from temper.training.data_parallel import DataParallelEngine
from temper.training.deepspeed_config import (
    PRECISIONS,
    DeepSpeedFill,
    ResolvedDeepSpeed,
    batch_fill,
    resolve_deepspeed_config,
    zero_stage,
)
from temper.training.deepspeed_io import DeepSpeedCheckpointer
from temper.training.local_world import ensure_local_world, forget_stale_deepspeed_groups
from temper.training.models import load_hf_config, role_compute_dtype
from temper.training.spec import EngineSpec

log = logging.getLogger(__name__)

SHM_OP = "deepspeed_shm_comm"


def import_deepspeed(device: torch.device, role: str = "actor") -> ModuleType:
    """``deepspeed``, ready for a run on ``device``.

    * On a CPU run DeepSpeed gets its CPU accelerator (``DS_ACCELERATOR=cpu`` unless set):
      collectives then go through gloo, the group temper already made.
    * DeepSpeed's first ``initialize`` on the CPU accelerator JIT-compiles the
      ``deepspeed_shm_comm`` op with g++ (minutes), even when installed with
      ``DS_BUILD_OPS=0``. That op only speeds up DeepSpeed's inference all-reduce, which
      temper never calls; training collectives are plain torch.distributed ones. Unless
      the op was built at install time (``DS_BUILD_SHM_COMM=1``), it is marked
      unavailable in DeepSpeed's table of compatible ops, the table DeepSpeed consults
      before building it, so nothing is compiled.
    * DeepSpeed's INFO logging (config dumps, per-step lines) is lowered to WARNING
      unless temper itself logs at DEBUG.
    """
    if device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
        import deepspeed.ops
        from deepspeed.git_version_info import installed_ops
    except ImportError as err:
        raise ConfigError(
            f"{role}.strategy",
            f"strategy 'deepspeed' needs the deepspeed package, which cannot be imported ({err})",
            "install it: DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed "
            "(scripts/install.sh does this), or choose strategy fsdp2/torch",
        ) from err
    if not installed_ops.get(SHM_OP, False):
        deepspeed.ops.__compatible_ops__[SHM_OP] = False
    if not log.isEnabledFor(logging.DEBUG):
        logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    return deepspeed


def ensure_process_group(device: torch.device) -> None:
    """A one-rank process group and its launcher variables when this process has none
    (the local backend; :mod:`temper.training.local_world`, which also ends it)."""
    forget_stale_deepspeed_groups()
    ensure_local_world(device)


def check_partitioned(
    role: str, l2_coef: float, stage: int, param_offload: bool, device_type: str
) -> None:
    """What DeepSpeed at ZeRO ``stage`` cannot honour (also run at check, from the config)."""
    if stage == 3 and l2_coef:
        # the actor's L2 term sums over the live parameters, which are partitions here
        raise ConfigError(
            f"{role}.l2_coef",
            "the explicit L2 term needs whole parameters; ZeRO-3 partitions them",
            f"use {role}.optim.weight_decay, or ZeRO stage 0-2",
        )
    if param_offload and device_type == "cuda":
        raise ConfigError(
            f"{role}.param_offload",
            "under strategy deepspeed, DeepSpeed places the weights",
            f"set {role}.deepspeed.zero_optimization.offload_param.device: cpu (ZeRO-3) instead",
        )


class DeepSpeedEngine(DataParallelEngine):
    """:class:`TorchEngine` wrapped by ``deepspeed.initialize`` (see module doc)."""

    strategy = "deepspeed"

    def __init__(self, spec: EngineSpec) -> None:
        section = spec.deepspeed_section
        stage = zero_stage(section, f"{spec.role}.deepspeed")
        self._check_supported(spec, stage)
        self.deepspeed = import_deepspeed(spec.device, spec.role)
        ensure_process_group(spec.device)
        # DeepSpeed's communication layer over temper's group, before anything (zero.Init
        # when loading under ZeRO-3) asks it for the world size
        self.deepspeed.init_distributed(dist_init_required=False)
        spec = self._join_group(spec)
        self.resolved = self._resolve(spec, section)
        for note in self.resolved.notes:
            log.warning("%s", note)
        self.stage = self.resolved.stage
        with self._partitioned_loading():
            super().__init__(spec)  # loads the model, builds AdamW and the LR schedule
        self.ds: Any = self._initialize()
        # stage 0 in fp32: DeepSpeed steps temper's optimizer itself, without a norm check
        self._plain = self.optimizer is not None and self.ds.optimizer is self.optimizer
        self.checkpointer = DeepSpeedCheckpointer(
            model=self.model,
            ds=self.ds,
            optimizer=self.optimizer,
            schedule=self.schedule,
            spec=self.spec,
            deepspeed=self.deepspeed,
            stage=self.stage,
            plain=self._plain,
            rank=self.rank,
            world=self.world,
        )

    # ------------------------------------------------------------------ construction

    @staticmethod
    def _check_supported(spec: EngineSpec, stage: int) -> None:
        l2 = spec.train.l2_coef if isinstance(spec.train, ActorConfig) else 0.0
        check_partitioned(spec.role, l2, stage, spec.param_offload, spec.device.type)

    def _resolve(self, spec: EngineSpec, section: dict[str, Any]) -> ResolvedDeepSpeed:
        """The complete DeepSpeed config of this role (temper's values filled in)."""
        t = spec.train
        micro, accum = batch_fill(t, spec.infer_micro.size, self.world)
        hf = load_hf_config(spec.model, spec.model_path)
        hidden = getattr(getattr(hf, "text_config", hf), "hidden_size", None)
        master = t.master_dtype if t is not None else None
        precision = PRECISIONS[role_compute_dtype(spec.model.dtype, master, spec.device)]
        grad_clip = t.grad_clip if t is not None and t.grad_clip is not None else 0.0
        fill = DeepSpeedFill(
            role=spec.role,
            micro_batch=micro,
            grad_accum=accum,
            world=self.world,
            grad_clip=max(0.0, float(grad_clip)),
            precision=precision,
            hidden_size=int(hidden) if hidden is not None else None,
            trainable=t is not None,
            master=t.master_dtype if t is not None else "fp32",
        )
        return resolve_deepspeed_config(section, fill)

    @contextlib.contextmanager
    def _partitioned_loading(self) -> Iterator[None]:
        """ZeRO-3: ``from_pretrained`` builds the model inside ``zero.Init`` and loads
        each partition (transformers' DeepSpeed integration, active only while the
        ``HfDeepSpeedConfig`` lives — so other models of this process load normally)."""
        if self.stage != 3:
            yield
            return
        from transformers.integrations import HfDeepSpeedConfig

        marker = HfDeepSpeedConfig(self.resolved.config)
        try:
            yield
        finally:
            del marker

    def _load_device(self) -> torch.device:
        # ZeRO-3 partitions are created on the device by zero.Init; otherwise DeepSpeed
        # moves the (host-loaded) module to the device in initialize
        return self.device if self.stage == 3 else torch.device("cpu")

    def _initialize(self) -> Any:
        if self.stage == 3:
            self._match_partitioned_dtype()
        kwargs: dict[str, Any] = {"model": self.model, "config": self.resolved.config}
        if self.optimizer is not None:
            kwargs["optimizer"] = self.optimizer
        engine, *_ = self.deepspeed.initialize(dist_init_required=False, **kwargs)
        return engine

    def _match_partitioned_dtype(self) -> None:
        """ZeRO-3 flattens the parameters it partitions into one buffer of one dtype.
        ``zero.Init`` made the Hugging Face model's in the run's precision (bf16/fp16), but
        a parameter added after loading — a value model's head, kept in fp32 storage —
        would still be fp32, and DeepSpeed asserts on the mix. Such parameters take the
        partitioned ones' dtype (DeepSpeed's master copy of all of them is in the role's
        ``master_dtype``)."""
        params = list(self.model.parameters())
        partitioned = [p.dtype for p in params if hasattr(p, "ds_id")]
        if not partitioned:
            return
        for p in params:
            if not hasattr(p, "ds_id") and p.dtype != partitioned[0]:
                p.data = p.data.to(partitioned[0])

    @contextlib.contextmanager
    def _on_device(self) -> Iterator[None]:
        # DeepSpeed places (and offloads) the parameters itself
        yield

    def _module(self) -> nn.Module:
        return self.ds

    # ------------------------------------------------------------------ training

    def _zero_grad(self) -> None:
        # the module's gradients; ZeRO clears its own partitions after every step
        self.ds.zero_grad()

    def _backward(self, loss: torch.Tensor, *, last: bool) -> None:
        # DeepSpeed averages gradients over all ranks and would divide by its
        # accumulation count; the loss is already a partial sum of the mini-batch's
        self.ds.set_gradient_accumulation_boundary(last)
        self.ds.backward(loss * self.world, scale_wrt_gas=False)

    def _apply_gradients(self) -> tuple[float, float]:
        assert self.optimizer is not None and self.schedule is not None
        if self._plain:
            params = list(self.trainable_parameters())
            norm = self._clip_grad_norm(params, float("inf"))  # DeepSpeed clips in step
            if not torch.isfinite(torch.tensor(norm)):
                self.ds.zero_grad()
                raise NonFiniteError(
                    f"{self.spec.role}: gradient norm is {norm}; optimizer step skipped, "
                    "weights unchanged"
                )
        lr = self.schedule.apply()
        self.ds.step()
        if not self._plain:
            got = self.ds.get_global_grad_norm()
            norm = float(got) if got is not None else float("nan")
            if not self.ds.was_step_applied() or not torch.isfinite(torch.tensor(norm)):
                raise NonFiniteError(
                    f"{self.spec.role}: gradient norm is {norm}; DeepSpeed skipped the "
                    "optimizer step, weights unchanged"
                )
        self.schedule.step()
        return norm, lr

    def _discard_gradients(self, mb: Batch, out: dict[str, torch.Tensor]) -> None:
        """ZeRO keeps accumulated gradients in its own buffers; the one documented way to
        drop them is a step it skips: a backward of NaN (DeepSpeed's overflow path
        clears every buffer and leaves the weights untouched)."""
        if self._plain:
            self.ds.zero_grad()
            return
        grad = next((v for v in out.values() if v.requires_grad), None)
        if grad is None:
            raise RuntimeError(f"{self.spec.role}: no differentiable output to clear with")
        self._backward(grad.sum() * float("nan"), last=True)
        self.ds.step()
        if self.ds.was_step_applied():  # cannot happen with temper's config (check above)
            raise RuntimeError(f"{self.spec.role}: DeepSpeed applied a step with NaN gradients")

    # ------------------------------------------------------------------ weights and state

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights under HF names (LoRA merged); ZeRO-3 gathers one decoder layer at
        a time. A collective: every rank must iterate to the end."""
        return self.checkpointer.named_weights()

    def state_dict(self) -> dict[str, Any]:
        """This rank's state: full trainable weights, its optimizer partition, schedule."""
        return self.checkpointer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.checkpointer.load_state_dict(state)

    def save_checkpoint(self, path: str) -> None:
        """DeepSpeed's own checkpoint in ``path`` (every rank writes its partition)."""
        self.checkpointer.save(path)

    def load_checkpoint(self, path: str) -> None:
        self.checkpointer.load(path)

    def save_hf(self, path: str, *, merge_lora: bool = True) -> None:
        """HF directory written by rank 0 (ZeRO-3: gathered layer by layer; a collective)."""
        self.checkpointer.save_hf(path, merge_lora=merge_lora)
