"""Metric sinks: console (progress + compact table), jsonl (always), tensorboard, wandb,
mlflow, swanlab, trackio.

``build_trackers`` turns ``experiment.trackers`` into one ``MultiTracker``. Every sink
gets the same ``log(metrics, step)`` calls; the jsonl file is the run's record. The
sinks' names are the :data:`TRACKERS` registry's, which the config checks at load.

``experiment.logging_steps`` (ROLL ``logging_steps``; verl logs every step) thins what
the *viewing* sinks get — every sink but jsonl sees every N-th step, plus any row
with validation metrics and the run's last step (see :func:`should_log`). jsonl always
gets every step: resume, ``temper report`` and the run summary read it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from temper.config.errors import ConfigError, unknown_name
from temper.registry import Registry

# the sink modules import their library only when a sink is built: their args
# dataclasses, which the checks read, come without it
from temper.tracking.mlflow_sink import MlflowArgs
from temper.tracking.swanlab_sink import SwanlabArgs
from temper.tracking.trackio_sink import TrackioArgs


class Tracker(Protocol):
    """A metric sink. Every sink takes text too (validation generations, tagged like a
    metric): one that cannot show text (console, jsonl) takes it as a no-op."""

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_text(self, tag: str, text: str, step: int) -> None: ...

    def close(self) -> None: ...


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5):
            return f"{value:.3e}"
        return f"{value:.4f}"
    return str(value)


def should_log(
    metrics: Mapping[str, Any], step: int, every: int, total_steps: int | None = None
) -> bool:
    """Whether a ``logging_steps``-throttled sink gets this step's row.

    Yes when ``step % every == 0`` (step 0, validation before training, included), when
    the row has validation metrics (``val/…``: they are rare and must not be dropped),
    or at ``total_steps`` (the curves end where the run ends).
    """
    return (
        every <= 1
        or step % every == 0
        or (total_steps is not None and step == total_steps)
        or any(k.startswith("val/") for k in metrics)
    )


class EveryNSteps:
    """A sink that sees only the rows :func:`should_log` lets through; text (validation
    generations, logged at validation steps) always passes."""

    def __init__(self, tracker: Tracker, every: int, total_steps: int | None = None) -> None:
        self.tracker = tracker
        self.every = max(1, every)
        self.total_steps = total_steps

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if should_log(metrics, step, self.every, self.total_steps):
            self.tracker.log(metrics, step)

    def log_text(self, tag: str, text: str, step: int) -> None:
        self.tracker.log_text(tag, text, step)

    def close(self) -> None:
        self.tracker.close()


class ConsoleTracker:
    """One line per logged step: progress, ETA and the headline metrics."""

    HEADLINE = (
        "train/reward_mean",
        "train/score_mean",
        "val/reward_mean",
        "train/loss",  # supervised runs (SFT)
        "val/loss",
        "response/length_mean",
        "actor/pg_loss",
        "actor/kl",
        "actor/entropy",
        "actor/grad_norm",
        "critic/value_loss",
        "timing/step_s",
    )

    def __init__(self, total_steps: int | None = None, stream=None) -> None:
        self.total = total_steps
        self.stream = stream or sys.stdout
        self.start = time.monotonic()
        self.first_step: int | None = None

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        if self.first_step is None:
            self.first_step = step - 1
        parts = [f"step {step}" + (f"/{self.total}" if self.total else "")]
        if self.total:
            done = step - self.first_step
            elapsed = time.monotonic() - self.start
            left = (self.total - step) * elapsed / max(done, 1)
            parts.append(f"{100 * step / self.total:3.0f}% eta {_duration(left)}")
        for key in self.HEADLINE:
            if key in metrics:
                # train and val both have a reward_mean: only val keeps its prefix
                name = key.replace("/", "_") if key.startswith("val/") else key.split("/", 1)[1]
                parts.append(f"{name}={_fmt(metrics[key])}")
        print(" | ".join(parts), file=self.stream, flush=True)

    def log_text(self, tag: str, text: str, step: int) -> None:
        """Nothing: a generation's text would break the one-line-per-step progress."""

    def close(self) -> None:
        pass


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class JsonlTracker:
    """Appends ``{"step": n, **metrics}`` to ``<output_dir>/metrics.jsonl``.

    Rows of steps ≥ ``start_step`` already in the file are dropped on open, and said so:
    a run resumed after step k keeps rows ≤ k once (the steps after its checkpoint are
    logged again). A fresh run (start 0) finds no file: the run directory refuses a
    start over a previous run's record (``temper.pipelines.run_dir``).
    """

    def __init__(self, output_dir: str | Path, start_step: int = 0) -> None:
        self.path = Path(output_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept: list[str] = []
        dropped: list[int] = []  # their steps
        if self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    step = json.loads(line).get("step", 0)
                except json.JSONDecodeError:
                    continue  # a line cut by a crash mid-write
                if step < start_step:
                    kept.append(line)
                else:
                    dropped.append(step)
        if dropped:
            print(
                f"{self.path}: dropped {len(dropped)} rows of steps {min(dropped)}–"
                f"{max(dropped)} (logged after the checkpoint this run starts from; they "
                "are logged again)",
                flush=True,
            )
        # written aside and renamed: a Ctrl-C (or a kill) while the kept rows are written
        # must not leave the record cut short
        fresh = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        fresh.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")
        os.replace(fresh, self.path)
        self.file = self.path.open("a", encoding="utf-8")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        row = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()

    def log_text(self, tag: str, text: str, step: int) -> None:
        """Nothing: the file is one row of metrics per step (resume and ``temper report``
        read it); ``experiment.validation_data_dir`` keeps generations as files."""

    def close(self) -> None:
        self.file.close()


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if hasattr(v, "item"):
        return v.item()
    return v


class TensorboardTracker:
    """Scalars to TensorBoard event files under ``log_dir`` (default <output>/tensorboard).

    On resume (``start_step`` > 0) events of steps ≥ start_step left by the interrupted
    run are purged, so the curves show each step once.
    """

    def __init__(
        self, output_dir: str | Path, log_dir: str | None = None, start_step: int = 0, **_: Any
    ) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:  # tensorboard package missing
            raise ImportError(
                "experiment.trackers has 'tensorboard' but the tensorboard package is missing; "
                "install it with: pip install 'temper-rl[tracking]'"
            ) from err
        self.writer = SummaryWriter(
            log_dir=log_dir or str(Path(output_dir) / "tensorboard"),
            purge_step=start_step if start_step > 0 else None,
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for key, value in metrics.items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def log_text(self, tag: str, text: str, step: int) -> None:
        self.writer.add_text(tag, text, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """Weights & Biases; set ``mode: offline`` in tracker_kwargs without a network.

    The run id is kept in ``<output_dir>/wandb_run_id``: a resumed run (``start_step`` >
    0) continues the same W&B run instead of starting a second one.
    """

    def __init__(
        self, output_dir: str | Path, project: str, name: str, start_step: int = 0, **kwargs: Any
    ) -> None:
        try:
            import wandb
        except ImportError as err:
            raise ImportError(
                "experiment.trackers has 'wandb' but the wandb package is missing; "
                "install it with: pip install 'temper-rl[tracking]'"
            ) from err
        kwargs.setdefault("dir", str(output_dir))
        kwargs.setdefault("project", project)
        kwargs.setdefault("name", name)
        id_file = Path(output_dir) / "wandb_run_id"
        if start_step > 0 and id_file.is_file() and "id" not in kwargs:
            kwargs["id"] = id_file.read_text(encoding="utf-8").strip()
            kwargs.setdefault("resume", "allow")
        self.run = wandb.init(**kwargs)
        id_file.write_text(self.run.id, encoding="utf-8")

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.run.log(dict(metrics), step=step)

    def log_text(self, tag: str, text: str, step: int) -> None:
        import wandb

        self.run.log({tag: wandb.Html(f"<pre>{_escape(text)}</pre>")}, step=step)

    def close(self) -> None:
        self.run.finish()


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class MultiTracker:
    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = trackers

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for t in self.trackers:
            t.log(metrics, step)

    def log_text(self, tag: str, text: str, step: int) -> None:
        """Text (e.g. validation generations) to every sink; those that cannot show text
        ignore it."""
        for t in self.trackers:
            t.log_text(tag, text, step)

    def close(self) -> None:
        for t in self.trackers:
            t.close()


@dataclasses.dataclass(frozen=True)
class TrackerSpec:
    """A registered tracker: how it is built, and what it needs — declared here, checked
    by ``temper check`` (:func:`check_trackers`) before a run starts.

    ``build(output_dir, *, args, kwargs, project, name, total_steps, every, start_step)``
    makes the sink. ``package`` is the module it imports and ``install`` what to install
    when that module is missing. ``args`` is the dataclass of the ``tracker_kwargs`` it
    reads (checked: an unknown key is refused); None where it reads none, or where it
    takes them unchecked (``unchecked_kwargs``: wandb hands them to ``wandb.init``,
    tensorboard reads ``log_dir`` and ignores the rest).
    """

    build: Callable[..., Tracker]
    package: str | None = None
    install: str = ""
    args: type | None = None
    unchecked_kwargs: bool = False


def _tensorboard(output_dir, kwargs=None, start_step=0, **_: Any) -> Tracker:
    return TensorboardTracker(output_dir, start_step=start_step, **_section(kwargs, "tensorboard"))


def _wandb(output_dir, kwargs=None, project="temper", name="run", start_step=0, **_) -> Tracker:
    return WandbTracker(output_dir, project, name, start_step, **_section(kwargs, "wandb"))


def _mlflow(output_dir, args, project="temper", name="run", start_step=0, **_: Any) -> Tracker:
    from temper.tracking.mlflow_sink import MlflowTracker

    return MlflowTracker(output_dir, project, name, args, start_step)


def _swanlab(output_dir, args, project="temper", name="run", start_step=0, **_: Any) -> Tracker:
    from temper.tracking.swanlab_sink import SwanlabTracker

    return SwanlabTracker(output_dir, project, name, args, start_step)


def _trackio(output_dir, args, project="temper", name="run", start_step=0, **_: Any) -> Tracker:
    from temper.tracking.trackio_sink import TrackioTracker

    return TrackioTracker(output_dir, project, name, args, start_step)


#: what the tracking extra installs (pyproject.toml)
_TRACKING = "pip install 'temper-rl[tracking]'"

#: Metric sinks by ``experiment.trackers`` name.
TRACKERS: Registry[TrackerSpec] = Registry("tracker")
TRACKERS.add(
    "console",
    TrackerSpec(lambda output_dir, total_steps=None, **_: ConsoleTracker(total_steps)),
)
TRACKERS.add(
    "jsonl",
    TrackerSpec(lambda output_dir, start_step=0, **_: JsonlTracker(output_dir, start_step)),
)
TRACKERS.add(
    "tensorboard",
    TrackerSpec(_tensorboard, "tensorboard", _TRACKING, unchecked_kwargs=True),
)
TRACKERS.add("wandb", TrackerSpec(_wandb, "wandb", _TRACKING, unchecked_kwargs=True))
TRACKERS.add("mlflow", TrackerSpec(_mlflow, "mlflow", _TRACKING, MlflowArgs))
# not in the tracking extra: swanlab pins protobuf<7, and protobuf 6 cannot load modules
# generated for protobuf 7 (sentencepiece's, which transformers imports)
TRACKERS.add(
    "swanlab",
    TrackerSpec(_swanlab, "swanlab", "pip install 'temper-rl[swanlab]'", SwanlabArgs),
)
TRACKERS.add("trackio", TrackerSpec(_trackio, "trackio", _TRACKING, TrackioArgs))


def _section(kwargs: dict[str, Any] | None, name: str) -> dict[str, Any]:
    """A tracker's own arguments: ``tracker_kwargs.<name>`` if given (ROLL nests them per
    tracker), else the flat ``tracker_kwargs`` minus other trackers' sections."""
    kwargs = dict(kwargs or {})
    if isinstance(kwargs.get(name), dict):
        return dict(kwargs[name])
    return {k: v for k, v in kwargs.items() if k not in TRACKERS}


def tracker_args(name: str, names: list[str], kwargs: dict[str, Any] | None) -> Any:
    """The ``args`` dataclass of tracker ``name`` (one of ``names``, the run's trackers)
    from ``tracker_kwargs``, or None where it declares none.

    ``tracker_kwargs.<name>`` is its own: a key it does not read is refused. Flat
    ``tracker_kwargs`` are shared by the run's trackers: each takes the keys it reads; a
    key that none of them reads is refused, unless one of them takes keys unchecked
    (wandb, tensorboard).
    """
    spec = TRACKERS.get(name)
    if spec.args is None:
        return None
    fields = {f.name for f in dataclasses.fields(spec.args)}
    kwargs = dict(kwargs or {})
    if isinstance(kwargs.get(name), dict):
        own, where = dict(kwargs[name]), f"experiment.tracker_kwargs.{name}"
        unread = sorted(set(own) - fields)
    else:
        flat = {k: v for k, v in kwargs.items() if k not in TRACKERS}
        own, where = {k: v for k, v in flat.items() if k in fields}, "experiment.tracker_kwargs"
        specs = [TRACKERS.get(n) for n in names if n in TRACKERS]
        read: set[str] = set()
        for other in specs:
            if other.args is not None:
                read |= {f.name for f in dataclasses.fields(other.args)}
        open_ = any(other.unchecked_kwargs for other in specs)
        unread = [] if open_ else sorted(set(flat) - read)
    if unread:
        raise ConfigError(
            f"{where}.{unread[0]}",
            f"the {name} tracker does not read it (it reads: {', '.join(sorted(fields))})",
            "remove it",
        )
    return spec.args(**own)


def check_trackers(names: list[str], kwargs: dict[str, Any] | None) -> None:
    """Each tracker of ``names`` can be built here: its package is installed and its
    ``tracker_kwargs`` are ones it reads (what ``temper check`` and ``train`` refuse
    before a model loads)."""
    for n in names:
        if n not in TRACKERS:
            raise unknown_name("experiment.trackers", n, TRACKERS.names())
        spec = TRACKERS.get(n)
        if spec.package is not None and importlib.util.find_spec(spec.package) is None:
            raise ConfigError(
                "experiment.trackers",
                f"'{n}' needs the {spec.package} package, which is not installed",
                spec.install,
            )
        tracker_args(n, names, kwargs)


def build_trackers(
    names: list[str],
    output_dir: str | Path,
    *,
    total_steps: int | None = None,
    every: int = 1,
    kwargs: dict[str, Any] | None = None,
    project: str = "temper",
    name: str = "run",
    start_step: int = 0,
) -> MultiTracker:
    """Trackers for ``names`` (jsonl is always included: it is the run's record).

    ``every`` is ``experiment.logging_steps``: every sink but jsonl gets every N-th step
    (and validation rows and the last step, :func:`should_log`); jsonl gets every step.
    ``start_step`` > 0 marks a resumed run: the first step it will log. jsonl drops and
    tensorboard purges what the interrupted run logged from that step on, so each step
    appears once there; wandb, mlflow, swanlab and trackio continue the interrupted run,
    and the last three append: a step logged again after the checkpoint is in their
    history twice.
    """
    wanted = list(dict.fromkeys([*names, "jsonl"]))
    check_trackers(wanted, kwargs)
    sinks: list[Tracker] = []
    for n in wanted:
        sink = TRACKERS.get(n).build(
            output_dir,
            args=tracker_args(n, wanted, kwargs),
            total_steps=total_steps,
            every=every,
            kwargs=kwargs,
            project=project,
            name=name,
            start_step=start_step,
        )
        if n != "jsonl" and every > 1:  # jsonl is the record: every step
            sink = EveryNSteps(sink, every, total_steps)
        sinks.append(sink)
    return MultiTracker(sinks)
