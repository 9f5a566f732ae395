"""Roles as the driver sees them on the Ray backend: proxies over worker groups.

The pipeline calls ``roles.actor.compute_log_probs(batch)``, ``roles.actor.update(batch)``
and ``roles.actor.engine.named_weights()`` whatever the backend; here each call becomes a
dispatch to the role's ranks. :func:`build_cluster_roles` is the one entry point:
``backend: local`` returns the in-process roles unchanged, ``backend: ray`` starts (or
joins) Ray, creates the placement groups and the worker groups.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from temper.cluster.base import WorkerGroup
from temper.cluster.placement import worker_device
from temper.config.derive import placement, uses_critic, uses_reference
from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.data.batch import Batch
from temper.roles.builder import Roles, build_roles
from temper.roles.minibatch import optimizer_steps

log = logging.getLogger(__name__)

_PLACEMENT_KEY = {"actor": "actor_train", "reference": "reference", "critic": "critic"}


def _mean_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Engine metrics are already global (equal on all ranks); rank-local extras average."""
    keys = per_rank[0].keys()
    return {k: sum(float(m[k]) for m in per_rank) / len(per_rank) for k in keys}


class RemoteEngine:
    """The driver's handle on a sharded engine: weight export and HF save."""

    model = None  # no local module: the rollout engine owns its copy
    device = torch.device("cpu")

    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.group.full_weights().items())  # type: ignore[attr-defined]

    def save_hf(self, path: str) -> None:
        self.group.call_all("engine.save_hf", path)

    def save_checkpoint(self, path: str) -> None:
        self.group.call_all("engine.save_checkpoint", path)

    def load_checkpoint(self, path: str) -> None:
        self.group.call_all("engine.load_checkpoint", path)

    def set_total_steps(self, total_steps: int) -> None:
        self.group.call_all("engine.set_total_steps", total_steps)


class _RemoteTrained:
    def __init__(self, group: WorkerGroup, cfg: Any, balance: bool) -> None:
        self.group, self.cfg, self.balance = group, cfg, balance
        self.engine = RemoteEngine(group)
        self._updates = 0

    @property
    def updates(self) -> int:
        """Updates done (seeds the mini-batch shuffle); mirrored on every rank."""
        return self._updates

    @updates.setter
    def updates(self, value: int) -> None:  # a resumed run sets it on the ranks too
        self.group.call_all("__setattr__", "updates", int(value))
        self._updates = int(value)

    def optimizer_steps_per_update(self, num_samples: int) -> int:
        return optimizer_steps(num_samples, self.cfg.mini_batch_size, self.cfg.ppo_epochs)

    def set_total_steps(self, total_steps: int) -> None:
        self.group.call_all("set_total_steps", total_steps)

    def update(self, batch: Batch) -> dict[str, float]:
        """Each rank updates on its equal share; the ranks' (global) metrics."""
        metrics = _mean_metrics(self.group.scatter("update", batch, balance=self.balance))
        self._updates += 1
        return metrics


class RemoteActor(_RemoteTrained):
    def compute_log_probs(self, batch: Batch, *, with_entropy: bool = False) -> Batch:
        return self.group.dispatch("compute_log_probs", batch, with_entropy=with_entropy)


class RemoteCritic(_RemoteTrained):
    def compute_values(self, batch: Batch) -> Batch:
        return self.group.dispatch("compute_values", batch)


@dataclass
class RemoteReference:
    group: WorkerGroup
    engine: Any = field(init=False)

    def __post_init__(self) -> None:
        self.engine = RemoteEngine(self.group)

    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        return self.group.dispatch("compute_ref_log_probs", batch)


@dataclass
class ClusterRoles(Roles):
    """``Roles`` whose members are proxies, plus the groups and placement to release."""

    groups: list[WorkerGroup] = field(default_factory=list)
    placement_groups: list[Any] = field(default_factory=list)

    def shutdown(self) -> None:
        from temper.cluster.ray import require_ray

        for g in self.groups:
            g.shutdown()
        ray = require_ray()
        for pg in self.placement_groups:
            ray.util.remove_placement_group(pg)
        self.groups, self.placement_groups = [], []


def build_cluster_roles(cfg: TemperConfig) -> Roles:
    """``Roles`` for ``cfg.resources.backend``: in process (local) or on Ray workers."""
    if cfg.resources.backend == "local":
        return build_roles(cfg)
    return build_ray_roles(cfg)


def build_ray_roles(cfg: TemperConfig) -> ClusterRoles:
    """Placement groups per device set, one worker group per role (see cluster.ray)."""
    from temper.cluster.ray import RayWorkerGroup, init_ray, require_ray

    if cfg.model.lora.rank > 0 and uses_reference(cfg):
        raise ConfigError(
            "model.lora.rank",
            "on the ray backend a LoRA reference (the actor's weights with adapters off) "
            "would live in another worker group; this build does not share it across groups",
            "use resources.backend=local, full fine-tuning (lora.rank=0), or drop the KL terms",
        )
    init_ray(cfg)
    ray = require_ray()
    wanted = ["actor"]
    if uses_reference(cfg):
        wanted.append("reference")
    if uses_critic(cfg):
        wanted.append("critic")
    place = placement(cfg)
    ids = {role: tuple(place[_PLACEMENT_KEY[role]]) for role in wanted}
    sharing = {s: sum(1 for r in wanted if ids[r] == s) for s in set(ids.values())}
    device = worker_device(cfg)
    gpu = device == "cuda"
    bundle = {"GPU": 1, "CPU": 1} if gpu else {"CPU": 1}
    pgs: dict[tuple[int, ...], Any] = {}
    out = ClusterRoles(actor=None, reference=None, critic=None)  # type: ignore[arg-type]
    try:
        for s in sharing:
            pg = ray.util.placement_group([dict(bundle) for _ in s], strategy="PACK")
            ray.get(pg.ready(), timeout=cfg.resources.ray.rpc_timeout)
            pgs[s] = pg
            out.placement_groups.append(pg)
        groups: dict[str, RayWorkerGroup] = {}
        for role in wanted:
            groups[role] = RayWorkerGroup(
                role,
                cfg,
                placement_group=pgs[ids[role]],
                world_size=len(ids[role]),
                share=1.0 / sharing[ids[role]],
                device=device,
            )
            out.groups.append(groups[role])
    except BaseException:
        out.shutdown()
        raise
    balance = cfg.experiment.balance_batch
    out.actor = RemoteActor(groups["actor"], cfg.actor, balance)  # type: ignore[assignment]
    if "reference" in groups:
        out.reference = RemoteReference(groups["reference"])  # type: ignore[assignment]
    if "critic" in groups:
        out.critic = RemoteCritic(groups["critic"], cfg.critic, balance)  # type: ignore[assignment]
    return out
