"""The ``fsdp2`` engine: the torch engine's computation, sharded with FSDP2 over ranks.

It runs inside an initialized ``torch.distributed`` process group (gloo on CPU, nccl on
GPU) — one process per rank, started by the Ray worker group (:mod:`temper.cluster`),
``torchrun`` or a test's ``torch.multiprocessing.spawn``. Every rank builds the same
model, then ``fully_shard`` is applied to each decoder layer and to the root (verl
``strategy: fsdp2``, ROLL ``fsdp2_train``). The math is the :class:`TorchEngine`'s — this
class only overrides its data-parallel hooks — so that one mini-batch split over N ranks
gives the single-process gradient:

* each rank holds a different share of the mini-batch; roles build their losses from
  the **global** normalizers (:meth:`global_normalizers`: one all-reduce of the counts);
* FSDP *averages* gradients over ranks, so each rank's loss is multiplied by the
  data-parallel size before ``backward`` (the average of N partial sums × N = the sum);
* loss and metrics are partial sums on each rank, so they are summed over ranks;
* FSDP's all-gather/reduce-scatter are collectives: every rank must run the same number
  of forwards and backwards. Ranks agree on the micro-batch count (all-reduce max) and a
  rank with fewer runs padding micro-batches whose loss is multiplied by 0;
* a non-finite loss on any rank stops every rank before its backward (all-reduce min);
* ``clip_grad_norm_`` on DTensor gradients computes the global norm over all shards.

Mixed precision: the torch engine's rule (fp32 master weights, compute in
``model.dtype``) as an FSDP ``MixedPrecisionPolicy`` (fp32 gradient reduction). On CPU
the compute dtype is fp32 and the policy is a no-op.
Checkpoints and full-weight export live in :mod:`temper.training.fsdp2_io`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from temper.config.errors import ConfigError
from temper.config.schema import FSDPConfig
from temper.data.batch import Batch
from temper.training import fsdp2_io
from temper.training.micro_batching import MicroBatching
from temper.training.spec import EngineSpec
from temper.training.torch_engine import TorchEngine

log = logging.getLogger(__name__)


def require_process_group(role: str) -> None:
    """Fail with the fix when no ``torch.distributed`` process group exists yet."""
    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigError(
            f"{role}.strategy",
            "fsdp2 needs an initialized torch.distributed process group (one process per "
            "rank); this process has none",
            "run with resources.backend: ray (roles then run in per-rank workers) or under "
            "torchrun; on one process use strategy: torch (the local backend does this)",
        )


def rank_device(device: torch.device) -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` on GPU (and made current), else the CPU."""
    if device.type != "cuda":
        return torch.device("cpu")
    index = int(os.environ.get("LOCAL_RANK", device.index or 0))
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


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
    if world % size:
        raise ConfigError(
            f"{role}.fsdp.fsdp_size",
            f"{size} does not divide the {world} ranks of {role}",
            f"use a divisor of {world}, or -1 (shard over all ranks)",
        )
    return init_device_mesh(
        device.type, (world // size, size), mesh_dim_names=("replicate", "shard")
    )


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks: HF ``_no_split_modules`` classes, else the longest ModuleList."""
    names: set[str] = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if layers:
        return layers
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


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


class FSDP2Engine(TorchEngine):
    """:class:`TorchEngine` sharded with ``fully_shard`` over the default process group."""

    def __init__(self, spec: EngineSpec) -> None:
        require_process_group(spec.role)
        if getattr(spec.train, "l2_coef", 0.0):
            # the actor's L2 term sums over the live parameters, which are shards here
            raise ConfigError(
                f"{spec.role}.l2_coef",
                "the explicit L2 term is not implemented for sharded (fsdp2) parameters",
                "use optim.weight_decay, or strategy: torch",
            )
        self.fsdp = spec.fsdp_config
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        device = rank_device(spec.device)
        self.mesh = build_mesh(self.fsdp, device, spec.role)
        # a collective's tensors live where the backend wants them (gloo: CPU)
        self._comm_device = device if dist.get_backend() == "nccl" else torch.device("cpu")
        if spec.device != device:
            from dataclasses import replace

            spec = replace(spec, device=device)
        super().__init__(spec)
        self._offload_optimizer = self.fsdp.optimizer_offload and device.type == "cuda"

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

    @property
    def dp_size(self) -> int:
        return self.world

    def _all_reduce(self, values: list[float], op: Any) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self._comm_device)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def global_sum(self, values: list[float]) -> list[float]:
        return self._all_reduce([float(v) for v in values], dist.ReduceOp.SUM)

    def _split(self, batch: Batch, spec: MicroBatching) -> tuple[list[Batch], list[list[int]]]:
        """The rank's micro-batches, padded with row-less copies to the ranks' maximum count."""
        if len(batch) == 0:
            raise ValueError(
                f"{self.spec.role} rank {self.rank} got no samples; the worker group pads "
                "batches so that every rank gets at least one"
            )
        micro, groups = super()._split(batch, spec)
        (most,) = self._all_reduce([float(len(micro))], dist.ReduceOp.MAX)
        pad = int(most) - len(micro)
        return [*micro, *[micro[-1]] * pad], [*groups, *[[] for _ in range(pad)]]

    def _all_finite(self, loss: torch.Tensor) -> bool:
        (ok,) = self._all_reduce([float(torch.isfinite(loss.detach()).item())], dist.ReduceOp.MIN)
        return ok > 0

    def _backward(self, loss: torch.Tensor) -> None:
        # FSDP averages gradients over the data-parallel ranks; the loss is a partial sum
        (loss * self.dp_size).backward()

    def _reduce_sums(self, sums: dict[str, float]) -> dict[str, float]:
        keys = sorted(sums)
        return dict(zip(keys, self.global_sum([sums[k] for k in keys])))

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
        fsdp2_io.move_optimizer_state(self.optimizer, self.device)
        self.optimizer.step()
        fsdp2_io.move_optimizer_state(self.optimizer, torch.device("cpu"))

    # ------------------------------------------------------------------ weights and state

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights under HF names (LoRA merged), gathered one tensor at a time.

        A collective: every rank must iterate to the end; every rank gets every tensor.
        """
        return fsdp2_io.full_named_weights(self.model)

    def state_dict(self) -> dict[str, Any]:
        """Sharded (DTensor) model + optimizer + schedule state, for
        ``torch.distributed.checkpoint`` (see :meth:`save_checkpoint`)."""
        return fsdp2_io.sharded_state(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        fsdp2_io.load_sharded_state(self, state)

    def save_checkpoint(self, path: str) -> None:
        """Sharded checkpoint directory (each rank writes its shards; a collective)."""
        fsdp2_io.save_checkpoint(self, path)

    def load_checkpoint(self, path: str) -> None:
        """Load a checkpoint saved by any number of ranks (DCP reshards on load)."""
        fsdp2_io.load_checkpoint(self, path)

    def save_hf(self, path: str, *, merge_lora: bool = True) -> None:
        """HF directory written by rank 0 from the gathered weights (a collective)."""
        fsdp2_io.save_hf(self, path, merge_lora=merge_lora)
