"""The agentic pipeline: multi-turn episodes in text environments → PPO-style update.

``train(cfg)`` is the job, ``agentic_step`` one step of DESIGN.md's data flow with an
environment in place of the prompt set — the same phases as :mod:`temper.pipelines.rlvr`:

env reset → multi-turn rollout (one ``generate`` per turn for all live episodes) →
trajectories as training rows (env tokens masked out) and rewards (returns or turn
rewards, format penalty, grouped normalization) → old/ref log-probs, values →
advantages → critic/actor updates → weight sync.

Validation plays the val env manager on held-out seeds (odd seeds: the train manager
draws even ones), greedy unless ``rollout.val`` says otherwise, and reports success
rate per tag, mean return, mean turns and the invalid-action rate; with
``experiment.render_save_dir`` it writes a few episodes' frames and dialogues there.
``experiment.rollout_data_dir`` / ``validation_data_dir`` get ``<step>.jsonl`` with one
row per episode (:func:`temper.pipelines.trajectories.trajectory_rows`): its text cut
into what the loss trained (the model's turns) and what was context only.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from temper.cluster.roles import build_cluster_roles, build_cluster_rollout
from temper.config.derive import derive
from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.envs import EnvManager
from temper.pipelines.agentic_rollout import AgenticPlayer, save_renders
from temper.pipelines.dumps import dump_generations
from temper.pipelines.experience import ShapingState
from temper.pipelines.rlvr import Timer
from temper.pipelines.setup import load_tokenizer, output_dir, response_metrics, seed_everything
from temper.pipelines.trajectories import (
    agentic_experience,
    episode_metrics,
    trajectory_batch,
    trajectory_rows,
)
from temper.roles import Roles
from temper.rollout import RolloutEngine, SamplingParams
from temper.rollout import sampling_params_from_config as sampling_params
from temper.tracking import MultiTracker, build_trackers

RENDERED_EPISODES = 4


@dataclasses.dataclass
class AgenticRun:
    """A run's long-lived parts: roles, engine, env managers, player, trackers."""

    cfg: TemperConfig
    out_dir: Path
    tokenizer: Any
    roles: Roles
    rollout: RolloutEngine
    player: AgenticPlayer
    train_envs: EnvManager
    val_envs: EnvManager
    shaping: ShapingState
    tracker: MultiTracker
    train_sampling: SamplingParams
    val_sampling: SamplingParams
    total_steps: int
    step: int = 0

    def sync_weights(self) -> None:
        every = max(1, self.cfg.rollout.model_update_frequency)
        if not getattr(self.rollout, "shared", False) and self.step % every == 0:
            self.rollout.load_weights(self.roles.actor.engine.named_weights())

    def decode(self, ids: list[int]) -> str:
        """Token ids as text, verbatim (special tokens and spaces kept), for dumps."""
        return self.tokenizer.decode(
            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    def close(self) -> None:
        self.train_envs.close()
        self.val_envs.close()
        self.rollout.close()
        self.tracker.close()
        shutdown = getattr(self.roles, "shutdown", None)  # Ray worker groups
        if shutdown is not None:
            shutdown()


def build_agentic_run(cfg: TemperConfig) -> AgenticRun:
    """Models, engine and env managers for ``cfg`` (config already validated)."""
    if cfg.experiment.max_steps is None:
        raise ConfigError(
            "experiment.max_steps", "the agentic pipeline has no epochs", "set max_steps"
        )
    derived = derive(cfg)
    seed_everything(cfg.experiment.seed)
    out = output_dir(cfg)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_tokenizer(cfg)
    total = cfg.experiment.max_steps
    roles = build_cluster_roles(cfg)  # in process, or Ray worker groups (resources.backend)
    samples = derived.samples_per_step
    roles.actor.set_total_steps(total * roles.actor.optimizer_steps_per_update(samples))
    if roles.critic is not None:
        roles.critic.set_total_steps(total * roles.critic.optimizer_steps_per_update(samples))
    rollout = build_cluster_rollout(cfg, roles, tokenizer)  # in process, or actor_infer ranks
    seed = cfg.experiment.seed
    train_envs = EnvManager.from_agentic(cfg.agentic, "train", seed)
    val_envs = EnvManager.from_agentic(
        cfg.agentic, "val", seed, record_frames=bool(cfg.experiment.render_save_dir)
    )
    tracker = build_trackers(
        cfg.experiment.trackers,
        out,
        total_steps=total,
        every=cfg.experiment.logging_steps,
        kwargs=cfg.experiment.tracker_kwargs,
        project=cfg.experiment.project_name,
        name=cfg.experiment.experiment_name,
    )
    return AgenticRun(
        cfg=cfg,
        out_dir=out,
        tokenizer=tokenizer,
        roles=roles,
        rollout=rollout,
        player=AgenticPlayer(cfg, rollout, tokenizer),
        train_envs=train_envs,
        val_envs=val_envs,
        shaping=ShapingState.from_config(cfg.algorithm),
        tracker=tracker,
        train_sampling=sampling_params(cfg.rollout, validation=False),
        val_sampling=sampling_params(cfg.rollout, validation=True),
        total_steps=total,
    )


def agentic_step(run: AgenticRun) -> dict[str, float]:
    """One RL step over a fresh set of episodes; returns its metrics."""
    cfg, roles, t = run.cfg, run.roles, Timer()
    with t("step"):
        with t("rollout"):
            trajs, _, rollout_metrics = run.player.play(
                run.train_envs, run.step, run.train_sampling
            )
            batch = trajectory_batch(trajs, run.player.runner.pad_token_id)
            batch.meta["temperature"] = cfg.rollout.temperature
        if cfg.actor.recompute_old_log_prob or "rollout_log_probs" not in batch:
            with t("old_log_probs"):
                batch = roles.actor.compute_log_probs(batch)  # entropy: from the update
        else:  # on-policy single update: the sampling log-probs are the old ones
            batch["old_log_probs"] = batch["rollout_log_probs"]
        if roles.reference is not None:
            with t("ref"):
                batch = roles.reference.compute_ref_log_probs(batch)
        if roles.critic is not None:
            with t("values"):
                batch = roles.critic.compute_values(batch)
        with t("adv"):
            batch, adv_metrics = agentic_experience(batch, cfg.algorithm, cfg.agentic, run.shaping)
        if cfg.experiment.rollout_data_dir:
            rows = trajectory_rows(batch, run.step, run.decode)
            dump_generations(cfg.experiment.rollout_data_dir, run.step, rows)
        with t("train"):
            critic_metrics = roles.critic.update(batch) if roles.critic is not None else {}
            actor_metrics = (
                roles.actor.update(batch) if run.step > cfg.experiment.critic_warmup else {}
            )
        with t("weight_sync"):
            run.sync_weights()
    metrics = {**rollout_metrics, **adv_metrics, **critic_metrics, **actor_metrics, **t.times}
    metrics.update(episode_metrics(batch, "train"))
    metrics.update(response_metrics(batch, t.times["timing/step_s"]))
    return metrics


def validate(run: AgenticRun) -> dict[str, float]:
    """Play the val envs on their fixed held-out seeds (step 0 every time); render a few."""
    trajs, slots, _ = run.player.play(run.val_envs, 0, run.val_sampling)
    batch = trajectory_batch(trajs, run.player.runner.pad_token_id)
    metrics = episode_metrics(batch, "val")
    if run.cfg.experiment.validation_data_dir:
        rows = trajectory_rows(batch, run.step, run.decode)
        dump_generations(run.cfg.experiment.validation_data_dir, run.step, rows)
    if run.cfg.experiment.render_save_dir:
        save_renders(
            run.cfg.experiment.render_save_dir,
            run.step,
            run.val_envs,
            trajs,
            slots,
            RENDERED_EPISODES,
        )
    shown = run.cfg.experiment.log_val_generations
    for k, tr in enumerate(trajs[:shown]):
        dialog = " | ".join(m["content"].replace("\n", " ")[:80] for m in tr.messages[1:])
        print(f"[val {k}] {tr.meta['tag']} return={tr.episode_return:.2f} {dialog}")
    return metrics


def val_summary(history: list[tuple[int, dict[str, float]]]) -> tuple[dict[str, float], str]:
    """Summary keys and the closing line's text for validations ``(step, metrics)``.

    ``val_success_first`` / ``val_success_last``: ``val/success_rate`` of the first and
    the last validation; ``val_success_before``: of the one at step 0 (before any
    update: ``val_before_train``), ``val_success_after``: of the last one after ≥ 1
    step. The text says "before → after" only when both exist, so a run that validated
    only before training (``test_freq`` ≤ 0) does not report its one measurement as a
    before/after pair.
    """
    if not history:
        return {}, ""
    rate = {step: m["val/success_rate"] for step, m in history}
    out = {
        "val_success_first": history[0][1]["val/success_rate"],
        "val_success_last": history[-1][1]["val/success_rate"],
    }
    before = rate.get(0)
    after_step = max(step for step, _ in history)
    if before is not None:
        out["val_success_before"] = before
    if after_step > 0:
        out["val_success_after"] = rate[after_step]
    after = f"{rate[after_step]:.3f} after {after_step} steps" if after_step > 0 else ""
    if before is not None and after:
        text = f"val/success_rate {before:.3f} before training → {after}"
    elif before is not None:
        text = f"val/success_rate {before:.3f} before training (no validation after it)"
    else:
        text = f"val/success_rate {out['val_success_first']:.3f} → {after}"
    return out, text


def train(cfg: TemperConfig) -> dict[str, Any]:
    """Train with ``cfg``; returns a summary incl. validation success before and after."""
    run = build_agentic_run(cfg)
    rewards: list[float] = []
    val_history: list[tuple[int, dict[str, float]]] = []  # (step, metrics)
    exp = cfg.experiment
    try:
        if exp.val_before_train or exp.val_only:
            val_history.append((run.step, validate(run)))
            run.tracker.log(val_history[-1][1], run.step)
        while not exp.val_only and run.step < run.total_steps:
            run.step += 1
            metrics = agentic_step(run)
            rewards.append(metrics["train/reward_mean"])
            if exp.test_freq > 0 and run.step % exp.test_freq == 0:
                val_history.append((run.step, validate(run)))
                metrics.update(val_history[-1][1])
            run.tracker.log(metrics, run.step)
        if not exp.val_only and exp.test_freq > 0 and run.step % exp.test_freq:
            val_history.append((run.step, validate(run)))
            run.tracker.log(val_history[-1][1], run.step)
        if not exp.val_only:
            final = run.out_dir / "final" / "actor"
            run.roles.actor.engine.save_hf(str(final))
            run.tokenizer.save_pretrained(str(final))
    finally:
        run.close()
    summary = {
        "steps": run.step,
        "output_dir": str(run.out_dir),
        "rewards": rewards,
        "reward_first": rewards[0] if rewards else float("nan"),
        "reward_last": rewards[-1] if rewards else float("nan"),
        "reward_mean": float(np.mean(rewards)) if rewards else float("nan"),
        "val": [m for _, m in val_history],
        "val_steps": [step for step, _ in val_history],
    }
    val_keys, val_text = val_summary(val_history)
    summary.update(val_keys)
    print(
        f"done: {run.step} steps; train/reward_mean first {summary['reward_first']:.3f} → last "
        f"{summary['reward_last']:.3f}"
        + (f"; {val_text}" if val_text else "")
        + f"; outputs in {run.out_dir}"
    )
    return summary
