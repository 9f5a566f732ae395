"""The RLVR pipeline: single-turn prompts → n responses → verifiable reward → PPO update.

``train(cfg)`` is the whole job; ``rl_step`` is one step of DESIGN.md's data flow, each
phase a named call on a role. Memory moves and engine details live inside the roles.
"""

from __future__ import annotations

import dataclasses
import time
from contextlib import contextmanager
from typing import Any

import torch

from temper.algorithms import estimator_inputs
from temper.algorithms.rollout_correction import logprob_diff
from temper.config.schema import TemperConfig
from temper.data import Batch, next_prompt_batch
from temper.pipelines.dumps import dump_generations, generation_rows
from temper.pipelines.experience import compute_experience
from temper.pipelines.setup import Run, build_run, response_metrics
from temper.pipelines.signals import StopSignals
from temper.pipelines.validation import validate


class Timer:
    """Collects ``timing/<name>_s`` for the phases of one step."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        yield
        self.times[f"timing/{name}_s"] = time.perf_counter() - start


def greedy_baseline(run: Run, prompts: Batch, uids: list[str]) -> torch.Tensor:
    """ReMax's baseline: the reward of each prompt's greedy response, per sample row."""
    greedy = dataclasses.replace(run.train_sampling, n=1, do_sample=False, temperature=0.0)
    scored, _ = run.rewards.score(run.rollout.generate(prompts, greedy), prefix="baseline")
    by_uid = dict(zip(scored["uid"], scored["scores"].tolist()))
    return torch.tensor([by_uid[u] for u in uids], dtype=torch.float32)


def rollout_mismatch(batch: Batch) -> dict[str, float]:
    """``rollout/logprob_diff``: the rollout engine's log-probs vs the trainer's recompute."""
    if "rollout_log_probs" not in batch or "old_log_probs" not in batch:
        return {}
    diff = logprob_diff(batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"])
    return {f"rollout/{k}": float(v) for k, v in diff.items()}


def rl_step(run: Run) -> dict[str, float]:
    """One RL step; returns its metrics."""
    cfg, roles, t = run.cfg, run.roles, Timer()
    with t("step"):
        prompts = next_prompt_batch(run.train_data, run.sampler)
        prompts.meta["temperature"] = cfg.rollout.temperature
        with t("rollout"):
            batch = run.rollout.generate(prompts, run.train_sampling)
        with t("reward"):
            batch, reward_metrics = run.rewards.score(batch)
            if "baseline_rewards" in estimator_inputs(cfg.algorithm.adv_estimator):
                batch["baseline_scores"] = greedy_baseline(run, prompts, batch["uid"])
        if cfg.actor.recompute_old_log_prob:
            with t("old_log_probs"):
                batch = roles.actor.compute_log_probs(batch)  # entropy: from the update
        else:  # on-policy single update: the sampling log-probs are the old ones
            batch["old_log_probs"] = batch["rollout_log_probs"]
        mismatch = rollout_mismatch(batch) if cfg.actor.recompute_old_log_prob else {}
        if roles.reference is not None:
            with t("ref"):
                batch = roles.reference.compute_ref_log_probs(batch)
        if roles.critic is not None:
            with t("values"):
                batch = roles.critic.compute_values(batch)
        with t("adv"):
            batch, adv_metrics = compute_experience(batch, cfg.algorithm, cfg.rollout, run.shaping)
        if cfg.experiment.rollout_data_dir:
            dump_generations(
                cfg.experiment.rollout_data_dir, run.step, generation_rows(batch, run.step)
            )
        with t("train"):
            critic_metrics = roles.critic.update(batch) if roles.critic is not None else {}
            actor_metrics = {}
            if run.step > cfg.experiment.critic_warmup:
                actor_metrics = roles.actor.update(batch)
        with t("weight_sync"):
            run.sync_weights()
    metrics = {**reward_metrics, **adv_metrics, **critic_metrics, **actor_metrics, **t.times}
    metrics.update(mismatch)
    metrics.update(response_metrics(batch, t.times["timing/step_s"]))
    metrics.update(run.train_data.metrics())
    return metrics


def train(cfg: TemperConfig) -> dict[str, Any]:
    """Train with ``cfg`` (resuming per ``experiment.resume_mode``); returns a summary.

    SIGTERM/SIGINT stop the run after the current step with a checkpoint; the summary
    then has ``stopped_by`` (the signal's name) and ``temper train`` exits 128 + signal.
    """
    run = build_run(cfg)
    exp = cfg.experiment
    try:
        with StopSignals(exp.save_on_signal) as stop:
            if run.step == 0 and (exp.val_before_train or exp.val_only):
                run.tracker.log(validate(run), run.step)
            if exp.val_only:
                return run.summary()
            if run.step >= run.total_steps:
                print(
                    f"nothing to do: {run.resumed_from} already reached step {run.step} of "
                    f"{run.total_steps} (raise experiment.max_steps to go on, or use "
                    "experiment.resume_mode=disable / another output_dir to start over)"
                )
                return run.summary()
            while run.step < run.total_steps:
                run.step += 1
                metrics = rl_step(run)
                run.reward_history.append(metrics["train/reward_mean"])
                if exp.test_freq > 0 and run.step % exp.test_freq == 0:
                    metrics.update(validate(run))
                run.tracker.log(metrics, run.step)
                stopping = stop.received is not None  # read once: save iff we stop
                if run.should_save(stopping):
                    run.save_checkpoint()
                if stopping:
                    break
        if stop.received is None:
            if exp.test_freq > 0 and run.step % exp.test_freq:
                run.tracker.log(validate(run), run.step)
            run.save_final()
    finally:
        run.close()
    summary = {**run.summary(), "stopped_by": stop.name}
    print(
        f"{'stopped by ' + stop.name if stop.name else 'done'}: {summary['steps']} steps; "
        f"train/reward_mean first {summary['reward_first']:.3f} → last "
        f"{summary['reward_last']:.3f} (mean of first/last 5 steps: "
        f"{summary['reward_first5']:.3f} → {summary['reward_last5']:.3f}); "
        f"outputs in {summary['output_dir']}"
    )
    return summary
