"""The training loops, by ``pipeline`` name."""

from __future__ import annotations

from typing import Any

from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig


def run_pipeline(cfg: TemperConfig) -> dict[str, Any]:
    """Run the loop ``cfg.pipeline`` names."""
    if cfg.pipeline == "rlvr":
        from temper.pipelines.rlvr import train

        return train(cfg)
    if cfg.pipeline == "agentic":
        from temper.pipelines.agentic import train as train_agentic

        return train_agentic(cfg)
    raise ConfigError(
        "pipeline",
        f"the '{cfg.pipeline}' pipeline is not part of this build yet",
        "use pipeline: rlvr or agentic",
    )
