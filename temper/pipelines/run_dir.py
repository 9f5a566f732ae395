"""A run's directory: one run at a time in it, and nothing in it replaced by surprise.

Starting a run in a directory that already holds one can mean two things: going on
with it (``experiment.resume_mode: auto`` finds its newest valid checkpoint), or
starting over — which replaces its checkpoints (step N is written again) and its
``metrics.jsonl`` rows. Starting over is never silent here:

- :func:`claim_run_dir` (``temper train``, before anything is written) locks the
  directories (:mod:`temper.pipelines.run_lock`), decides where the run starts, and
  refuses a start that would not continue the run the directory holds — resume
  disabled, no valid checkpoint left, or a ``resume_from_path`` of another run — unless
  ``experiment.overwrite`` is set, which moves that run's files to
  ``<dir>.old-<time>`` first: nothing is deleted.
- :func:`check_run_dir` says the same at the pre-flight (``temper check``), and notes a
  directory a live run holds instead of refusing (checking while a run trains is fine).

What counts as a previous run: a ``global_step_*`` checkpoint directory (valid or not:
checkpoints are not read here — ``auto``'s search already says none is valid when it
finds none), a ``metrics.jsonl`` with rows, a non-empty ``final/``. Files this start never rewrites
(tensorboard events, dumps) are moved aside with them but do not refuse a start.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from temper.checkpoint import list_checkpoints
from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.pipelines.checkpointing import (
    NoUsableCheckpoint,
    checkpoint_root,
    find_resume_checkpoint,
)
from temper.pipelines.run_lock import LOCK_NAME, DirLocked, RunLock, lock_dirs, probe

METRICS = "metrics.jsonl"
FINAL = "final"


@dataclasses.dataclass(frozen=True)
class RunDirs:
    """The directories a run writes and locks: ``output`` and, when it lies outside it,
    the checkpoint root (``experiment.checkpoint_dir``)."""

    output: Path
    checkpoints: Path

    @property
    def roots(self) -> list[Path]:
        """The directories to lock and move aside (one, unless checkpoints lie outside)."""
        if _inside(self.checkpoints, self.output):
            return [self.output]
        return [self.output, self.checkpoints]

    def key(self, directory: Path) -> str:
        return "experiment.output_dir" if directory == self.output else "experiment.checkpoint_dir"


def run_dirs(cfg: TemperConfig, out: Path) -> RunDirs:
    return RunDirs(out, checkpoint_root(cfg, out))


def _inside(path: Path, parent: Path) -> bool:
    return path.resolve().is_relative_to(parent.resolve())


@dataclasses.dataclass(frozen=True)
class PreviousRun:
    """What a run directory holds of an earlier run."""

    checkpoints: list[Path]  # global_step_* directories, oldest first
    metric_steps: list[int]  # the steps of metrics.jsonl's rows, in file order
    final: Path | None
    none_valid: bool = False  # the resume search found none of the checkpoints valid
    reasons: str = ""  # why each is not (the resume search's words), when it said

    def __bool__(self) -> bool:
        return bool(self.checkpoints or self.metric_steps or self.final)

    def __str__(self) -> str:
        parts = []
        if self.checkpoints:
            names = [p.name for p in self.checkpoints]
            shown = ", ".join(names) if len(names) <= 3 else f"{names[0]} … {names[-1]}"
            state = "; none valid" if self.none_valid else ""
            count = f"{len(names)} checkpoint" + ("s" if len(names) > 1 else "")
            parts.append(f"{count} ({shown}{state})")
        if self.metric_steps:
            first, last = min(self.metric_steps), max(self.metric_steps)
            steps = f"step {first}" if first == last else f"steps {first}–{last}"
            parts.append(f"{METRICS} with {steps}")
        if self.final is not None:
            parts.append(f"{FINAL}/")
        return ", ".join(parts)


def _metric_steps(path: Path) -> list[int]:
    steps = []
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a crash mid-write
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            steps.append(row["step"])
    return steps


def previous_run(dirs: RunDirs, none_valid: bool = False) -> PreviousRun:
    """What ``dirs`` hold of a run (empty when nothing); ``none_valid``: the resume
    search found none of its checkpoints valid."""
    final = dirs.output / FINAL
    return PreviousRun(
        checkpoints=[p for _s, p in list_checkpoints(dirs.checkpoints)],
        metric_steps=_metric_steps(dirs.output / METRICS),
        final=final if final.is_dir() and any(final.iterdir()) else None,
        none_valid=none_valid,
    )


def continues(dirs: RunDirs, resume_from: Path | None) -> bool:
    """Whether a start from ``resume_from`` goes on with the run ``dirs`` hold (it is one
    of their own checkpoints) rather than starting over in them."""
    return resume_from is not None and _inside(resume_from, dirs.checkpoints)


def replaced_run(cfg: TemperConfig, dirs: RunDirs, resume_from: Path | None) -> PreviousRun | None:
    """The run in ``dirs`` that a start from ``resume_from`` would replace, if any."""
    if continues(dirs, resume_from):
        return None
    found = previous_run(dirs, none_valid=cfg.experiment.resume_mode == "auto")
    return found if found else None


def aside_name(directory: Path, stamp: str | None = None) -> Path:
    """``<directory>.old-<time>``: where :func:`move_aside` puts a replaced run."""
    stamp = stamp or time.strftime("%Y%m%d-%H%M%S")
    target = directory.with_name(f"{directory.name}.old-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = directory.with_name(f"{directory.name}.old-{stamp}-{n}")
    return target


def refusal(
    cfg: TemperConfig, dirs: RunDirs, found: PreviousRun, resume_from: Path | None
) -> ConfigError:
    """The one-line refusal of a start that would replace ``found``."""
    exp = cfg.experiment
    roots = dirs.roots
    held = " and ".join(map(str, roots)) + (" hold" if len(roots) > 1 else " holds")
    held += f" a previous run ({found})"
    aside = " and ".join(f"{d}.old-<time>" for d in roots)
    overwrite = f"start over with experiment.overwrite=true (moves it to {aside})"
    elsewhere = "choose another experiment.output_dir"
    if exp.resume_mode == "disable":
        fix = ", ".join(
            (["continue it with experiment.resume_mode=auto"] if found.checkpoints else [])
            + [elsewhere, f"or {overwrite}"]
        )
        return ConfigError(
            "experiment.resume_mode", f"{held}, and this start would begin again at step 0", fix
        )
    if resume_from is not None:  # a resume_from_path of another run
        return ConfigError(
            "experiment.resume_from_path",
            f"{held}, and this run would continue {resume_from} (another run's checkpoint) over it",
            f"{elsewhere}, or {overwrite}",
        )
    detail = found.reasons or "each lacks its manifest.json or has a damaged file"
    why = (
        f"none of its checkpoints is valid ({detail})"
        if found.checkpoints
        else "it saved no checkpoint"
    )
    return ConfigError(
        "experiment.output_dir",
        f"{held}; {why}, so this start would begin again at step 0 over it",
        f"{elsewhere}, or {overwrite}",
    )


def move_aside(dirs: RunDirs) -> list[tuple[Path, Path]]:
    """Move everything in ``dirs`` (the lock file excepted) to ``<dir>.old-<time>``;
    returns ``(directory, where its files went)``. Renames only: nothing is copied or
    deleted."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    plan = []
    for directory in dirs.roots:  # listed before any move: no aside dir is moved again
        if not directory.is_dir():
            continue
        # a checkpoint_dir above the output dir keeps the output dir (moved on its own)
        children = [
            c
            for c in directory.iterdir()
            if c.name != LOCK_NAME and not any(_inside(r, c) for r in dirs.roots)
        ]
        if children:
            plan.append((directory, children))
    moved = []
    for directory, children in plan:
        target = aside_name(directory, stamp)
        target.mkdir(parents=True)
        for child in children:
            try:
                os.rename(child, target / child.name)
            except OSError as err:
                raise ConfigError(
                    "experiment.overwrite",
                    f"cannot move {child} to {target} ({err.strerror}); "
                    f"what was moved so far is in {target}",
                    "move the previous run away by hand, or choose another experiment.output_dir",
                ) from err
        moved.append((directory, target))
    return moved


def _locked_error(dirs: RunDirs, err: DirLocked) -> ConfigError:
    pid = err.holder.pid
    stop = f"stop it (kill -TERM {pid} saves a checkpoint and exits), " if pid else ""
    return ConfigError(
        dirs.key(err.directory),
        f"{err.directory} is in use by another temper run ({err.holder})",
        f"wait for that run to end, {stop}or choose another experiment.output_dir",
    )


def start_line(cfg: TemperConfig, dirs: RunDirs) -> str:
    """What a run that starts at step 0 says (a resumed run says where it resumed)."""
    if cfg.experiment.resume_mode == "disable":
        why = "resume disabled (experiment.resume_mode=disable)"
    else:
        why = f"no checkpoint found in {dirs.checkpoints}"
    return f"{why}: starting at step 0; outputs in {dirs.output}"


def claim_run_dir(cfg: TemperConfig, out: Path) -> tuple[RunLock, Path | None]:
    """Lock the run's directories and decide where it starts, before anything is
    written: the checkpoint it resumes from (None: step 0). A start that would replace
    a previous run is refused, or — with ``experiment.overwrite`` — that run is moved
    aside first. The caller releases the lock when the run ends."""
    dirs = run_dirs(cfg, out)
    try:
        lock = lock_dirs(dirs.roots)
    except DirLocked as err:
        raise _locked_error(dirs, err) from None
    try:
        resume_from = resume_point(cfg, out, verify=True)
        found = replaced_run(cfg, dirs, resume_from)
        if found is not None:
            if not cfg.experiment.overwrite:
                raise refusal(cfg, dirs, found, resume_from)
            moved = move_aside(dirs)
            where = ", ".join(f"{directory} to {target}" for directory, target in moved)
            print(f"experiment.overwrite: moved the previous run ({found}): {where}", flush=True)
        if resume_from is None:
            print(start_line(cfg, dirs), flush=True)
    except BaseException:
        lock.release()
        raise
    return lock, resume_from


def resume_point(cfg: TemperConfig, out: Path, verify: bool) -> Path | None:
    """Where the run resumes (``find_resume_checkpoint``; ``verify``: checksums too, each
    damaged checkpoint passed over said on stderr) — None when it starts at step 0,
    which includes checkpoints none of which is usable under ``experiment.overwrite``
    (they are then moved aside with the rest of the run)."""
    damaged: list[str] = []
    try:
        resume_from = find_resume_checkpoint(cfg, out, verify=verify, warnings=damaged)
    except NoUsableCheckpoint as err:
        dirs = run_dirs(cfg, out)
        if err.key == "experiment.resume_from_path":  # another directory: not this run's
            raise
        if not cfg.experiment.overwrite:  # the refusal of a start over this run
            found = dataclasses.replace(previous_run(dirs, none_valid=True), reasons=err.reasons)
            raise refusal(cfg, dirs, found, None) from None
        return None
    for line in damaged:
        print(line, file=sys.stderr, flush=True)
    return resume_from


def check_run_dir(cfg: TemperConfig, out: Path, resume_from: Path | None, notes: list[str]) -> None:
    """The pre-flight's part: a directory a live run holds is noted (``train`` would
    stop at once; checking meanwhile is fine); a start that would replace a previous run
    is refused as ``train`` would refuse it, or noted with ``experiment.overwrite``."""
    dirs = run_dirs(cfg, out)
    for directory in dirs.roots:
        holder = probe(directory)
        if holder is not None:
            notes.append(
                f"{dirs.key(directory)}: {directory} is in use by a running temper run "
                f"({holder}); temper train into it stops at once while that run lives"
            )
            return  # what it holds is changing under that run: nothing more to say
    found = replaced_run(cfg, dirs, resume_from)
    if found is None:
        return
    if not cfg.experiment.overwrite:
        raise refusal(cfg, dirs, found, resume_from)
    notes.append(
        f"experiment.overwrite: the previous run in {dirs.output} ({found}) will be moved "
        f"to {dirs.output}.old-<time> before this one starts"
    )
