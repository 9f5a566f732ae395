"""Engines by ``strategy`` name: the one place a role's config key picks an engine.

``torch`` (one process), ``fsdp2`` (one process per rank, inside a torch.distributed
process group), ``deepspeed`` (likewise; a one-rank group of its own on the local
backend) and ``megatron`` (Megatron-Core, tensor × data parallel) are built in. The last
two are optional packages, imported only when an engine is built; without them asking
for the engine is a configuration error naming the key (``actor.strategy``, …), not a
crash deep inside a run.

Each entry declares what the run's plan needs to know of it (``needs``, read through the
config layer's ``Catalog``): whether it trains in one process, and how a role's devices
split into data-parallel ranks. :func:`register_engine` adds one that a config then
selects by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from temper.config.catalog import MEGATRON_PARALLEL, ONE_PROCESS
from temper.config.derive import Derived
from temper.config.errors import ConfigError, unknown_name
from temper.config.schema import ActorConfig, TemperConfig, TrainEngineConfig
from temper.registry import Registry
from temper.training.base import TrainEngine
from temper.training.fsdp2_engine import FSDP2Engine, check_sharded
from temper.training.spec import EngineSpec
from temper.training.torch_engine import TorchEngine, check_one_process

EngineFactory = Callable[[EngineSpec], TrainEngine]


@dataclasses.dataclass(frozen=True)
class Engine:
    """A training engine: its factory, and its needs (``temper.config.catalog``).

    ``hf_value_model``: its value model is the Hugging Face backbone and scalar head of
    :mod:`temper.training.models`, so a reward model it trains saves as
    ``AutoModelForSequenceClassification`` (Megatron builds its own network instead).
    ``fp32_master_reason``: see the field."""

    build: EngineFactory
    needs: frozenset[str] = frozenset()
    hf_value_model: bool = True
    #: why the engine keeps fp32 master weights whatever ``<role>.master_dtype`` says;
    #: empty: it stores trained weights in ``master_dtype`` (:func:`load_model`'s way)
    fp32_master_reason: str = ""


def _megatron(spec: EngineSpec) -> TrainEngine:
    from temper.training.megatron_check import check_engine_spec

    check_engine_spec(spec)  # names the key when megatron-core is missing, before importing
    from temper.training.megatron_engine import MegatronEngine

    return MegatronEngine(spec)


def _deepspeed(spec: EngineSpec) -> TrainEngine:
    # imported here: the module imports nothing heavy, but DeepSpeed itself takes seconds
    from temper.training.deepspeed_engine import DeepSpeedEngine

    return DeepSpeedEngine(spec)


ENGINES: Registry[Engine] = Registry("training engine")
ENGINES.add("torch", Engine(TorchEngine, frozenset({ONE_PROCESS})))
ENGINES.add("fsdp2", Engine(FSDP2Engine, frozenset()))
ENGINES.add(
    "megatron",
    Engine(
        _megatron,
        frozenset({MEGATRON_PARALLEL}),
        hf_value_model=False,
        fp32_master_reason="Megatron-Core's optimizer keeps fp32 main parameters of its own",
    ),
)
# DeepSpeed honours master_dtype bf16 through its own mode (deepspeed_config refuses the rest)
ENGINES.add("deepspeed", Engine(_deepspeed, frozenset()))


# Engines whose world-size-1 run computes exactly the torch engine's update: on the local
# backend (one process) they run as ``torch``. DeepSpeed and Megatron are not among them:
# on one GPU DeepSpeed is asked for its ZeRO offload (optimizer state, parameters on the
# host), which the torch engine does not do, and Megatron for its own model and
# checkpoints; each runs as itself in a one-rank process group.
SWAPPED_ON_LOCAL = frozenset({"fsdp2"})


def local_engine(cfg: TemperConfig, strategy: str) -> str:
    """The engine a role with ``strategy`` gets on ``cfg``'s backend (no side effect)."""
    if cfg.resources.backend == "local" and strategy in SWAPPED_ON_LOCAL:
        return "torch"
    return strategy


def register_engine(name: str, factory: EngineFactory, needs: frozenset[str] = frozenset()) -> None:
    """Make ``strategy: name`` build engines with ``factory(spec)``; ``needs`` as
    :class:`Engine` (none: one rank per device, like fsdp2 without sequence parallel)."""
    ENGINES.add(name, Engine(factory, needs))


def build_engine(strategy: str, spec: EngineSpec, *, key: str | None = None) -> TrainEngine:
    """The engine registered as ``strategy``; ``key`` is the config key named in errors."""
    key = key or f"{spec.role}.strategy"
    if strategy in ENGINES:
        return ENGINES.get(strategy).build(spec)
    raise unknown_name(key, strategy, ENGINES.names())


def check_master_dtype(role: str, train: TrainEngineConfig, engine: str) -> None:
    """Half-precision master weights need an engine that stores them (torch, fsdp2,
    deepspeed in its ZeRO bf16 mode)."""
    reason = ENGINES.get(engine).fp32_master_reason
    if train.master_dtype != "fp32" and reason:
        raise ConfigError(
            f"{role}.master_dtype",
            f"{train.master_dtype} master weights: {reason}",
            f"set {role}.master_dtype: fp32, or {role}.strategy: fsdp2 or torch",
        )


def check_engines(cfg: TemperConfig, plan: Derived) -> None:
    """What building the roles' engines would refuse, found at load without importing an
    engine or loading a model: a ``deepspeed`` role needs the deepspeed package, and its
    ``deepspeed`` section must resolve (stage, refused sections, temper-owned values)."""
    import importlib.util

    from temper.training.deepspeed_config import (
        PRECISIONS,
        DeepSpeedFill,
        batch_fill,
        resolve_deepspeed_config,
    )
    from temper.training.deepspeed_engine import check_partitioned
    from temper.training.models import resolve_device, role_compute_dtype

    roles: list[tuple[str, str, TrainEngineConfig | None, dict[str, Any], int]] = [
        ("actor", cfg.actor.strategy, cfg.actor, cfg.actor.deepspeed, plan.actor.devices)
    ]
    if plan.critic is not None:
        roles.append(
            ("critic", cfg.critic.strategy, cfg.critic, cfg.critic.deepspeed, plan.critic.devices)
        )
    # the reference's own engine, and the teachers', which are built as it is
    if (plan.use_reference and cfg.model.lora.rank == 0) or cfg.distill.teachers:
        ranks = len(plan.placement["reference"]) if cfg.resources.backend != "local" else 1
        ref = cfg.reference
        roles.append(("reference", ref.strategy, None, ref.deepspeed, ranks))
    if plan.use_prm:  # PRIME's implicit PRM: a trained role of its own, on the actor's ranks
        prm = cfg.prime.prm
        roles.append(("prime.prm", prm.strategy, prm, prm.deepspeed, plan.actor.devices))
    device = resolve_device(cfg.experiment.device)
    for role, strategy, train, section, world in roles:
        engine = local_engine(cfg, strategy)
        if train is not None and engine in ENGINES:
            check_master_dtype(role, train, engine)
        if train is not None and engine == "torch":
            check_one_process(role, train.ulysses_sequence_parallel_size)
        if train is not None and engine == "fsdp2":
            fsdp = train.fsdp
            l2 = train.l2_coef if isinstance(train, ActorConfig) else 0.0
            check_sharded(role, l2, fsdp.fsdp_size, world)
        if engine != "deepspeed":
            continue
        if importlib.util.find_spec("deepspeed") is None:
            raise ConfigError(
                f"{role}.strategy",
                "strategy 'deepspeed' needs the deepspeed package, which is not installed",
                "DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed (scripts/install.sh "
                "does this), or choose strategy fsdp2/torch",
            )
        micro, accum = batch_fill(train, 1, world)
        master = train.master_dtype if train is not None else None
        clip = train.grad_clip if train is not None and train.grad_clip is not None else 0.0
        fill = DeepSpeedFill(
            role=role,
            micro_batch=micro,
            grad_accum=accum,
            world=world,
            grad_clip=max(0.0, float(clip)),
            precision=PRECISIONS[role_compute_dtype(cfg.model.dtype, master, device)],
            hidden_size=1,  # a stand-in: the model's config is not read here
            trainable=train is not None,
            master=master or "fp32",
        )
        resolved = resolve_deepspeed_config(section, fill)
        l2 = train.l2_coef if isinstance(train, ActorConfig) else 0.0
        offload = role == "reference" and cfg.reference.param_offload
        check_partitioned(role, l2, resolved.stage, offload, device.type)
