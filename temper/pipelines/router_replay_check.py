"""What ``actor.router_replay`` needs of the rest of the run (checked at load; the model
itself — an MoE architecture replay knows — and, for R3, a rollout engine that returns
routing on this machine, at pre-flight)."""

from __future__ import annotations

from temper.config.catalog import ROLLOUT
from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.pipelines.registry import resolve_pipeline
from temper.training.router_replay import OFF, from_rollout


def check_router_replay(cfg: TemperConfig) -> None:
    """R2 records in the old-log-prob forward, which must run (on the megatron engine at
    any TP, PP, VPP, CP, EP); R3 replays the routing the rollout engine returns with each
    sample, which a pipeline's producer must ask for (``Pipeline.routing``) and keep
    whole: one generate call per response (no tool-calling turns, no partial rollout
    across weight updates).

    A pipeline that generates nothing (SFT, DPO, …) has no generated samples to replay:
    replay is refused there too."""
    mode = cfg.actor.router_replay
    if mode == OFF:
        return
    key = "actor.router_replay"
    pipeline = resolve_pipeline(cfg.pipeline)
    if ROLLOUT not in pipeline.uses:
        raise ConfigError(
            key,
            f"router replay replays the routing of generated samples; pipeline "
            f"{cfg.pipeline} generates none",
            f"set {key}=none",
        )
    if from_rollout(mode):
        _check_rollout_routing(cfg, mode, pipeline.routing)
        return
    if not cfg.actor.recompute_old_log_prob:
        raise ConfigError(
            key,
            f"router replay {mode} records the routing in the actor's old-log-prob forward, "
            "which actor.recompute_old_log_prob=false skips",
            "set actor.recompute_old_log_prob=true",
        )


def _check_rollout_routing(cfg: TemperConfig, mode: str, routing: bool) -> None:
    """R3: the samples reach the actor with the routing of the one generation that made
    each response."""
    key = "actor.router_replay"
    fix = f"set {key}=R2 (the trainer records its own routing in the old-log-prob forward)"
    if not routing:
        raise ConfigError(
            key,
            f"router replay {mode} replays the routing the rollout engine returns with each "
            f"sample; pipeline {cfg.pipeline}'s producer does not keep it",
            f"{fix}, or use pipeline rlvr",
        )
    if cfg.rollout.multi_turn.enable:
        raise ConfigError(
            key,
            f"router replay {mode} keeps the routing of one generate call per response; a "
            "multi-turn response is assembled from several (tool results in between)",
            f"{fix}, or set rollout.multi_turn.enable=false",
        )
    if cfg.async_training.partial_rollout_segment:
        raise ConfigError(
            key,
            f"router replay {mode} keeps the routing of one generate call per response; a "
            "partial rollout continues responses over several",
            f"{fix}, or set async_training.partial_rollout_segment=0",
        )


__all__ = ["check_router_replay"]
