"""What every data-parallel engine (``fsdp2``, ``deepspeed``) adds to the torch engine.

Each rank of a role holds a different share of every mini-batch and runs the
:class:`TorchEngine` computation on it. For one mini-batch split over N ranks to give the
single-process gradient:

* roles build their losses from the **global** normalizers (:meth:`global_normalizers`:
  one all-reduce of the counts), so each rank's loss is a partial sum of the mini-batch
  loss;
* loss and metrics are partial sums on each rank, so they are summed over ranks;
* FSDP and DeepSpeed *average* gradients over ranks, so each engine multiplies its loss
  by the data-parallel size before the backward (the average of N partial sums × N = the
  sum) — that part is the engine's own ``_backward``;
* sharded parameters are gathered and gradients reduced by collectives, so every rank
  must run the same number of forwards and backwards: ranks agree on the micro-batch
  count (all-reduce max) and a rank with fewer runs padding micro-batches whose loss is
  multiplied by 0;
* a non-finite loss on any rank stops every rank before its backward (all-reduce min).
"""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from temper.config.errors import ConfigError
from temper.data.batch import Batch
from temper.training.micro_batching import MicroBatching
from temper.training.spec import EngineSpec
from temper.training.torch_engine import TorchEngine


def require_process_group(role: str, strategy: str = "fsdp2") -> None:
    """Fail with the fix when no ``torch.distributed`` process group exists yet."""
    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigError(
            f"{role}.strategy",
            f"{strategy} needs an initialized torch.distributed process group (one process "
            "per rank); this process has none",
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


class DataParallelEngine(TorchEngine):
    """:class:`TorchEngine` whose ranks split every mini-batch (the collectives above).

    Subclasses call :meth:`_join_group` first in ``__init__`` and implement ``_backward``
    (scaled by :attr:`dp_size`) and their sharding hooks.
    """

    strategy: ClassVar[str] = "data-parallel"
    rank: int = 0
    world: int = 1
    _comm_device: torch.device = torch.device("cpu")

    def _join_group(self, spec: EngineSpec) -> EngineSpec:
        """Rank, world size and device of this process in the default process group;
        returns ``spec`` with the rank's device."""
        require_process_group(spec.role, self.strategy)
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        device = rank_device(spec.device)
        # a collective's tensors live where the backend wants them (gloo: CPU)
        self._comm_device = device if dist.get_backend() == "nccl" else torch.device("cpu")
        return spec if spec.device == device else replace(spec, device=device)

    @property
    def dp_size(self) -> int:
        return self.world

    def _sparse_tied_embedding_grad(self) -> None:
        """Sharded or reduced gradients stay dense (FSDP2 and ZeRO shard dense tensors)."""

    def _all_reduce(self, values: list[float], op: Any) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self._comm_device)
        dist.all_reduce(t, op=op)
        return [float(v) for v in t.tolist()]

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

    def _reduce_sums(self, sums: dict[str, float]) -> dict[str, float]:
        keys = sorted(sums)
        return dict(zip(keys, self.global_sum([sums[k] for k in keys])))
