"""The engines of a pipeline that trains nothing (``temper generate``, a rollout-only
agentic run): nothing syncs weights into them, each loads ``model.path`` itself.

On the local backend one engine runs in the command's process (a tensor-parallel vLLM
engine starts its other ranks itself: :func:`temper.rollout.vllm_args.spawns_ranks`).
On Ray the rollout's devices (``resources.actor_infer``, by default every device of
``resources.nnodes × devices_per_node``) get the ``rollout`` worker group of an RL run —
one engine per ``rollout.tensor_parallel_size`` of them, over the nodes — and
:class:`~temper.cluster.rollout.RemoteRollout` splits each call's prompts among the
engines (verl's generation: one worker group over ``nnodes × n_gpus_per_node``, data
parallel over its tensor-parallel groups).
"""

from __future__ import annotations

from typing import Any

from temper.cluster.placement import rank_slots, worker_device
from temper.cluster.rollout import RemoteRollout
from temper.config.derive import placement
from temper.config.schema import TemperConfig
from temper.rollout import RolloutEngine, build_rollout_engine
from temper.rollout.vllm_kv import EngineDemand

#: The ``resources`` keys such a pipeline reads (the rest are refused: it has no roles
#: to place but the rollout's).
RESOURCE_KEYS = ("backend", "nnodes", "devices_per_node", "actor_infer", "ray")


class StandaloneRollout(RemoteRollout):
    """The rollout worker group of a run that has no other roles: closing it releases its
    workers and its placement group (an RL run's ``ClusterRoles`` does that for its
    groups together)."""

    def __init__(self, group: Any, placement_group: Any) -> None:
        super().__init__(group)
        self.placement_group = placement_group

    def close(self) -> None:
        from temper.cluster.roles import release

        super().close()
        release([self.group], [self.placement_group], None)
        self.placement_group = None


def build_generation_engine(
    cfg: TemperConfig, tokenizer: Any, demand: EngineDemand
) -> RolloutEngine:
    """The engine(s) a generation runs, for ``resources.backend``; ``close()`` ends them."""
    if cfg.resources.backend == "local":
        return build_rollout_engine(
            cfg.rollout, cfg.model, tokenizer=tokenizer, device=worker_device(cfg), demand=demand
        )
    from temper.cluster.ray import RayWorkerGroup, init_ray, require_ray
    from temper.cluster.roles import check_capacity, placement_group, ray_node_ids

    init_ray(cfg)
    ray = require_ray()
    place = {"rollout": placement(cfg)["actor_infer"]}
    device = worker_device(cfg)
    nnodes, rc = cfg.resources.nnodes, cfg.resources.ray
    nodes = ray_node_ids(ray, nnodes, rc.rpc_timeout, wait=bool(rc.address)) if nnodes > 1 else None
    check_capacity(ray, place, "GPU" if device == "cuda" else "CPU")
    pg = placement_group(
        ray, cfg, tuple(sorted(place["rollout"])), nodes, device == "cuda", ["rollout"]
    )
    try:
        slots = [(pg, bundle, share) for _, bundle, share in rank_slots(place)["rollout"]]
        group = RayWorkerGroup("rollout", cfg, slots=slots, device=device, demand=demand)
    except BaseException:
        ray.util.remove_placement_group(pg)
        raise
    return StandaloneRollout(group, pg)
