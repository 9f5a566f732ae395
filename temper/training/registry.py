"""Engines by ``strategy`` name: the one place a role's config key picks an engine.

``torch`` (one process) and ``fsdp2`` (one process per rank, inside a torch.distributed
process group) are built in. ``deepspeed`` and ``megatron`` are valid config values
whose engines are not in this build yet: asking for one is a configuration error that
names the key (``actor.strategy``, …), not a crash deep inside a run.
"""

from __future__ import annotations

from collections.abc import Callable

from temper.config.errors import ConfigError, unknown_name
from temper.training.base import TrainEngine
from temper.training.fsdp2_engine import FSDP2Engine
from temper.training.spec import EngineSpec
from temper.training.torch_engine import TorchEngine

EngineFactory = Callable[[EngineSpec], TrainEngine]

ENGINES: dict[str, EngineFactory] = {"torch": TorchEngine, "fsdp2": FSDP2Engine}
PLANNED_ENGINES: tuple[str, ...] = ("deepspeed", "megatron")


def register_engine(name: str, factory: EngineFactory) -> None:
    """Make ``strategy: name`` build engines with ``factory(spec)``."""
    if name in ENGINES and ENGINES[name] is not factory:
        raise ValueError(f"engine '{name}' is already registered")
    ENGINES[name] = factory


def build_engine(strategy: str, spec: EngineSpec, *, key: str | None = None) -> TrainEngine:
    """The engine registered as ``strategy``; ``key`` is the config key named in errors."""
    key = key or f"{spec.role}.strategy"
    factory = ENGINES.get(strategy)
    if factory is not None:
        return factory(spec)
    if strategy in PLANNED_ENGINES:
        raise ConfigError(
            key,
            f"the '{strategy}' training engine is not available yet in this build",
            f"set {key}: torch (one process, CPU or one GPU)",
        )
    raise unknown_name(key, strategy, [*ENGINES, *PLANNED_ENGINES])
