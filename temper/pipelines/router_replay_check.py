"""What ``actor.router_replay`` needs of the rest of the run (checked at load; the model
itself — an MoE architecture replay knows — at pre-flight)."""

from __future__ import annotations

from temper.config.catalog import ROLLOUT
from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.pipelines.registry import resolve_pipeline
from temper.training.router_replay import OFF, ROUTER_REPLAY


def check_router_replay(cfg: TemperConfig) -> None:
    """R3 needs routing from the rollout engine, which none here returns; R2 records in
    the old-log-prob forward, which must run (on the megatron engine at any TP, PP, VPP,
    CP, EP).

    A pipeline that generates nothing (SFT, DPO, …) has no old-log-prob forward to
    record in: replay is refused there too."""
    mode = cfg.actor.router_replay
    if mode == OFF:
        return
    key = "actor.router_replay"
    if ROLLOUT not in resolve_pipeline(cfg.pipeline).uses:
        raise ConfigError(
            key,
            f"router replay replays the routing of generated samples; pipeline "
            f"{cfg.pipeline} generates none",
            f"set {key}=none",
        )
    if ROUTER_REPLAY.get(mode).recorded_at == "rollout":
        raise ConfigError(
            key,
            f"router replay {mode} replays the experts the rollout engine chose for each "
            "token; temper's rollout engines (hf, vllm) do not return them (vLLM's "
            "enable_return_routed_experts needs its V2 model runner, which needs Triton: "
            "not in the CPU build)",
            f"set {key}=R2 (the trainer records its own routing in the old-log-prob forward "
            "and the update replays it), or none",
        )
    if not cfg.actor.recompute_old_log_prob:
        raise ConfigError(
            key,
            f"router replay {mode} records the routing in the actor's old-log-prob forward, "
            "which actor.recompute_old_log_prob=false skips",
            "set actor.recompute_old_log_prob=true",
        )


__all__ = ["check_router_replay"]
