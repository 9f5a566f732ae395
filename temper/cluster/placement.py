"""Where each role's ranks run, as a table for ``temper check`` (no Ray needed).

It shows what :func:`temper.cluster.roles.build_ray_roles` will ask Ray for: per role its
device ids, the nodes they are on (``id // devices_per_node``), the number of ranks and
data-parallel size, the engine, the Ray bundle of each rank, and which roles share
devices (colocated roles split each bundle).
"""

from __future__ import annotations

from temper.config.derive import Derived
from temper.config.plan import REWARD_MODEL
from temper.config.schema import TemperConfig
from temper.roles.builder import local_engine
from temper.roles.reward_model import scores_on_workers
from temper.rollout.registry import resolve_engine_name

#: The ``resources`` key (and ``Derived.placement`` entry) of each role's device ids.
TEACHER = "teacher:"  # a teacher's worker group: teacher:<name> of distill.teachers
PLACEMENT_KEYS = {
    "actor": "actor_train",
    "rollout": "actor_infer",
    "reference": "reference",
    "critic": "critic",
    "prm": "actor_train",  # PRIME's implicit PRM: colocated with the actor, as in verl
    "judge": "reward",
    "reward": "reward",  # the reward model's group (verl: on the actor's pool by default)
}


def worker_device(cfg: TemperConfig) -> str:
    """``cuda`` or ``cpu`` for the workers: ``experiment.device``, ``auto`` resolved on
    this machine (the driver's; a cluster's workers are assumed alike)."""
    import torch

    device = cfg.experiment.device
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def placed_roles(cfg: TemperConfig, d: Derived) -> dict[str, list[int]]:
    """The device ids of every role that gets Ray workers, in start order: the actor, the
    rollout engines where the step generates (an SFT run has none), the run's other
    roles (not a LoRA run's reference: the actor's ranks serve their base), the reward
    model's group where it scores on workers (an RL run's producer scores with it), and
    the LLM judge when a sample goes to it."""
    from temper.cluster.judge import judge_used

    roles = ["actor", *(["rollout"] if d.use_rollout else []), *d.roles[1:]]
    if cfg.model.lora.rank > 0:  # the reference is the actor's base: the actor's ranks
        roles = [role for role in roles if role != "reference"]
    if scores_on_workers(cfg) and REWARD_MODEL in d.uses:
        roles.append("reward")
    if judge_used(cfg):
        roles.append("judge")
    placed = {role: list(d.placement[PLACEMENT_KEYS[role]]) for role in roles}
    for name in cfg.distill.teachers:  # each teacher its group, on the reference's devices
        placed[teacher_role(name)] = list(d.placement["reference"])
    return placed


def placement_key(role: str) -> str:
    """The ``resources`` key that places ``role``'s devices (a teacher: the reference's)."""
    return PLACEMENT_KEYS["reference" if role.startswith(TEACHER) else role]


def teacher_role(name: str) -> str:
    """The worker-group role of teacher ``name``."""
    return f"{TEACHER}{name}"


def device_pools(ids_by_role: dict[str, list[int]]) -> list[tuple[int, ...]]:
    """Device sets that become one Ray placement group each: the connected components of
    the roles' (possibly overlapping) device lists, each sorted, in order of first use.

    ROLL colocates by overlap: ``actor_train`` on 0..15 with ``actor_infer`` on 0..11
    share devices 0..11, so all 16 are one pool whose bundles both roles use.
    """
    pools: list[set[int]] = []
    for ids in ids_by_role.values():
        merged = set(ids)
        rest = []
        for pool in pools:
            if pool & merged:
                merged |= pool
            else:
                rest.append(pool)
        pools = [*rest, merged]
    order = [i for ids in ids_by_role.values() for i in ids]
    pools.sort(key=lambda p: order.index(min(p, key=order.index)))
    return [tuple(sorted(p)) for p in pools]


def rank_slots(ids_by_role: dict[str, list[int]]) -> dict[str, list[tuple[int, int, float]]]:
    """Per role, per rank: (pool index, bundle index in that pool, share of the bundle).

    Rank ``r`` of a role runs on device ``ids[r]``; a device used by k roles gives each
    1/k of its bundle (colocated roles time-share it, as verl's hybrid engine does).
    """
    pools = device_pools(ids_by_role)
    where = {d: (p, pool.index(d)) for p, pool in enumerate(pools) for d in pool}
    users = {d: sum(d in ids for ids in ids_by_role.values()) for d in where}
    return {role: [(*where[d], 1.0 / users[d]) for d in ids] for role, ids in ids_by_role.items()}


def format_ids(ids: list[int]) -> str:
    """``0..7`` for a run of ids, else ``0,2,5``."""
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}..{ids[-1]}"
    return ",".join(map(str, ids))


def placement_rows(cfg: TemperConfig, d: Derived) -> list[tuple[str, ...]]:
    """Header + one row per role (the rollout engines of ``actor_infer`` where the step
    generates, and the LLM judge): role, devices, nodes, ranks, dp, engine, bundle,
    colocated with, from the run's plan ``d``. On the local backend everything is one
    process."""
    place = placed_roles(cfg, d)
    slots = rank_slots(place)
    per_node = cfg.resources.devices_per_node
    gpu = worker_device(cfg) == "cuda"
    rows: list[tuple[str, ...]] = [
        ("role", "devices", "nodes", "ranks", "dp", "engine", "bundle/rank", "colocated with")
    ]
    for role, ids in place.items():
        engine_of = "reference" if role.startswith(TEACHER) else role  # built as it is
        if role == "rollout":  # one engine per rank, or per tensor_parallel_size ranks
            strategy = resolve_engine_name(cfg.rollout.engine, cfg.model)
        elif role == "judge":  # one whole engine per rank too
            strategy = cfg.reward.judge.engine
        elif role == "prm":
            strategy = cfg.prime.prm.strategy
        elif role == "reward":
            strategy = cfg.reward.model.strategy
        else:
            strategy = getattr(cfg, engine_of).strategy
        dp = {"actor": d.actor.dp, "critic": d.critic.dp if d.critic else len(ids)}.get(
            role, len(ids)
        )
        if engine_of in ("reference", "reward") and strategy == "megatron":
            megatron = (cfg.reference if engine_of == "reference" else cfg.reward.model).megatron
            dp = len(ids) // max(1, megatron.model_parallel_size)  # TP ranks share samples
        tp = cfg.rollout.tensor_parallel_size if role == "rollout" else 1
        if tp > 1:  # an engine's tensor-parallel ranks share their prompts
            dp, strategy = len(ids) // tp, f"{strategy} TP={tp}"
        shared = [r for r in place if r != role and set(place[r]) & set(ids)]
        share = min(s for _, _, s in slots[role])
        if cfg.resources.backend == "local":
            in_process = role in ("rollout", "judge")
            engine = strategy if in_process else local_engine(cfg, strategy)
            ranks, engine, bundle = "1", f"{engine} (in process)", "-"
        else:
            ranks, engine = str(len(ids)), strategy
            bundle = f"GPU {share:g}, CPU {share:g}" if gpu else f"CPU {share:g} (process slot)"
        nodes = sorted({i // per_node for i in ids})
        rows.append(
            (
                role,
                format_ids(ids),
                format_ids(nodes),
                ranks,
                str(dp),
                engine,
                bundle,
                ",".join(shared) or "-",
            )
        )
    return rows


def format_table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return ["  " + "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
