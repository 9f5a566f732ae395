"""Roles as the driver sees them on the Ray backend: proxies over worker groups.

The pipeline calls ``roles.actor.compute_log_probs(batch)``, ``roles.actor.update(batch)``
and ``roles.actor.engine.named_weights()`` whatever the backend; here each call becomes a
dispatch to the role's ranks. The proxies implement the role Protocols of
:mod:`temper.roles.base` (``ActorRole``, ``CriticRole``, ``ReferenceRole``), which is all
the driver uses. :func:`build_cluster_roles` is the one entry point: ``backend: local``
returns the in-process roles unchanged, ``backend: ray`` starts (or joins) Ray, creates
the placement groups and the worker groups.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from temper.cluster.base import WorkerGroup
from temper.cluster.judge import RemoteJudge
from temper.cluster.placement import (
    PLACEMENT_KEYS,
    device_pools,
    format_ids,
    placed_roles,
    rank_slots,
    teacher_role,
    worker_device,
)
from temper.cluster.reward import RemoteRewardModel, check_reward_group
from temper.cluster.rollout import RemoteRollout, StoredWeights
from temper.config.derive import Derived
from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.data.batch import Batch
from temper.rewards.judge import JudgeEngine
from temper.roles.base import ReferenceRole, Roles
from temper.roles.builder import build_roles, teachers_of
from temper.roles.teacher import Teachers
from temper.rollout import RolloutEngine, build_rollout_engine
from temper.rollout.vllm_kv import EngineDemand

if TYPE_CHECKING:
    from temper.cluster.ray import RayWorkerGroup

log = logging.getLogger(__name__)


def _mean_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Engine metrics are already global (equal on all ranks); rank-local extras average."""
    keys = per_rank[0].keys()
    return {k: sum(float(m[k]) for m in per_rank) / len(per_rank) for k in keys}


class RemoteEngine:
    """The driver's handle on a sharded engine (a ``RoleEngine``): weight export, HF
    save and checkpoints, each a collective call on the role's ranks."""

    shareable_module = None  # no local module: the rollout engine owns its copy
    device = torch.device("cpu")

    def __init__(self, group: RayWorkerGroup) -> None:
        self.group = group

    def named_weights(self) -> StoredWeights:
        """The gathered weights as a handle on the object store (iterable by name)."""
        group = self.group
        return StoredWeights(group.full_weights(), group.role, group.timeout)

    def save_hf(self, path: str) -> None:
        self.group.call_all("engine.save_hf", path)

    def save_checkpoint(self, path: str) -> None:
        self.group.call_all("engine.save_checkpoint", path)

    def load_checkpoint(self, path: str) -> None:
        self.group.call_all("engine.load_checkpoint", path)

    def set_total_steps(self, total_steps: int) -> None:
        self.group.call_all("engine.set_total_steps", total_steps)


class _RemoteTrained:
    def __init__(self, group: RayWorkerGroup, cfg: Any, balance: bool) -> None:
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

    def set_total_steps(self, total_steps: int) -> None:
        self.group.call_all("set_total_steps", total_steps)

    def update(self, batch: Batch) -> dict[str, float]:
        """Each rank updates on its equal share; the ranks' (global) metrics."""
        metrics = _mean_metrics(self.group.scatter("update", batch, balance=self.balance))
        self._updates += 1
        return metrics


class RemoteActor(_RemoteTrained):
    def compute_log_probs(
        self, batch: Batch, *, with_entropy: bool = False, with_sum_pi_squared: bool = False
    ) -> Batch:
        return self.group.dispatch(
            "compute_log_probs",
            batch,
            with_entropy=with_entropy,
            with_sum_pi_squared=with_sum_pi_squared,
        )

    def sft_update(self, batch: Batch) -> dict[str, float]:
        """Each rank a supervised update on its equal share; the ranks' (global) metrics."""
        metrics = _mean_metrics(self.group.scatter("sft_update", batch, balance=self.balance))
        self._updates += 1
        return metrics

    def distill_update(
        self, batch: Batch, objective: str, params: Any, weight: float
    ) -> dict[str, float]:
        """Each rank an offline-distillation update on its equal share (the teacher's
        top-k logits travel with the rows); the ranks' (global) metrics."""
        shares = self.group.scatter(
            "distill_update",
            batch,
            balance=self.balance,
            objective=objective,
            params=params,
            weight=weight,
        )
        self._updates += 1
        return _mean_metrics(shares)

    def dpo_update(self, batch: Batch, loss_type: str, params: Any) -> dict[str, float]:
        """Each rank a preference update on its share of whole pairs (:meth:`_pairs`)."""
        return self._pairs("dpo_update", batch, loss_type, params)

    def reward_update(self, batch: Batch, loss_type: str, params: Any) -> dict[str, float]:
        """Each rank a reward-model update on its share of whole pairs (:meth:`_pairs`)."""
        return self._pairs("reward_update", batch, loss_type, params)

    def compute_scores(self, batch: Batch) -> Batch:
        return self.group.dispatch("compute_scores", batch)

    def _pairs(self, method: str, batch: Batch, loss_type: str, params: Any) -> dict[str, float]:
        """Pair update ``method`` on every rank, each on its share of whole pairs:
        contiguous equal shares (no length balancing, which would part a pair's rows) of
        an even number of rows each; the ranks' (global) metrics."""
        ranks = self.group.data_size
        if len(batch) % (2 * ranks):
            raise ValueError(
                f"{len(batch) // 2} pairs cannot be shared evenly over {ranks} data-parallel "
                f"ranks: use a data.train_batch_size that is a multiple of {ranks}"
            )
        shares = self.group.scatter(
            method, batch, balance=False, allow_pad=False, loss_type=loss_type, params=params
        )
        self._updates += 1
        return _mean_metrics(shares)


class RemoteCritic(_RemoteTrained):
    def compute_values(self, batch: Batch) -> Batch:
        return self.group.dispatch("compute_values", batch)


class RemotePRM(_RemoteTrained):
    """PRIME's implicit PRM on its worker group (the driver composes its phase:
    :func:`temper.roles.prm.score_and_update`)."""

    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        return self.group.dispatch("compute_ref_log_probs", batch)

    def compute_log_probs(self, batch: Batch) -> Batch:
        return self.group.dispatch("compute_log_probs", batch)


class RemoteReference:
    """A reference (or teacher) worker group; or (``method`` prefix ``base_reference.``)
    the actor's group serving its LoRA base as the reference."""

    def __init__(self, group: RayWorkerGroup, prefix: str = "") -> None:
        self.group, self.prefix = group, prefix
        self.engine = RemoteEngine(group)

    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        return self.group.dispatch(f"{self.prefix}compute_ref_log_probs", batch)

    def reload(self, model_path: str) -> None:
        """Every rank rebuilds its shard from ``model_path`` (a directory all ranks read:
        the run's output directory, as for checkpoints)."""
        self.group.call_all(f"{self.prefix}reload", model_path)

    def compute_top_logits(
        self, batch: Batch, k: int, scale: float, vocab: int | None = None, log_probs: bool = False
    ) -> Batch:
        return self.group.dispatch(
            "compute_top_logits", batch, k=k, scale=scale, vocab=vocab, log_probs=log_probs
        )


@dataclass
class ClusterRoles(Roles):
    """``Roles`` whose members are proxies, plus the rollout worker group and what to
    release: worker groups, placement groups, and (``resources.ray.timeline_json_file``)
    Ray's timeline of the run, written before the workers go."""

    rollout: RolloutEngine | None = None  # the actor_infer worker group
    judge: JudgeEngine | None = None  # the LLM judge's worker group (reward.judge)
    reward_model: RemoteRewardModel | None = None  # the reward model's group (reward.model)
    groups: list[WorkerGroup] = field(default_factory=list)
    placement_groups: list[Any] = field(default_factory=list)
    timeline_json_file: str | None = None

    def shutdown(self) -> None:
        release(self.groups, self.placement_groups, self.timeline_json_file)
        self.groups, self.placement_groups, self.timeline_json_file = [], [], None


def release(groups: list[WorkerGroup], pgs: list[Any], timeline: str | None) -> None:
    from temper.cluster.ray import require_ray

    ray = require_ray()
    if timeline:
        try:  # a profile of every Ray task of the run, for chrome://tracing / Perfetto
            ray.timeline(filename=timeline)
            print(f"ray: timeline written to {timeline}", flush=True)
        except Exception as err:  # the run's results matter more than its profile
            log.warning("ray.timeline(%s) failed: %s", timeline, err)
    for g in groups:
        g.shutdown()
    for pg in pgs:
        ray.util.remove_placement_group(pg)


def build_cluster_roles(
    cfg: TemperConfig, plan: Derived, demand: EngineDemand | None = None
) -> Roles:
    """``Roles`` for ``cfg.resources.backend``: in process (local) or on Ray workers
    (``demand``: the run's generation, which sizes the rollout ranks' engines)."""
    if cfg.resources.backend == "local":
        return build_roles(cfg, plan)
    return build_ray_roles(cfg, plan, demand)


def ray_node_ids(ray: Any, nnodes: int, timeout_s: float, *, wait: bool) -> list[str]:
    """Ray node ids for temper's node indices ``0..nnodes-1``: the driver's node first
    (device ids ``0..devices_per_node-1`` are where ``temper train`` runs), then the
    other alive nodes by id. With ``wait`` (a cluster at ``resources.ray.address``, which
    nodes may still be joining) it waits up to ``timeout_s`` for late ones; a Ray that
    temper started here is one node and no other will join it."""
    here = ray.get_runtime_context().get_node_id()

    def alive() -> list[str]:
        return sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))

    nodes = alive()
    if len(nodes) < nnodes and wait:
        # printed: without it a run waiting for nodes looks like a hang
        print(
            f"ray: waiting up to {timeout_s:g}s for {nnodes} nodes ({len(nodes)} joined)",
            flush=True,
        )
        deadline = time.monotonic() + timeout_s
        while len(nodes) < nnodes and time.monotonic() < deadline:
            time.sleep(1.0)
            nodes = alive()
    if len(nodes) < nnodes:
        where = (
            f"after waiting {timeout_s:g}s"
            if wait
            else "(with no cluster address, Ray runs on this machine alone)"
        )
        raise ConfigError(
            "resources.nnodes",
            f"{nnodes} nodes are configured but the Ray cluster has {len(nodes)} {where}",
            "start Ray on every node (ray start --address=HEAD:6379) and set "
            "resources.ray.address, raise resources.ray.rpc_timeout to wait longer for them, "
            "or lower resources.nnodes",
        )
    return [here, *[n for n in nodes if n != here]][:nnodes]


def _roles_on(place: dict[str, list[int]], ids: Collection[int]) -> list[str]:
    return [role for role, own in place.items() if set(own) & set(ids)]


def check_capacity(ray: Any, place: dict[str, list[int]], unit: str) -> None:
    """Fail at once, not after rpc_timeout, when the cluster cannot hold the bundles."""
    devices = sorted({i for ids in place.values() for i in ids})
    have = ray.cluster_resources().get(unit, 0.0)
    if len(devices) > have:
        roles = "; ".join(f"{role} {format_ids(ids)}" for role, ids in place.items())
        raise ConfigError(
            "resources",
            f"the roles are placed on {len(devices)} devices ({roles}), one Ray bundle of 1 "
            f"{unit} each, but the Ray cluster has {have:g} {unit}",
            "place fewer devices, or give Ray more (resources.ray.num_cpus, more nodes/GPUs)",
        )


def placement_group(
    ray: Any,
    cfg: TemperConfig,
    ids: tuple[int, ...],
    nodes: list[str] | None,
    gpu: bool,
    roles: list[str],
) -> Any:
    """One bundle per device id; with several nodes each bundle is pinned (by Ray's
    ``ray.io/node-id`` label) to the node of its id, ``id // devices_per_node``. Waits
    ``resources.ray.rpc_timeout`` for Ray to reserve them (``roles`` use them)."""
    bundle = {"GPU": 1, "CPU": 1} if gpu else {"CPU": 1}
    kwargs: dict[str, Any] = {"strategy": "PACK"}
    if nodes is not None:
        per = cfg.resources.devices_per_node
        kwargs["bundle_label_selector"] = [{"ray.io/node-id": nodes[i // per]} for i in ids]
    pg = ray.util.placement_group([dict(bundle) for _ in ids], **kwargs)
    timeout = cfg.resources.ray.rpc_timeout
    try:
        ray.get(pg.ready(), timeout=timeout)
    except ray.exceptions.GetTimeoutError as err:
        ray.util.remove_placement_group(pg)
        free, total = ray.available_resources(), ray.cluster_resources()
        have = ", ".join(
            f"{free.get(unit, 0.0):g} of {total.get(unit, 0.0):g} {unit}" for unit in bundle
        )
        raise ConfigError(
            f"resources.{PLACEMENT_KEYS[roles[0]]}",
            f"{', '.join(roles)}: Ray could not reserve devices {format_ids(list(ids))} "
            f"({len(ids)} bundles of {bundle}) within {timeout:g}s; the cluster has {have} "
            "free",
            "free the cluster's devices (`ray status` shows what holds them), place the roles "
            "on fewer devices, or raise resources.ray.rpc_timeout to wait longer",
        ) from err
    return pg


def build_ray_roles(
    cfg: TemperConfig, plan: Derived, demand: EngineDemand | None = None
) -> ClusterRoles:
    """One placement group per device pool (:func:`device_pools`), one worker group per
    role (see cluster.ray), the rollout engines (``actor_infer``) included; each rank in
    its device's bundle (:func:`rank_slots`) — a LoRA run's reference is the actor's base,
    served by the actor's ranks. Validation has refused what the ray backend cannot place
    (a rollout engine that does not shard over ``rollout.tensor_parallel_size`` ranks)."""
    from temper.cluster.ray import RayWorkerGroup, init_ray, require_ray

    init_ray(cfg)
    ray = require_ray()
    place = placed_roles(cfg, plan)
    # LoRA: the reference is the base under the actor's adapters, served by its ranks
    lora_reference = cfg.model.lora.rank > 0 and plan.use_reference
    wanted = list(place)
    slots = rank_slots(place)
    pools = device_pools(place)
    device = worker_device(cfg)
    nnodes, rc = cfg.resources.nnodes, cfg.resources.ray
    nodes = ray_node_ids(ray, nnodes, rc.rpc_timeout, wait=bool(rc.address)) if nnodes > 1 else None
    check_capacity(ray, place, "GPU" if device == "cuda" else "CPU")
    if "reward" in place:  # what the driver can see before any worker loads a model
        check_reward_group(cfg)
    pgs: list[Any] = []
    groups: dict[str, RayWorkerGroup] = {}
    try:
        for pool in pools:
            roles = _roles_on(place, pool)
            pgs.append(placement_group(ray, cfg, pool, nodes, device == "cuda", roles))
        for role in wanted:
            groups[role] = RayWorkerGroup(
                role,
                cfg,
                slots=[(pgs[p], b, share) for p, b, share in slots[role]],
                device=device,
                demand=demand if role == "rollout" else None,
            )
    except BaseException:
        release(list(groups.values()), pgs, None)
        raise
    balance = cfg.experiment.balance_batch
    return ClusterRoles(
        actor=RemoteActor(groups["actor"], cfg.actor, balance),
        reference=(
            RemoteReference(groups["actor"], "base_reference.")
            if lora_reference
            else RemoteReference(groups["reference"])
            if "reference" in groups
            else None
        ),
        critic=RemoteCritic(groups["critic"], cfg.critic, balance) if "critic" in groups else None,
        prm=RemotePRM(groups["prm"], cfg.prime.prm, balance) if "prm" in groups else None,
        rollout=RemoteRollout(groups["rollout"]) if "rollout" in groups else None,
        judge=RemoteJudge(groups["judge"]) if "judge" in groups else None,
        reward_model=(
            RemoteRewardModel.over(groups["reward"], cfg.reward.model)
            if "reward" in groups
            else None
        ),
        teachers=_remote_teachers(cfg, groups),
        groups=list(groups.values()),
        placement_groups=pgs,
        timeline_json_file=cfg.resources.ray.timeline_json_file,
    )


def _remote_teachers(cfg: TemperConfig, groups: dict[str, Any]) -> Teachers | None:
    """The teachers' router over their worker groups (``teacher:<name>``), or None."""
    if not cfg.distill.teachers:
        return None
    proxies: dict[str, ReferenceRole] = {
        name: RemoteReference(groups[teacher_role(name)]) for name in cfg.distill.teachers
    }
    return teachers_of(cfg, proxies)


def build_cluster_rollout(
    cfg: TemperConfig, roles: Roles, tokenizer: Any, demand: EngineDemand | None = None
) -> RolloutEngine:
    """The run's rollout engine, holding the actor's current weights: the ``actor_infer``
    worker group on Ray, else an engine in this process (``hf`` shares the actor's module,
    or holds a copy when the rollout runs ahead; ``vllm`` holds its own copy, its CPU KV
    cache sized by ``demand``)."""
    rollout = roles.rollout if isinstance(roles, ClusterRoles) else None
    if rollout is None:
        # a rollout that runs ahead of training (async_training) generates while the
        # trainer updates: it needs weights of its own, never the trainer's module
        ahead = cfg.async_training.staleness > 0
        module = None if ahead else roles.actor.engine.shareable_module
        rollout = build_rollout_engine(
            cfg.rollout, cfg.model, module=module, tokenizer=tokenizer, demand=demand
        )
    if not rollout.shared:
        # An engine with its own copy (vLLM, remote ranks) rolls out with the actor's
        # weights from the first step (LoRA merged); with rollout.load_format=dummy they
        # are random until here.
        rollout.load_weights(roles.actor.engine.named_weights())
    return rollout
