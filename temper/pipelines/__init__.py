"""Pipelines: the one training loop (``driver``) and, per ``pipeline`` name, a record
(:class:`Pipeline`: producer, step, checks, pre-flight, step shape) registered in
:data:`PIPELINES` (``rlvr``, ``agentic``, ``sft``, ``dpo``; ``generate``, ``eval`` and
``rlvr_rollout``, which run under their own commands) — or the user's own, named by path."""

from __future__ import annotations

from typing import Any

from temper.config.derive import Derived
from temper.config.errors import ConfigError
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
    pipeline = command_pipeline(cfg, "train")
    return train(cfg, pipeline, plan)


def command_pipeline(cfg: TemperConfig, command: str) -> Pipeline:
    """The record of ``cfg.pipeline``, which must be one that ``temper <command>`` runs
    (``ConfigError`` on ``pipeline`` naming the command that runs it otherwise)."""
    pipeline = resolve_pipeline(cfg.pipeline)
    if pipeline.command != command:
        raise ConfigError(
            "pipeline",
            f"pipeline {cfg.pipeline} runs with temper {pipeline.command}, not temper {command}",
            f"temper {pipeline.command} CONFIG",
        )
    return pipeline


def run_command(cfg: TemperConfig, command: str) -> dict[str, Any]:
    """Run a pipeline that is no training loop (``temper generate``, ``temper eval``):
    its record's ``main``; returns its summary."""
    pipeline = command_pipeline(cfg, command)
    assert pipeline.main is not None  # a pipeline of another command than train has one
    return pipeline.main(cfg)


__all__ = [
    "PIPELINES",
    "Pipeline",
    "Producer",
    "ProducerContext",
    "Validation",
    "command_pipeline",
    "resolve_pipeline",
    "run_command",
    "run_pipeline",
]
