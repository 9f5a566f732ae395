"""Pipelines: the one training loop (``driver``) and, per ``pipeline`` name, a producer
and its validation (``rlvr``, ``agentic``), registered in :data:`PIPELINES`."""

from __future__ import annotations

from typing import Any

from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.pipelines.producer import Pipeline, ProducerContext
from temper.registry import Registry

PIPELINES: Registry[Pipeline] = Registry("pipeline")


def _rlvr() -> Pipeline:
    from temper.pipelines.rlvr import RLVRProducer, check

    return Pipeline(RLVRProducer, check)


def _agentic() -> Pipeline:
    from temper.pipelines.agentic import AgenticProducer, check

    return Pipeline(AgenticProducer, check)


PIPELINES.add_lazy("rlvr", _rlvr)  # lazy: `temper check` must not import torch-heavy parts
PIPELINES.add_lazy("agentic", _agentic)


def pipeline_of(cfg: TemperConfig) -> Pipeline:
    """The registered pipeline ``cfg.pipeline`` names."""
    if cfg.pipeline not in PIPELINES:
        raise ConfigError(
            "pipeline",
            f"the '{cfg.pipeline}' pipeline is not part of this build yet",
            f"use pipeline: {' or '.join(PIPELINES.names())}",
        )
    return PIPELINES.get(cfg.pipeline)


def check_pipeline(cfg: TemperConfig) -> None:
    """What ``temper train`` would refuse about ``cfg`` before loading anything: the
    shared checks (:mod:`temper.pipelines.checks`) and the pipeline's own."""
    from temper.pipelines.checks import check_run

    check_run(cfg)
    pipeline_of(cfg).check(cfg)


def run_pipeline(cfg: TemperConfig) -> dict[str, Any]:
    """Check ``cfg``, then run the one loop with the producer ``cfg.pipeline`` names."""
    from temper.pipelines.driver import train

    check_pipeline(cfg)
    return train(cfg, pipeline_of(cfg))


__all__ = [
    "PIPELINES",
    "Pipeline",
    "ProducerContext",
    "check_pipeline",
    "pipeline_of",
    "run_pipeline",
]
