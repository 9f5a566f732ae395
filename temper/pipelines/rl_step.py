"""The RL step (DESIGN.md's data flow), the step of every RL pipeline (rlvr, agentic).

The pipeline's producer turns the step's inputs into a scored batch (RLVR: prompts →
responses → rewards; agentic: env resets → episodes → returns); then old log-probs,
reference log-probs, values, shaping and advantages, the updates and the weight sync are
the same for all, each phase a named call on a role. A pipeline record that names no
step of its own runs this one (:class:`temper.pipelines.record.Pipeline`).
"""

from __future__ import annotations

import numpy as np

from temper.algorithms import estimator_inputs, kl_estimator_needs_logits
from temper.algorithms.rollout_correction import logprob_diff
from temper.config.schema import TemperConfig
from temper.data.batch import Batch
from temper.pipelines.dumps import dump_generations
from temper.pipelines.run import Run
from temper.pipelines.shaping import compute_experience
from temper.pipelines.timing import Timer, throughput


def rl_step(run: Run) -> dict[str, float]:
    """One RL step; returns its metrics."""
    cfg, roles, t = run.cfg, run.roles, Timer()
    with t("step"):
        batch, metrics = run.producer.produce(run.step, t)  # scored; timings rollout, reward
        metrics.update(response_metrics(batch))
        tokens = batch["prompt_mask"].sum().item() + batch["response_mask"].sum().item()
        if needs_actor_forward(cfg, batch):
            with t("old_log_probs"):
                # entropy: from the update; Σπ²: for the optimal-token-baseline estimators
                batch = roles.actor.compute_log_probs(
                    batch, with_sum_pi_squared=wants_sum_pi_squared(cfg)
                )
            metrics.update(rollout_mismatch(batch))
        else:  # on-policy single update: the sampling log-probs are the old ones
            batch["old_log_probs"] = batch["rollout_log_probs"]
        if roles.reference is not None:
            with t("ref"):
                batch = roles.reference.compute_ref_log_probs(batch)
        if roles.teachers is not None:  # on-policy distillation: the teachers score the tokens
            with t("teacher"):
                # the tokenizer's ids only: a teacher's output layer may have padding rows
                vocab = len(run.tokenizer) if cfg.distill.topk else None
                batch = roles.teachers.compute_teacher_log_probs(batch, cfg.distill.topk, vocab)
        if roles.critic is not None:
            with t("values"):
                batch = roles.critic.compute_values(batch)
        with t("adv"):
            batch, shaped = compute_experience(batch, run.shaping, run.shaping_state, run.step)
        if cfg.experiment.rollout_data_dir:
            rows = run.producer.dump_rows(batch, run.step)
            dump_generations(cfg.experiment.rollout_data_dir, run.step, rows)
        with t("train"):
            critic = roles.critic.update(batch) if roles.critic is not None else {}
            actor = roles.actor.update(batch) if run.step > cfg.experiment.critic_warmup else {}
        with t("weight_sync"):
            run.sync_weights()
    seconds = t.times["timing/step_s"]
    return {**metrics, **shaped, **critic, **actor, **t.times, **throughput(tokens, seconds)}


def needs_actor_forward(cfg: TemperConfig, batch: Batch) -> bool:
    """Recompute old log-probs with the trainer? Yes unless ``recompute_old_log_prob`` is
    off and the engine returned sampling log-probs — and always for the exact KL in the
    reward, which needs the actor's distribution over the vocabulary."""
    full_kl = cfg.algorithm.use_kl_in_reward and kl_estimator_needs_logits(cfg.algorithm.kl_penalty)
    # Σπ² needs the forward too: validation refuses it with recompute_old_log_prob off
    return cfg.actor.recompute_old_log_prob or "rollout_log_probs" not in batch or full_kl


def wants_sum_pi_squared(cfg: TemperConfig) -> bool:
    """Does the actor's old-log-prob pass also compute Σπ² per token? Iff the advantage
    estimator reads it (``actor.calculate_sum_pi_squared`` can only confirm that:
    validation refuses it set against the estimator)."""
    return "sum_pi_squared" in estimator_inputs(cfg.algorithm.adv_estimator)


def rollout_mismatch(batch: Batch) -> dict[str, float]:
    """``rollout/logprob_diff``: the rollout engine's log-probs vs the trainer's recompute."""
    if "rollout_log_probs" not in batch or "old_log_probs" not in batch:
        return {}
    diff = logprob_diff(batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"])
    return {f"rollout/{k}": float(v) for k, v in diff.items()}


def response_metrics(batch: Batch) -> dict[str, float]:
    """Length and truncation of one step's responses (before any loss mask)."""
    lengths = batch["response_mask"].sum(-1).float()
    truncated = [bool(t) for t in batch["truncated"]] if "truncated" in batch else []
    return {
        "response/length_mean": lengths.mean().item(),
        "response/length_max": lengths.max().item(),
        "response/clip_ratio": float(np.mean(truncated)) if truncated else 0.0,
        "perf/samples": float(len(batch)),
    }
