"""What the registries of the layers above tell config validation: the ``Catalog``.

The config layer imports nothing of temper, yet a config names things that live higher
up — an advantage estimator, a training engine, a pipeline — and the run's plan depends
on what those entries need (GAE needs a critic's values; the ``torch`` engine trains in
one process; Megatron splits a role's devices by TP × PP × CP). A registry entry
declares its needs; :class:`Catalog` is how validation reads them: the names each
registry holds, the needs of one entry, the step shape and the combination checks of
the config's pipeline. ``temper.pipelines.catalog`` implements it over every registry;
:func:`temper.config.load_config` takes it.

A schema field whose values are a registry's names says so in its metadata
(``doc(..., registry="strategy")``), so the registry stays the only list of its names:
validation checks the value against :meth:`Catalog.names`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from temper.config.plan import CRITIC, REFERENCE, RL_PARTS, ROLLOUT, Derived, StepShape
from temper.config.schema import TemperConfig

__all__ = ["CRITIC", "REFERENCE", "RL_PARTS", "ROLLOUT", "Catalog"]

# Needs an entry may declare (``Catalog.needs``), read by the plan:
VALUES = "values"  # an advantage estimator that bootstraps from a critic's values
REWARD_COMPONENTS = "reward_components"  # an estimator of named reward components (gdpo)
ANCHOR_STATES = "anchor_index"  # an estimator of step samples grouped by anchor state (gigpo)
SUM_PI_SQUARED = "sum_pi_squared"  # an estimator of the policy's Σπ² per token (otb)
ONE_PROCESS = "one_process"  # a training engine that trains in this one process
MEGATRON_PARALLEL = "megatron_parallel"  # ranks split by the role's megatron TP × PP × CP


class Catalog(Protocol):
    """The registries above the config layer, as validation reads them."""

    def names(self, registry: str) -> Sequence[str]:
        """Every valid value of a schema field marked ``registry=...`` (aliases and the
        field's off switch, such as ``none``, included)."""
        ...

    def needs(self, registry: str, name: str) -> frozenset[str]:
        """What entry ``name`` of ``registry`` declares it needs (see the constants)."""
        ...

    def step_shape(self, cfg: TemperConfig) -> StepShape:
        """The shape of one step of ``cfg``'s pipeline; a ``ConfigError`` on the
        ``pipeline`` key when it names nothing this build (or the user's code) has."""
        ...

    def pipeline_uses(self, cfg: TemperConfig) -> frozenset[str]:
        """The optional parts of a run (``ROLLOUT``, ``REFERENCE``, ``CRITIC``) that
        ``cfg``'s pipeline's step can use; the plan turns on no other."""
        ...

    def check(self, cfg: TemperConfig, plan: Derived) -> None:
        """Combinations the run's pipeline (or the driver) cannot honour: a
        ``ConfigError`` for the first, in native keys (the loader translates it)."""
        ...
