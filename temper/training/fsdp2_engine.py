"""The ``fsdp2`` engine: the torch engine's computation, sharded with FSDP2 over ranks.

It runs inside an initialized ``torch.distributed`` process group (gloo on CPU, nccl on
GPU) — one process per rank, started by the Ray worker group (:mod:`temper.cluster`),
``torchrun`` or a test's ``torch.multiprocessing.spawn``. Every rank builds the same
model, then ``fully_shard`` is applied to each decoder layer and to the root (verl
``strategy: fsdp2``, ROLL ``fsdp2_train``). The math is the :class:`TorchEngine`'s — this
class only overrides its data-parallel hooks — so that one mini-batch split over N ranks
gives the single-process gradient (the rules are in :mod:`temper.training.data_parallel`):
FSDP *averages* gradients over ranks, so each rank's loss is multiplied by the
data-parallel size before ``backward``, and ``clip_grad_norm_`` on DTensor gradients
computes the global norm over all shards.

Mixed precision: the torch engine's rule (master weights stored in the role's
``master_dtype``, fp32 by default; compute in ``model.dtype``) as an FSDP
``MixedPrecisionPolicy``: gradients are reduced in fp32 and kept in the master dtype,
where AdamW's state follows them. On CPU with fp32 masters the policy is a no-op.
Checkpoints and full-weight export are :class:`~temper.training.fsdp2_io.FSDP2Checkpointer`'s,
which the engine builds from its model, optimizer, schedule and spec.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from temper.config.errors import ConfigError
from temper.config.schema import ActorConfig, FSDPConfig
from temper.training.data_parallel import DataParallelEngine, require_process_group
from temper.training.fsdp2_io import FSDP2Checkpointer, full_named_weights, move_optimizer_state
from temper.training.models import decoder_layers
from temper.training.spec import EngineSpec

log = logging.getLogger(__name__)


def check_sharded(role: str, l2_coef: float, fsdp_size: int, world: int) -> None:
    """What FSDP2 over ``world`` ranks cannot honour (also run at check, from the config)."""
    if l2_coef:
        # the actor's L2 term sums over the live parameters, which are shards here
        raise ConfigError(
            f"{role}.l2_coef",
            "the explicit L2 term is not implemented for sharded (fsdp2) parameters",
            "use optim.weight_decay, or strategy: torch",
        )
    if 0 < fsdp_size < world and world % fsdp_size:
        raise ConfigError(
            f"{role}.fsdp.fsdp_size",
            f"{fsdp_size} does not divide the {world} ranks of {role}",
            f"use a divisor of {world}, or -1 (shard over all ranks)",
        )


def build_mesh(cfg: FSDPConfig, device: torch.device, role: str) -> Any:
    """1-D ``(fsdp,)`` mesh over all ranks, or HSDP ``(replicate, shard)`` when
    ``fsdp_size`` is smaller than the world (shards within groups of ``fsdp_size`` ranks,
    replicas across them: less communication across nodes)."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    backend = dist.get_backend()
    if device.type == "cuda" and backend != "nccl":
        raise RuntimeError(f"{role}: fsdp2 on GPU needs the nccl backend, got {backend}")
    if device.type == "cpu" and backend == "nccl":
        raise RuntimeError(f"{role}: fsdp2 on CPU needs the gloo backend (nccl is GPU-only)")
    size = cfg.fsdp_size
    if size <= 0 or size >= world:
        return init_device_mesh(device.type, (world,), mesh_dim_names=("fsdp",))
    check_sharded(role, 0.0, size, world)
    return init_device_mesh(
        device.type, (world // size, size), mesh_dim_names=("replicate", "shard")
    )


def large_modules(model: nn.Module, layers: list[nn.Module], min_params: int) -> list[nn.Module]:
    """Leaf modules outside the decoder layers with ≥ ``min_params`` own parameters
    (embeddings, heads), except those sharing a parameter with another module (tied
    embeddings must stay in one FSDP unit)."""
    if min_params <= 0:
        return []
    inside = {id(m) for layer in layers for m in layer.modules()}
    owners: dict[int, int] = {}
    for m in model.modules():
        for p in m.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    found = []
    for m in model.modules():
        own = list(m.parameters(recurse=False))
        if id(m) in inside or any(True for _ in m.children()) or not own:
            continue
        if sum(p.numel() for p in own) >= min_params and all(owners[id(p)] == 1 for p in own):
            found.append(m)
    return found


class FSDP2Engine(DataParallelEngine):
    """:class:`TorchEngine` sharded with ``fully_shard`` over the default process group."""

    strategy = "fsdp2"

    def __init__(self, spec: EngineSpec) -> None:
        require_process_group(spec.role, self.strategy)
        l2 = spec.train.l2_coef if isinstance(spec.train, ActorConfig) else 0.0
        check_sharded(spec.role, l2, 0, 1)
        self.fsdp = spec.fsdp_config
        spec = self._join_group(spec)
        self.mesh = build_mesh(self.fsdp, spec.device, spec.role)
        super().__init__(spec)
        self._offload_optimizer = self.fsdp.optimizer_offload and spec.device.type == "cuda"
        self.checkpointer = FSDP2Checkpointer(
            model=self.model,
            optimizer=self.optimizer,
            schedule=self.schedule,
            spec=self.spec,
            rank=self.rank,
            trainable=self.trainable,
        )

    # ------------------------------------------------------------------ sharding

    def _load_device(self) -> torch.device:
        # full weights stay on the host; fully_shard moves each rank's shard to the device
        return torch.device("cpu")

    def _offload(self) -> bool:
        return bool(self.fsdp.offload_policy or self.fsdp.param_offload or self.spec.param_offload)

    def _wrap_model(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import (
            CPUOffloadPolicy,
            MixedPrecisionPolicy,
            OffloadPolicy,
            fully_shard,
        )

        if self.compute_dtype == torch.float32:
            mp = MixedPrecisionPolicy()
        else:
            mp = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
        offload: OffloadPolicy = OffloadPolicy()
        if self._offload():
            if self.device.type == "cuda":
                offload = CPUOffloadPolicy(pin_memory=True)
            else:
                log.info(
                    "%s: fsdp offload is moot on CPU (weights are on the host)", self.spec.role
                )
        kwargs = dict(
            mesh=self.mesh,
            reshard_after_forward=self.fsdp.reshard_after_forward,
            mp_policy=mp,
            offload_policy=offload,
        )
        layers = decoder_layers(model)
        if not layers:
            log.warning(
                "%s: no decoder layers found; sharding the model as one unit", self.spec.role
            )
        for module in [*layers, *large_modules(model, layers, self.fsdp.wrap_min_num_params)]:
            fully_shard(module, **kwargs)
        fully_shard(model, **kwargs)  # also moves the remaining params and buffers
        return model

    @contextlib.contextmanager
    def _on_device(self) -> Iterator[None]:
        # FSDP's offload policy moves parameters itself
        yield

    # ------------------------------------------------------------------ collectives

    def _backward(self, loss: torch.Tensor, *, last: bool) -> None:
        # FSDP averages gradients over all ranks; the loss is a partial sum (of the
        # data-parallel rank's share; a sequence-parallel member holds its columns' part)
        (loss * self.world).backward()

    def _clip_grad_norm(self, params: list[nn.Parameter], clip: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(params, clip)
        full = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        return float(full)

    def _optimizer_step(self) -> None:
        """``optimizer_offload``: Adam state visits the GPU only for the step."""
        assert self.optimizer is not None
        if not self._offload_optimizer:
            self.optimizer.step()
            return
        move_optimizer_state(self.optimizer, self.device)
        self.optimizer.step()
        move_optimizer_state(self.optimizer, torch.device("cpu"))

    # ------------------------------------------------------------------ weights and state

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights under HF names (LoRA merged), gathered one tensor at a time.

        A collective: every rank must iterate to the end; every rank gets every tensor.
        """
        return full_named_weights(self.model)

    def state_dict(self) -> dict[str, Any]:
        """Sharded (DTensor) model + optimizer + schedule state, for
        ``torch.distributed.checkpoint`` (see :meth:`save_checkpoint`)."""
        return self.checkpointer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.checkpointer.load_state_dict(state)

    def save_checkpoint(self, path: str) -> None:
        """Sharded checkpoint directory (each rank writes its shards; a collective)."""
        self.checkpointer.save(path)

    def load_checkpoint(self, path: str) -> None:
        """Load a checkpoint saved by any number of ranks (DCP reshards on load)."""
        self.checkpointer.load(path)

    def save_hf(self, path: str, *, merge_lora: bool = True) -> None:
        """HF directory written by rank 0 from the gathered weights (a collective)."""
        self.checkpointer.save_hf(path, merge_lora=merge_lora)
