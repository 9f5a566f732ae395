"""What a run's generation asks of its rollout engine (:class:`EngineDemand`), from its
config and its pipeline's bound on a sample; vLLM's CPU build sizes its KV cache by it."""

from __future__ import annotations

from temper.config.plan import NO_TRAINING
from temper.config.schema import TemperConfig
from temper.pipelines.registry import resolve_pipeline
from temper.rollout.vllm_kv import EngineDemand, largest_call
from temper.training.router_replay import from_rollout


def demand_of(cfg: TemperConfig) -> EngineDemand:
    """The run's :class:`EngineDemand`: the context is ``rollout.max_model_len`` when set,
    else the pipeline's bound on a sample (its ``context`` hook; None: unbounded); the
    sequences ``min(rollout.max_num_seqs, largest_call(cfg))``; standalone when the
    pipeline trains nothing (``temper generate``, a rollout-only run: no trainer shares
    the engine's process and no weights are synced into it); the routing of the
    rollout's tokens under router replay R3."""
    sequences = min(cfg.rollout.max_num_seqs, largest_call(cfg))
    pipeline = resolve_pipeline(cfg.pipeline)
    standalone = NO_TRAINING in pipeline.uses
    routed = from_rollout(cfg.actor.router_replay)
    if cfg.rollout.max_model_len is not None:
        keys = ("rollout.max_model_len",)
        return EngineDemand(cfg.rollout.max_model_len, keys, sequences, standalone, routed)
    bound = pipeline.context(cfg, [])
    if bound is None:
        return EngineDemand(None, (), sequences, standalone, routed)
    return EngineDemand(bound[0], bound[1], sequences, standalone, routed)
