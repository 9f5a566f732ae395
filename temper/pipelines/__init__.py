"""Pipelines: the one training loop (``driver``) and, per ``pipeline`` name, a record
(:class:`Pipeline`: producer, step, checks, pre-flight, step shape) registered in
:data:`PIPELINES` (``rlvr``, ``agentic``, ``sft``) — or the user's own, named by path."""

from __future__ import annotations

from typing import Any

from temper.config.derive import Derived
from temper.config.schema import TemperConfig
from temper.pipelines.producer import Producer, ProducerContext, Validation
from temper.pipelines.record import Pipeline
from temper.pipelines.registry import PIPELINES, resolve_pipeline


def run_pipeline(cfg: TemperConfig, plan: Derived | None = None) -> dict[str, Any]:
    """Run the one loop with the producer of ``cfg.pipeline``; returns the summary.

    ``plan``: the plan ``load_config`` made (the CLI's); without it ``cfg`` is validated
    and checked here first, as ``load_config`` would.
    """
    from temper.pipelines.catalog import plan as plan_of
    from temper.pipelines.driver import train

    if plan is None:
        plan = plan_of(cfg)
    return train(cfg, resolve_pipeline(cfg.pipeline), plan)


__all__ = [
    "PIPELINES",
    "Pipeline",
    "Producer",
    "ProducerContext",
    "Validation",
    "resolve_pipeline",
    "run_pipeline",
]
