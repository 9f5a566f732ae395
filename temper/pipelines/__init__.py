"""The training loops, by ``pipeline`` name."""

from __future__ import annotations

from typing import Any

from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig


def run_pipeline(cfg: TemperConfig) -> dict[str, Any]:
    """Run the loop ``cfg.pipeline`` names."""
    if cfg.pipeline == "rlvr":
        from temper.pipelines.rlvr import train

        if cfg.rollout.multi_turn.enable:  # until setup wraps the engine (rlvr_tool_engine)
            raise ConfigError(
                "rollout.multi_turn.enable",
                "tool calling over dataset prompts (ToolCallingEngine) is not wired into the "
                "RLVR run setup yet; training would silently run single-turn",
                "use pipeline: agentic with a tool env (e.g. countdown_tool), or "
                "set rollout.multi_turn.enable=false",
            )

        return train(cfg)
    if cfg.pipeline == "agentic":
        from temper.pipelines.agentic import train as train_agentic

        return train_agentic(cfg)
    raise ConfigError(
        "pipeline",
        f"the '{cfg.pipeline}' pipeline is not part of this build yet",
        "use pipeline: rlvr or agentic",
    )
