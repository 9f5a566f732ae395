"""Where roles run: in this process (``local``) or as Ray actors, one per rank (``ray``).

Public API (importing this package does not import Ray):

* :class:`WorkerGroup` — ``call_all`` / ``scatter`` / ``dispatch`` over a role's ranks,
  and ``WorkerGroupError`` (role, rank and cause of a failed rank);
  ``temper.cluster.ray.RayWorkerGroup``. ``backend: local`` needs no group: the roles run in this process;
* :func:`build_cluster_roles` — the run's roles for ``resources.backend``;
* :func:`karmarkar_karp`, :func:`greedy_partition`, :func:`balance_order` — token-balanced
  equal-size data-parallel shards;
* :func:`spawn_ranks`, :func:`init_process_group` — torch.distributed groups of ranks;
* :func:`placement_rows` — the placement table of ``temper check``.
"""

from temper.cluster.balance import balance_order, greedy_partition, karmarkar_karp
from temper.cluster.base import WorkerGroup, shard_batch, unshard_batch
from temper.cluster.placement import placement_rows
from temper.cluster.process_group import init_process_group, spawn_ranks
from temper.cluster.roles import build_cluster_roles, build_cluster_rollout

__all__ = [
    "WorkerGroup",
    "balance_order",
    "build_cluster_roles",
    "build_cluster_rollout",
    "greedy_partition",
    "init_process_group",
    "karmarkar_karp",
    "placement_rows",
    "shard_batch",
    "spawn_ranks",
    "unshard_batch",
]
