"""Building a run (:class:`~temper.pipelines.run.Run`) from a validated config, its plan
and its pipeline's record: the run directory's lock and resume point, the roles, the
rollout engine where the step generates, the producer, the trackers, and the
checkpointer over every stateful part."""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path
from typing import Any, cast

from temper.cluster.judge import build_judge
from temper.cluster.roles import ClusterRoles, build_cluster_roles, build_cluster_rollout
from temper.config.derive import Derived
from temper.config.schema import TemperConfig
from temper.config.typed import to_dict
from temper.pipelines.ahead import RolloutAhead
from temper.pipelines.checkpointing import (
    Checkpointer,
    Progress,
    RNGState,
    check_resume_config,
    checkpoint_root,
    checkpoint_step,
    restore,
)
from temper.pipelines.demand import demand_of
from temper.pipelines.producer import GroupProducer, Producer, ProducerContext
from temper.pipelines.record import Pipeline
from temper.pipelines.run import Run, WeightSync, load_tokenizer, output_dir, seed_everything
from temper.pipelines.run_dir import claim_run_dir
from temper.pipelines.shaping import ShapingSettings, ShapingState
from temper.pipelines.stream_filter import StreamFilter
from temper.pipelines.stream_schedule import ahead_cap, chunk_size
from temper.pipelines.streaming import StreamingRollout
from temper.roles import Roles
from temper.roles.base import TrainedRole
from temper.roles.prm import prm_steps_per_rl_step
from temper.rollout import RolloutEngine
from temper.tracking import MultiTracker, build_trackers
from temper.utils.determinism import use_deterministic_kernels


def build_run(cfg: TemperConfig, pipeline: Pipeline, plan: Derived) -> Run:
    """Lock the run's directory and decide where the run starts (before anything is
    written there: :func:`~temper.pipelines.run_dir.claim_run_dir`), then load models,
    engine, the producer and trackers for ``cfg`` (validated, ``plan`` its plan) and
    resume per ``experiment.resume_mode``. The run holds the lock until ``close``."""
    seed_everything(cfg.experiment.seed)
    out = output_dir(cfg)
    lock, resume_from = claim_run_dir(cfg, out)
    kernels = use_deterministic_kernels(cfg.experiment.deterministic)  # before any model
    try:
        run = _build_run(cfg, pipeline, plan, out, resume_from)
    except BaseException:
        kernels.restore()
        lock.release()
        raise
    run.lock, run.kernels = lock, kernels
    return run


def _build_run(
    cfg: TemperConfig, pipeline: Pipeline, plan: Derived, out: Path, resume_from: Path | None
) -> Run:
    if resume_from is not None:  # before any model loads: a bad resume fails fast
        for line in check_resume_config(cfg, resume_from):
            print(line, flush=True)
    tokenizer = load_tokenizer(cfg)
    # what generation asks of a rollout engine (its CPU KV cache); SFT generates nothing
    demand = demand_of(cfg) if plan.use_rollout else None
    roles = build_cluster_roles(cfg, plan, demand)  # in process, or Ray worker groups
    producer: Producer | None = None
    rollout: RolloutEngine | None = None
    tracker: MultiTracker | None = None
    try:
        if plan.use_rollout:  # the step generates (RL); SFT builds no engine
            rollout = build_cluster_rollout(cfg, roles, tokenizer, demand)  # or actor_infer
        device = roles.actor.engine.device
        cluster = roles if isinstance(roles, ClusterRoles) else None
        remote_judge = cluster.judge if cluster is not None else None
        judge = build_judge(cfg, device, remote_judge)  # LLM judge (function llm_judge), if used
        shaping = pipeline.shaping(cfg)
        producer = pipeline.build(
            ProducerContext(
                cfg,
                tokenizer,
                rollout,
                device,
                out,
                shaping,
                judge,
                roles,
                reward_model=cluster.reward_model if cluster is not None else None,
            )
        )
        total = producer.total_steps
        roles.actor.set_total_steps(total * plan.actor.optimizer_steps_per_rl_step)
        if roles.critic is not None and plan.critic is not None:
            roles.critic.set_total_steps(total * plan.critic.optimizer_steps_per_rl_step)
        if roles.prm is not None:  # PRIME: the PRM's optimizer steps per RL step
            roles.prm.set_total_steps(
                max(1, total * prm_steps_per_rl_step(cfg, plan.samples_per_step))
            )
        shaping_state = ShapingState.from_config(cfg.algorithm)
        weights = None
        if rollout is not None:
            every = cfg.rollout.model_update_frequency
            weights = WeightSync(rollout, roles.actor.engine, every)
            if cfg.async_training.staleness > 0:  # the rollout runs ahead of training
                weights.ahead = True
                producer = _ahead(cfg, plan.shape.groups, producer, weights, tokenizer, shaping)
        progress = Progress()
        checkpointer = _checkpointer(
            cfg, out, roles, tokenizer, producer, shaping_state, weights, progress
        )
        if resume_from is not None:  # a checkpoint that does not load: an older one
            start = time.perf_counter()
            warn = functools.partial(print, file=sys.stderr, flush=True)
            note = functools.partial(print, flush=True)
            resume_from = restore(checkpointer, cfg, out, resume_from, warn, note)
            took = time.perf_counter() - start
            print(f"resumed from {resume_from} at step {progress.step} ({took:.1f}s)", flush=True)
        tracker = build_trackers(  # after the load: it drops metrics rows past the resumed step
            cfg.experiment.trackers,
            out,
            total_steps=total,
            every=cfg.experiment.logging_steps,
            kwargs=cfg.experiment.tracker_kwargs,
            project=cfg.experiment.project_name,
            name=cfg.experiment.experiment_name,
            start_step=checkpoint_step(resume_from) + 1 if resume_from is not None else 0,
        )
        run = Run(
            cfg=cfg,
            out_dir=out,
            tokenizer=tokenizer,
            roles=roles,
            rollout=rollout,
            producer=producer,
            shaping=shaping,
            shaping_state=shaping_state,
            tracker=tracker,
            total_steps=total,
            weights=weights,
            checkpointer=checkpointer,
            progress=progress,
            curve=pipeline.curve,
            resumed_from=resume_from,
        )
    except BaseException:  # reward workers, envs and Ray groups must not outlive a failure
        if producer is not None:
            producer.close()
        if rollout is not None:
            rollout.close()
        if tracker is not None:
            tracker.close()
        roles.shutdown()
        raise
    return run


def _checkpointer(
    cfg: TemperConfig,
    out: Path,
    roles: Roles,
    tokenizer: Any,
    producer: Producer,
    shaping_state: ShapingState,
    weights: WeightSync | None,
    progress: Progress,
) -> Checkpointer:
    """The run's stateful parts, in the order a resume restores them: the trained roles,
    then the producer, shaping, the rollout engine (and the actor's weights pushed into
    it), the progress, and every RNG last — right before training goes on."""
    trained: dict[str, TrainedRole] = {"actor": roles.actor}
    limits = [cfg.experiment.max_actor_ckpt_to_keep]
    if roles.critic is not None:
        trained["critic"] = roles.critic
        limits.append(cfg.experiment.max_critic_ckpt_to_keep)
    if roles.prm is not None:  # PRIME's implicit PRM (verl: global_step_N/reward)
        trained["reward_model"] = roles.prm
    keep = [n for n in limits if n is not None and n > 0]
    return Checkpointer(
        root=checkpoint_root(cfg, out),
        roles=trained,
        states={
            "producer": producer,
            "shaping": shaping_state,
            **({"rollout": weights} if weights is not None else {}),
            "progress": progress,
            "rng": RNGState(),
        },
        config=to_dict(cfg),
        meta={"pipeline": cfg.pipeline},
        tokenizer=tokenizer,
        keep=max(keep) if keep else None,
    )


def _ahead(
    cfg: TemperConfig,
    groups: int,
    producer: Producer,
    weights: WeightSync,
    tokenizer: Any,
    shaping: ShapingSettings,
) -> Producer:
    """The producer wrapped to run ahead of training (``async_training``): whole batches
    on the fixed schedule, or the step's ``groups`` streamed (the pipeline's record
    declares ``streams``, which ``temper check`` requires)."""
    at = cfg.async_training
    if at.mode == "fixed":
        return RolloutAhead(
            producer,
            weights.snapshot,
            weights.load,
            staleness=at.staleness,
            wait_timeout=at.wait_timeout,
            seed=cfg.experiment.seed,
        )
    fg = cfg.algorithm.filter_groups
    return StreamingRollout(
        cast(GroupProducer, producer),  # the record's stream_groups: it is one
        weights.snapshot,
        weights.load,
        staleness=at.staleness,
        batch_groups=groups,
        chunk=chunk_size(at.stream_chunk, groups),
        strategy=at.max_off_policy_strategy,
        wait_timeout=at.wait_timeout,
        seed=cfg.experiment.seed,
        pad_token_id=tokenizer.pad_token_id or 0,
        segment=at.partial_rollout_segment,
        group_filter=StreamFilter(fg, shaping, groups) if fg.enable else None,
        max_ahead=ahead_cap(at.max_ahead_batches, groups),
    )
