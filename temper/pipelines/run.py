"""Everything a run holds, for every pipeline: roles, the rollout engine (where the
pipeline generates), the pipeline's producer, shaping state, trackers — and what the
driver does with them besides the step itself: weight sync, checkpoints, validation,
summary. :func:`temper.pipelines.build.build_run` builds it from the config."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from temper.cluster.rollout import StoredWeights
from temper.config.schema import TemperConfig
from temper.data.prompts import is_jinja
from temper.pipelines.checkpointing import Checkpointer, Progress, final_problem, write_final
from temper.pipelines.producer import Producer
from temper.pipelines.run_lock import RunLock
from temper.pipelines.shaping import ShapingSettings, ShapingState
from temper.roles import Roles
from temper.roles.base import RoleEngine
from temper.rollout import RolloutEngine
from temper.tracking import MultiTracker
from temper.training.local_world import release_local_world
from temper.utils.determinism import KernelMode
from temper.utils.model_path import resolve_model_path


def output_dir(cfg: TemperConfig) -> Path:
    exp = cfg.experiment
    return Path(exp.output_dir or f"outputs/{exp.project_name}/{exp.experiment_name}").expanduser()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_tokenizer(cfg: TemperConfig) -> Any:
    """The run's tokenizer; a Jinja ``data.chat_template`` replaces its chat template."""
    from transformers import AutoTokenizer

    path = resolve_model_path(cfg.model.tokenizer_path or cfg.model.path)
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=cfg.model.trust_remote_code)
    if is_jinja(cfg.data.chat_template):
        # the run's one template: prompts, multi-turn continuations, SFT and validation
        # all render through this tokenizer (verl's custom_chat_template)
        tok.chat_template = cfg.data.chat_template
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


@dataclasses.dataclass
class WeightSync:
    """Keeps the rollout engine's weights the actor's: after every
    ``model_update_frequency``-th update, and at once after a checkpoint loads. A
    stateful part: the rollout engine's own state, restored before the push."""

    rollout: RolloutEngine
    actor: RoleEngine
    every: int = 1
    #: the rollout runs ahead of training (async_training): the producer that runs it
    #: (pipelines.ahead) pushes a snapshot before each batch instead
    ahead: bool = False

    def after_update(self, step: int) -> None:
        if not self.ahead and not self.rollout.shared and step % max(1, self.every) == 0:
            self.push()

    def push(self) -> None:
        """The actor's full weights to the rollout engine (a no-op when it shares them)."""
        if not self.rollout.shared:
            self.rollout.load_weights(self.actor.named_weights())

    def snapshot(self) -> Iterable[tuple[str, torch.Tensor]]:
        """The actor's weights as a copy its next update does not change (a remote
        actor's are a copy already: gathered into Ray's object store)."""
        named = self.actor.named_weights()
        if isinstance(named, StoredWeights):
            return named
        return [(name, tensor.detach().clone()) for name, tensor in named]

    def load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load a :meth:`snapshot` into the rollout engine."""
        self.rollout.load_weights(weights)

    def state_dict(self) -> dict[str, Any]:
        return self.rollout.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.rollout.load_state_dict(state)
        self.push()


@dataclasses.dataclass
class Run:
    """A run's long-lived parts and its progress.

    ``rollout`` and ``weights`` are None where the pipeline's step generates nothing
    (its record's ``uses`` lacks ``rollout``); ``curve`` is the per-step metric the
    summary reports first → last (the record's ``curve``)."""

    cfg: TemperConfig
    out_dir: Path
    tokenizer: Any
    roles: Roles
    rollout: RolloutEngine | None
    producer: Producer
    shaping: ShapingSettings
    shaping_state: ShapingState
    tracker: MultiTracker
    total_steps: int
    weights: WeightSync | None
    checkpointer: Checkpointer
    progress: Progress
    curve: str = "train/score_mean"
    resumed_from: Path | None = None
    lock: RunLock | None = None  # the output directory's, released by close()
    #: the process's kernel settings before the run's (experiment.deterministic)
    kernels: KernelMode | None = None
    #: when the last checkpoint was written (or the run built): the recovery cadence's clock
    last_save: float = dataclasses.field(default_factory=time.monotonic)
    #: the newest checkpoint on disk, where a rerun resumes (None: none yet)
    last_checkpoint: Path | None = None

    def __post_init__(self) -> None:
        if self.last_checkpoint is None:
            self.last_checkpoint = self.resumed_from

    @property
    def step(self) -> int:
        return self.progress.step

    @step.setter
    def step(self, value: int) -> None:
        self.progress.step = value

    def sync_weights(self) -> None:
        """Push the actor's weights to the rollout engine after this step's update."""
        if self.weights is not None:
            self.weights.after_update(self.step)

    def record_curve(self, metrics: dict[str, float]) -> None:
        """Keep this step's value of the run's curve for the summary."""
        self.progress.curve.append(metrics[self.curve])

    @contextlib.contextmanager
    def profiling(self) -> Iterator[None]:
        """Run the current step under ``torch.profiler`` when ``experiment.profile_steps``
        lists it; the trace goes to ``<output_dir>/profile/step_<N>.json`` (open it in
        chrome://tracing or Perfetto) and a table to ``step_<N>.txt``: the step's phases
        (``phase/<name>`` ranges) and the operators by their own time."""
        if self.step not in (self.cfg.experiment.profile_steps or []):
            yield
            return
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        with profile(activities=activities, record_shapes=True) as prof:
            yield
        path = self.out_dir / "profile" / f"step_{self.step}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        events = prof.key_averages()
        phases = [e for e in events if e.key.startswith("phase/")]
        table = path.with_suffix(".txt")
        table.write_text(
            f"step {self.step}: phases (total time)\n"
            + "\n".join(f"  {e.key:<28} {e.cpu_time_total / 1e6:9.3f} s" for e in phases)
            + "\n\noperators by own time\n"
            + events.table(sort_by="self_cpu_time_total", row_limit=40)
        )
        print(f"profile: {path}, {table}", flush=True)

    def validate(self, log: bool = True) -> dict[str, float]:
        """Validate now: record it for the summary, print its samples, and (``log``) send
        its metrics to the trackers (else the caller logs them with the step's row)."""
        result = self.producer.validate(self.step)
        self.progress.validations.append((self.step, result.metrics))
        for k, text in enumerate(result.samples):
            print(f"[val step {self.step} #{k}] " + text.replace("\n", "\n    "), flush=True)
            self.tracker.log_text(f"val/generations/{k}", text, self.step)
        if log:
            self.tracker.log(result.metrics, self.step)
        return result.metrics

    def should_save(self, stopping: bool) -> bool:
        """Checkpoint now? Every ``save_freq`` steps, at the last step, on a signal, and
        once ``save_every_minutes`` passed since the last checkpoint."""
        return self._kept_save_due() or stopping or self._recovery_due()

    def _kept_save_due(self) -> bool:
        """A checkpoint the retention keeps: every ``save_freq`` steps and the last step."""
        freq = self.cfg.experiment.save_freq
        return (freq > 0 and self.step % freq == 0) or self.step >= self.total_steps

    def _recovery_due(self) -> bool:
        minutes = self.cfg.experiment.save_every_minutes
        return bool(minutes) and time.monotonic() - self.last_save >= 60 * float(minutes or 0)

    def save_checkpoint(self) -> Path:
        """An atomic, resumable checkpoint of this step (see pipelines.checkpointing).

        One that ``save_freq`` or the last step did not ask for (time-based, or on a
        signal) is a recovery checkpoint: the next checkpoint replaces it, so the
        directory ends with the checkpoints ``save_freq`` and retention say. Saving reads
        the run's state and changes none of it: where the clock puts a save does not
        change the run's numbers.
        """
        recovery = not self._kept_save_due()
        path = self.checkpointer.save(self.step, recovery=recovery)
        self.last_save = time.monotonic()
        self.last_checkpoint = path
        note = ", recovery: the next checkpoint replaces it" if recovery else ""
        print(f"checkpoint: {path} ({self.checkpointer.last_save_s:.1f}s{note})", flush=True)
        return path

    def save_final(self, repair: bool = False) -> None:
        """The trained actor as a Hugging Face directory, ``final/actor`` (loads in
        transformers/vLLM), written whole or not at all (``checkpointing.write_final``).
        ``repair``: only if it is missing or incomplete (a rerun of a finished run)."""
        if repair:
            problem = final_problem(self.out_dir)
            if problem is None:
                return
            where = self.out_dir / "final" / "actor"
            print(f"final: {where} is {problem}; writing it from {self.resumed_from}", flush=True)
        engine = self.roles.actor.engine
        write_final(self.out_dir, self.step, engine, self.tokenizer, self.resumed_from)

    def summary(self, stopped_by: str | None = None) -> dict[str, Any]:
        """The run's summary: steps, the curve's history (``curve``: the metric's name;
        its values, first/last, and the mean of the first/last 5 steps), validations and
        the producer's headline before/after."""
        values = self.progress.curve
        k = min(5, len(values)) or 1
        nan = float("nan")
        out: dict[str, Any] = {
            "steps": self.step,
            "output_dir": str(self.out_dir),
            "stopped_by": stopped_by,
            "curve": self.curve,
            "curve_values": list(values),
            "curve_first": values[0] if values else nan,
            "curve_last": values[-1] if values else nan,
            "curve_first5": float(np.mean(values[:k])) if values else nan,
            "curve_last5": float(np.mean(values[-k:])) if values else nan,
            "val": [m for _, m in self.progress.validations],
            "val_steps": [step for step, _ in self.progress.validations],
        }
        out.update(val_summary(self.progress.validations, self.producer.headline)[0])
        return out

    def closing_line(self, summary: dict[str, Any]) -> str:
        stopped = summary["stopped_by"]
        text = val_summary(self.progress.validations, self.producer.headline)[1]
        return (
            f"{'stopped by ' + stopped if stopped else 'done'}: {summary['steps']} steps; "
            f"{summary['curve']} first {summary['curve_first']:.3f} → last "
            f"{summary['curve_last']:.3f} (mean of first/last 5 steps: "
            f"{summary['curve_first5']:.3f} → {summary['curve_last5']:.3f})"
            + (f"; {text}" if text else "")
            + f"; outputs in {summary['output_dir']}"
        )

    def close(self) -> None:
        try:
            self.producer.close()
            if self.rollout is not None:
                self.rollout.close()
            self.tracker.close()
            self.roles.shutdown()
            release_local_world()  # the one-rank world an in-process engine made, if any
        finally:
            if self.kernels is not None:  # process-wide: a later run in this process decides
                self.kernels.restore()
            if self.lock is not None:  # last: the directory is the next run's once closed
                self.lock.release()


def val_summary(
    history: list[tuple[int, dict[str, float]]], key: str
) -> tuple[dict[str, float], str]:
    """Summary keys and the closing line's text for validations ``(step, metrics)``.

    ``val_first`` / ``val_last``: ``key`` (the producer's headline) of the first and last
    validation; ``val_before``: of the one at step 0 (``val_before_train``), ``val_after``:
    of the last one after ≥ 1 step. The text says "before → after" only when both exist,
    so a run that validated only before training does not report its one measurement as
    a before/after pair.
    """
    rate = {step: m[key] for step, m in history if key in m}
    if not rate:
        return {}, ""
    steps = [step for step, _ in history if step in rate]
    out = {"val_first": rate[steps[0]], "val_last": rate[steps[-1]]}
    before = rate.get(0)
    after_step = max(steps)
    if before is not None:
        out["val_before"] = before
    if after_step > 0:
        out["val_after"] = rate[after_step]
    after = f"{rate[after_step]:.3f} after {after_step} steps" if after_step > 0 else ""
    if before is not None and after:
        text = f"{key} {before:.3f} before training → {after}"
    elif before is not None:
        text = f"{key} {before:.3f} before training (no validation after it)"
    else:
        text = f"{key} {out['val_first']:.3f} → {after}"
    return out, text
