"""Ray worker groups: one Ray actor process per rank of a role (``resources.backend: ray``).

Placement follows ``resources``: the roles' device ids (``resources.actor_train``, …,
see ``config.derive.placement``) form pools of devices (overlapping lists join one pool),
each one Ray placement group with one bundle per device — on GPU ``{"GPU": 1, "CPU":
1}``, on CPU a process slot ``{"CPU": 1}`` — and rank ``r`` of a role runs in the bundle
of its ``r``-th device, taking 1/k of it when k roles use that device (colocated roles
time-share it; see ``cluster.placement.rank_slots``). Each rank of a trained or frozen
role then joins a torch.distributed group of its role's ranks (gloo on CPU, nccl on
GPU; rendezvous at rank 0's node) and builds its role there, so an ``fsdp2`` engine
shards over exactly the ranks of that role; rollout ranks are independent engines.

Failure handling: every remote call is awaited with ``resources.ray.rpc_timeout``; a
rank that raises, dies or exceeds the timeout stops the run with a
:class:`WorkerGroupError` that names the role, the rank and the cause (the other ranks
of a collective would otherwise hang until their own timeout).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from temper.cluster.base import WorkerGroup, WorkerGroupError
from temper.cluster.placement import worker_device
from temper.config.derive import total_devices
from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.rollout.vllm_kv import EngineDemand
from temper.utils.determinism import use_deterministic_kernels

log = logging.getLogger(__name__)


def require_ray() -> Any:
    try:
        import ray
    except ImportError as err:
        raise RuntimeError(
            "resources.backend: ray needs the ray package: pip install 'ray[default]'"
        ) from err
    return ray


#: Seconds to wait for a TCP answer at ``resources.ray.address``: Ray's own connect
#: retries for minutes, silently, when nothing listens there.
CONNECT_TIMEOUT_S = 10.0


def ray_address_problem(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why nothing answers at Ray cluster ``address`` (``host:port`` or
    ``ray://host:port``), or None when a TCP connection opens within ``timeout_s``;
    ``auto`` and ``local`` are Ray's own lookups, left to it (they fail at once)."""
    text = address.strip()
    if text in ("auto", "local"):
        return None
    host, _, port = text.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return f"'{address}' is not host:port (or ray://host:port, auto)"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return None
    except OSError as err:
        why = "no answer" if isinstance(err, TimeoutError) else (err.strerror or str(err))
        return f"no Ray cluster answers at {text} within {timeout_s:g}s ({why})"


def address_error(reason: str) -> ConfigError:
    """The refusal of a ``resources.ray.address`` where no Ray cluster answers."""
    return ConfigError(
        "resources.ray.address",
        reason,
        "start Ray there (ray start --head --port=PORT), correct resources.ray.address, or "
        "remove it to start Ray on this machine",
    )


def check_ray_address(address: str) -> None:
    """Raise :func:`address_error` unless a Ray cluster answers at ``address``."""
    problem = ray_address_problem(address)
    if problem is not None:
        raise address_error(problem)


def init_ray(cfg: TemperConfig) -> None:
    """Connect to ``resources.ray.address`` or start a local Ray (``num_cpus``; on CPU at
    least one per device slot), once. An address where no Ray answers is refused within
    :data:`CONNECT_TIMEOUT_S`, not after Ray's minutes of retries.

    ``system_envs`` become environment variables of every worker (runtime_env).
    """
    ray = require_ray()
    if ray.is_initialized():
        return
    rc = cfg.resources.ray
    # a launcher's cluster (`ray job submit` sets RAY_ADDRESS for the driver) is asked for
    address = rc.address or os.environ.get("RAY_ADDRESS") or None
    if address:
        problem = ray_address_problem(address)
        if problem is not None:
            where = (
                "" if rc.address else " (the address is RAY_ADDRESS's; unset it to start Ray here)"
            )
            raise address_error(problem + where)
    env = {"OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false", **rc.system_envs}
    kwargs: dict[str, Any] = {
        "runtime_env": {"env_vars": env},
        "include_dashboard": False,
        "log_to_driver": True,
    }
    if address:
        kwargs["address"] = address
    else:
        # a Ray of the run's own: without "local", ray.init joins the cluster a `ray start`
        # on this machine left (someone else's, another run's) and then refuses num_cpus
        kwargs["address"] = "local"
        if rc.num_cpus is not None:
            kwargs["num_cpus"] = rc.num_cpus
        elif worker_device(cfg) == "cpu":
            # On CPU a device is a process slot (one bundle {"CPU": 1} each): a local Ray
            # must offer as many slots as resources names, even on a machine with fewer
            # cores.
            kwargs["num_cpus"] = max(os.cpu_count() or 1, total_devices(cfg))
    try:
        ray.init(**kwargs)
    except ConnectionError as err:  # address=auto with no cluster running here
        raise address_error(f"Ray found no cluster at '{address}' ({_first_line(err)})") from err


class RankWorker:
    """One rank of one role, living in its own Ray actor process.

    Made a Ray actor class by :func:`remote_worker_class` (so importing this module does
    not need Ray). The driver calls role methods through :meth:`call`.
    """

    def __init__(self, role: str, rank: int, world: int, cfg: TemperConfig) -> None:
        self.role_name, self.rank, self.world, self.cfg = role, rank, world, cfg
        self.role: Any = None
        self.store: Any = None  # rank 0's rendezvous store (see rendezvous)
        torch.set_num_threads(max(1, int(os.environ.get("TEMPER_WORKER_THREADS", "1"))))
        # before the role's model: cuBLAS reads its workspace setting at its first call
        use_deterministic_kernels(cfg.experiment.deterministic)

    def rendezvous(self) -> tuple[str, int]:
        """This node's address and a port on it where the group meets (asked of each
        group's first rank). A role's rank 0 serves its group's store from here on, so the
        port stays its own while the other groups on the host set up; a rollout engine's
        first rank hands the port to the engine, which binds it itself."""
        import ray

        from temper.cluster.process_group import free_port, group_store

        host = ray.util.get_node_ip_address()
        if self.role_name in ("rollout", "judge"):
            return host, free_port(host)
        timeout = float(self.cfg.resources.ray.rpc_timeout)
        self.store = group_store(host, self.world, timeout)
        return host, int(self.store.port)

    def setup(
        self, addr: str, port: int, device: str, timeout_s: float, demand: Any = None
    ) -> tuple[int, str, int]:
        """Join the role's process group and build the role (loads the model shard);
        returns this process's pid, Ray node id and data-parallel index. ``demand``: what
        the run's generation asks of a rollout rank's engine
        (:class:`~temper.rollout.vllm_kv.EngineDemand`, its engine's share)."""
        import ray

        from temper.cluster.placement import TEACHER
        from temper.cluster.process_group import default_backend, init_process_group
        from temper.roles.builder import (
            build_actor,
            build_critic,
            build_prm,
            build_reference,
            build_teacher,
        )
        from temper.roles.reward_model import build_reward_scorer
        from temper.training.models import resolve_device

        dev = resolve_device(device)
        if self.role_name == "rollout":  # engines: a tensor-parallel one meets at addr:port
            from temper.cluster.rollout import RolloutRank

            self.role = RolloutRank(self.cfg, dev, self.rank, meet=(addr, port), demand=demand)
            return os.getpid(), ray.get_runtime_context().get_node_id(), self.role.engine_index
        if self.role_name == "judge":  # the LLM judge: independent engines too
            from temper.cluster.judge import JudgeRank

            self.role = JudgeRank(self.cfg, dev, self.rank)
            return os.getpid(), ray.get_runtime_context().get_node_id(), self.rank
        init_process_group(
            self.rank,
            self.world,
            addr=addr,
            port=port,
            backend=default_backend(dev.type),
            timeout_s=timeout_s,
            local_rank=0 if dev.type == "cuda" else self.rank,  # Ray sets CUDA_VISIBLE_DEVICES
            store=self.store,
        )
        build: dict[str, Callable[[TemperConfig, torch.device], Any]] = {
            "actor": build_actor,
            "reference": build_reference,
            "critic": build_critic,
            "prm": build_prm,
            "reward": build_reward_scorer,  # the reward model (cluster.reward)
        }
        if self.role_name.startswith(TEACHER):
            self.role = build_teacher(self.cfg, dev, self.role_name.removeprefix(TEACHER))
        else:
            self.role = build[self.role_name](self.cfg, dev)
        if self.role_name == "actor" and self.cfg.model.lora.rank > 0:
            # the reference is the base under the adapters: no second copy, no group
            self.role.base_reference = build_reference(self.cfg, dev, actor=self.role)
        node = ray.get_runtime_context().get_node_id()
        return os.getpid(), node, self.role.engine.dp_rank

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``role.<method>(*args, **kwargs)``; a dotted name reaches inside (``engine.x``)."""
        target: Any = self.role
        for part in method.split("."):
            target = getattr(target, part)
        return target(*args, **kwargs)

    def full_weights(self) -> list[Any] | None:
        """The role's gathered HF weights, put into Ray's object store by rank 0 (a
        collective; other ranks return None). Rank 0 returns ``[ObjectRef]``: a ref nested
        in a list is not resolved on the way back, so the driver never holds the weights
        and the rollout ranks read them straight from the store."""
        import ray

        from temper.cluster.rollout import to_store

        named = self.role.engine.named_weights()
        if self.rank != 0:
            for _ in named:  # join the gather of every tensor
                pass
            return None
        return [ray.put(to_store(named))]


def group_span(role: str, cfg: TemperConfig, world_size: int) -> int:
    """Ranks per process group: a role's ranks form one (rank 0 gives the address), the
    rollout's ranks one per tensor-parallel engine (each engine's first rank gives its
    own)."""
    return cfg.rollout.tensor_parallel_size if role == "rollout" else world_size


def remote_worker_class() -> Any:
    ray = require_ray()
    return ray.remote(RankWorker)


class RayWorkerGroup(WorkerGroup):
    """The ranks of ``role`` as Ray actors in the bundles of ``placement_group``."""

    def __init__(
        self,
        role: str,
        cfg: TemperConfig,
        *,
        slots: Sequence[tuple[Any, int, float]],
        device: str = "cpu",
        demand: EngineDemand | None = None,
    ) -> None:
        """``slots[r]``: rank r's (placement group, bundle index, share of the bundle);
        ``demand``: the run's generation, for a ``rollout`` group (each engine gets its
        share)."""
        ray = require_ray()
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        world_size = len(slots)
        self.role, self.world_size, self.cfg = role, world_size, cfg
        self.timeout = float(cfg.resources.ray.rpc_timeout)
        gpu = device != "cpu"
        cls = remote_worker_class()
        self.workers = [
            cls.options(
                num_cpus=share,
                num_gpus=share if gpu else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=bundle
                ),
                name=None,
                max_restarts=0,
            ).remote(role, rank, world_size, cfg)
            for rank, (pg, bundle, share) in enumerate(slots)
        ]
        start = "start (a Ray worker process in its bundle)"
        span = group_span(role, cfg, world_size)
        firsts = list(range(0, world_size, span))  # the first rank of each process group
        meet = self._wait([self.workers[r].rendezvous.remote() for r in firsts], start, firsts)
        share = demand.per_engine(world_size // span) if demand is not None else None
        up = self._wait(
            [
                w.setup.remote(*meet[rank // span], device, self.timeout, share)
                for rank, w in enumerate(self.workers)
            ],
            "start (join the role's process group, build the role and load its model)",
        )
        self.pids = [pid for pid, _, _ in up]
        self.nodes = [node for _, node, _ in up]
        data_ranks = [d for _, _, d in up]
        if data_ranks != list(range(world_size)):  # model-parallel ranks share samples
            self.data_ranks = data_ranks
        # printed: the pid of each rank is what an operator needs to inspect or kill it
        print(f"ray: {role} ranks 0..{world_size - 1} up (pids {self.pids})", flush=True)
        self._ray = ray

    # ------------------------------------------------------------------ calls

    def _wait(self, refs: list[Any], what: str, ranks: Sequence[int] | None = None) -> list[Any]:
        """Results of ``refs`` (rank order); the first failure or the deadline
        (``resources.ray.rpc_timeout``) raises, naming the role, the ranks and ``what``
        they were doing."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        ranks = list(range(len(refs))) if ranks is None else list(ranks)
        index = {ref: i for i, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        pending = list(refs)
        deadline = time.monotonic() + self.timeout
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                late = [ranks[index[r]] for r in pending]
                raise WorkerGroupError(
                    self.role,
                    late,
                    f"no answer within resources.ray.rpc_timeout={self.timeout:g}s to {what} "
                    "(raise it if that work takes longer)",
                )
            done, pending = ray.wait(pending, num_returns=1, timeout=left)
            for ref in done:
                i = index[ref]
                try:
                    results[i] = ray.get(ref)
                except RayTaskError as err:
                    cause = err.cause if err.cause is not None else err
                    raise WorkerGroupError(
                        self.role, ranks[i], f"raised {type(cause).__name__}: {cause}"
                    ) from err
                except RayActorError as err:
                    raise WorkerGroupError(
                        self.role, ranks[i], f"worker process died ({_first_line(err)})"
                    ) from err
        return results

    def call_ranks(self, method: str, per_rank_args: Sequence[tuple[Any, ...]], **kw: Any) -> list:
        if len(per_rank_args) != self.world_size:
            raise ValueError(
                f"{self.role}: {len(per_rank_args)} argument sets for {self.world_size}"
            )
        return self._call(method, per_rank_args, **kw)

    def call_first(self, method: str, per_rank_args: Sequence[tuple[Any, ...]]) -> list[Any]:
        if not 0 < len(per_rank_args) <= self.world_size:
            raise ValueError(f"{self.role}: {len(per_rank_args)} calls for {self.world_size} ranks")
        return self._call(method, per_rank_args)

    def _call(self, method: str, per_rank_args: Sequence[tuple[Any, ...]], **kw: Any) -> list:
        refs = [w.call.remote(method, *a, **kw) for w, a in zip(self.workers, per_rank_args)]
        return self._wait(refs, f"the call {method}", ranks=range(len(refs)))

    def share(self, value: Any) -> Any:
        """One object-store copy; Ray hands each rank the value (zero-copy on a node)."""
        return self._ray.put(value)

    def full_weights(self) -> Any:
        """An ObjectRef to the gathered HF weights (rank 0's copy in the object store)."""
        refs = [w.full_weights.remote() for w in self.workers]
        return self._wait(refs, "gathering the role's full weights")[0][0]

    @property
    def alive(self) -> bool:
        return bool(self.workers)

    def shutdown(self) -> None:
        for w in self.workers:
            try:
                self._ray.kill(w, no_restart=True)
            except Exception as err:  # already dead: nothing to release
                log.debug("kill %s: %s", self.role, err)
        self.workers = []


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
