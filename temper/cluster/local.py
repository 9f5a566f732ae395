"""The in-process worker group: one rank, the role object itself (``backend: local``).

It is what runs today on a laptop, in CI and on one GPU, behind the same
:class:`~temper.cluster.base.WorkerGroup` calls as the Ray group, so code written
against worker groups runs unchanged on both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temper.cluster.base import WorkerGroup
from temper.data.batch import Batch


class LocalWorkerGroup(WorkerGroup):
    """A single rank holding ``worker`` (an Actor, Critic, Reference, …) in this process."""

    def __init__(self, role: str, worker: Any) -> None:
        self.role = role
        self.world_size = 1
        self.worker = worker

    def call_ranks(self, method: str, per_rank_args: Sequence[tuple[Any, ...]], **kw: Any) -> list:
        if len(per_rank_args) != 1:
            raise ValueError(f"{self.role}: the local group has 1 rank, got {len(per_rank_args)}")
        return [getattr(self.worker, method)(*per_rank_args[0], **kw)]

    def dispatch(self, method: str, batch: Batch, *, balance: bool = True, **kw: Any) -> Batch:
        # one rank: no padding, no reordering
        return getattr(self.worker, method)(batch, **kw)
