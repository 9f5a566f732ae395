"""The one loop, for every pipeline (DESIGN.md's data flow; slime's ``train.py`` shape).

``train(cfg)`` runs the job: resume, validate, step, checkpoint, stop on a signal, save,
summarize. The step is the pipeline record's (``Pipeline.step``): the RL step
(:func:`temper.pipelines.rl_step.rl_step`: produce a scored batch, log-probs, shaping,
updates, weight sync) for RLVR and agentic runs, SFT's own for SFT; the run around it is
this module's, the same for all.

SIGTERM/SIGINT stop the run after the current step with a checkpoint; the summary then
has ``stopped_by`` (the signal's name) and ``temper train`` exits 128 + signal. The final
validation and export run under the same guard; a rerun of a finished run rewrites a
missing or cut ``final/actor`` from its last checkpoint.
"""

from __future__ import annotations

from typing import Any

from temper.config.derive import Derived
from temper.config.schema import TemperConfig
from temper.pipelines.build import build_run
from temper.pipelines.record import Pipeline
from temper.pipelines.run import Run
from temper.pipelines.signals import Interrupted, StopSignals


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
                    metrics = pipeline.step(run)
                run.record_curve(metrics)
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
            just_validated = exp.test_freq > 0 and run.step % exp.test_freq == 0
            if finished and (exp.test_freq > 0 or exp.val_after_train) and not just_validated:
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
