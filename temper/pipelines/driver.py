"""The one RL loop, for every pipeline (DESIGN.md's data flow; slime's ``train.py`` shape).

``train(cfg)`` runs the job: resume, validate, step, checkpoint, stop on a signal, save,
summarize. ``rl_step`` is one step, each phase a named call: the pipeline's producer
turns the step's inputs into a scored batch (RLVR: prompts → responses → rewards;
agentic: env resets → episodes → returns), then old log-probs, reference log-probs,
values, shaping and advantages, the updates and the weight sync are the same for all.

SIGTERM/SIGINT stop the run after the current step with a checkpoint; the summary then
has ``stopped_by`` (the signal's name) and ``temper train`` exits 128 + signal. The final
validation and export run under the same guard; a rerun of a finished run rewrites a
missing or cut ``final/actor`` from its last checkpoint.
"""

from __future__ import annotations

from typing import Any

from temper.algorithms import kl_estimator_needs_logits
from temper.algorithms.rollout_correction import logprob_diff
from temper.config.derive import Derived
from temper.config.schema import TemperConfig
from temper.data.batch import Batch
from temper.pipelines.dumps import dump_generations
from temper.pipelines.producer import Pipeline
from temper.pipelines.run import Run, build_run, response_metrics, throughput
from temper.pipelines.shaping import compute_experience
from temper.pipelines.signals import Interrupted, StopSignals
from temper.pipelines.timing import Timer


def rl_step(run: Run) -> dict[str, float]:
    """One RL step; returns its metrics."""
    cfg, roles, t = run.cfg, run.roles, Timer()
    with t("step"):
        batch, metrics = run.producer.produce(run.step, t)  # scored; timings rollout, reward
        metrics.update(response_metrics(batch))
        tokens = batch["prompt_mask"].sum().item() + batch["response_mask"].sum().item()
        if needs_actor_forward(cfg, batch):
            with t("old_log_probs"):
                batch = roles.actor.compute_log_probs(batch)  # entropy: from the update
            metrics.update(rollout_mismatch(batch))
        else:  # on-policy single update: the sampling log-probs are the old ones
            batch["old_log_probs"] = batch["rollout_log_probs"]
        if roles.reference is not None:
            with t("ref"):
                batch = roles.reference.compute_ref_log_probs(batch)
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


def train(cfg: TemperConfig, pipeline: Pipeline, plan: Derived) -> dict[str, Any]:
    """Train with ``cfg`` (resuming per ``experiment.resume_mode``); returns the summary."""
    run = build_run(cfg, pipeline, plan)
    exp, start = cfg.experiment, run.step
    try:
        with StopSignals(exp.save_on_signal) as stop:
            if run.step == 0 and (exp.val_before_train or exp.val_only):
                run.validate()
            if not exp.val_only and run.step >= run.total_steps:
                print(
                    f"nothing to do: {run.resumed_from} already reached step {run.step} of "
                    f"{run.total_steps} (raise experiment.max_steps to go on; a new run "
                    "goes in another experiment.output_dir)"
                )
            while not exp.val_only and run.step < run.total_steps:
                run.step += 1
                with run.profiling():  # experiment.profile_steps
                    metrics = rl_step(run)
                run.progress.rewards.append(metrics["train/score_mean"])
                if exp.test_freq > 0 and run.step % exp.test_freq == 0:
                    metrics.update(run.validate(log=False))
                run.tracker.log(metrics, run.step)
                stopping = stop.received is not None  # read once: save iff we stop
                if run.should_save(stopping):
                    run.save_checkpoint()
                if stopping:
                    break
            # inside the guard: a signal here lets the validation or export in hand
            # finish (the export is written whole or not at all) and stops after it
            finished = stop.received is None and run.step > start  # trained to the end
            if finished and exp.test_freq > 0 and run.step % exp.test_freq:
                run.validate()
            if stop.received is None and not exp.val_only and run.step >= run.total_steps:
                run.save_final(repair=not finished)  # a finished run's rerun: if cut or lost
    except KeyboardInterrupt as err:  # a second SIGINT, or one with save_on_signal off
        raise Interrupted(interrupted_line(run, err)) from None
    finally:
        run.close()
    summary = run.summary(stop.name)
    print(run.closing_line(summary), flush=True)
    return summary


def interrupted_line(run: Run, err: KeyboardInterrupt) -> str:
    """What stopped the run at once, in which step, and where the same command resumes."""
    what = str(err) if isinstance(err, Interrupted) and str(err) else "SIGINT"
    saved = (
        f"the same command resumes from {run.last_checkpoint}"
        if run.last_checkpoint is not None
        else "no checkpoint was saved yet"
    )
    return f"{what} stopped the run at once at step {run.step}; {saved}"


def needs_actor_forward(cfg: TemperConfig, batch: Batch) -> bool:
    """Recompute old log-probs with the trainer? Yes unless ``recompute_old_log_prob`` is
    off and the engine returned sampling log-probs — and always for the exact KL in the
    reward, which needs the actor's distribution over the vocabulary."""
    full_kl = cfg.algorithm.use_kl_in_reward and kl_estimator_needs_logits(cfg.algorithm.kl_penalty)
    return cfg.actor.recompute_old_log_prob or "rollout_log_probs" not in batch or full_kl


def rollout_mismatch(batch: Batch) -> dict[str, float]:
    """``rollout/logprob_diff``: the rollout engine's log-probs vs the trainer's recompute."""
    if "rollout_log_probs" not in batch or "old_log_probs" not in batch:
        return {}
    diff = logprob_diff(batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"])
    return {f"rollout/{k}": float(v) for k, v in diff.items()}
