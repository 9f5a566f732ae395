"""Hostile run directories (issue 29): one run per output directory, and nothing in it
replaced by surprise.

- A second run into a directory a live run holds stops at once, in one line naming the
  holder; a SIGKILLed holder (or its forked child) leaves no stale lock; ``temper check``
  only notes a held directory.
- A start that would not continue the run a directory holds — no valid checkpoint
  (manifests deleted), ``resume_mode: disable``, ROLL's ``resume_from_checkpoint: false``,
  a ``metrics.jsonl`` of a run killed before its first save, another run's
  ``resume_from_path`` — is refused by ``check`` and ``train`` alike, in one line listing
  what is there and the ways on; nothing on disk changes. ``experiment.overwrite``
  (``--overwrite``) moves the previous run to ``<dir>.old-<time>``; nothing is deleted.
- A fresh start says so; the "nothing to do" message suggests nothing destructive.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from temper.checkpoint import write_checkpoint
from temper.cli.main import main
from temper.pipelines.catalog import build_config
from temper.pipelines.run_dir import claim_run_dir
from temper.pipelines.run_lock import LOCK_NAME, lock_dirs, probe

ROOT = Path(__file__).resolve().parents[2]
TASK = "task:arithmetic?n=16&seed=3"

#: A process that holds a directory's lock (as ``temper train`` does) until killed;
#: with ``fork``, it first forks a child that sleeps on (sharing the lock's descriptor).
HOLDER = """
import os, sys, time
from pathlib import Path
from temper.pipelines.run_lock import lock_dirs
lock = lock_dirs([Path(sys.argv[1])])
child = os.fork() if sys.argv[2:] == ["fork"] else None
if child == 0:
    time.sleep(600)
    os._exit(0)
print("locked", child or "", flush=True)
time.sleep(600)
"""


def native(tmp_path: Path, tiny: Path | str, **experiment) -> Path:
    data = {
        "model": {"path": str(tiny)},
        "data": {"train_files": [TASK], "train_batch_size": 4, "max_prompt_length": 96},
        "rollout": {"n": 2, "response_length": 8},
        "actor": {"mini_batch_size": 8, "micro_batch_size_per_device": 8},
        "experiment": {
            "output_dir": str(tmp_path / "out"),
            "max_steps": 1,
            "trackers": ["jsonl"],
            **experiment,
        },
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def verl_args(tiny: Path, out: Path) -> list[str]:
    """examples/verl_gsm8k_ppo.yaml on the tiny model and a built-in task, into ``out``."""
    return [
        str(ROOT / "examples" / "verl_gsm8k_ppo.yaml"),
        f"actor_rollout_ref.model.path={tiny}",
        f"critic.model.path={tiny}",
        f"data.train_files={TASK}",
        f"data.val_files={TASK}",
        "data.max_prompt_length=96",
        f"trainer.default_local_dir={out}",
    ]


def cfg_of(path: Path, **experiment):
    data = yaml.safe_load(path.read_text())
    data["experiment"].update(experiment)
    return build_config(data)


@pytest.fixture
def no_run(monkeypatch):
    """``train`` must stop before its run starts: reaching the pipeline fails the test."""

    def run_pipeline(cfg, plan=None):
        raise AssertionError("train started a run although it should be refused")

    monkeypatch.setattr("temper.pipelines.run_pipeline", run_pipeline)


def refused(args: list[str], capsys) -> str:
    """The one-line refusal of ``check`` and of ``train`` (the same), exit 2, no traceback."""
    messages = []
    for command in ("check", "train"):
        assert main([command, *args]) == 2, command
        err = capsys.readouterr().err.strip()
        assert err.startswith("config error: ") and "\n" not in err, err
        assert "Traceback" not in err
        messages.append(err)
    assert messages[0] == messages[1]
    return messages[0].removeprefix("config error: ")


def previous_run(out: Path, valid: bool = True, steps: int = 2) -> dict[str, bytes]:
    """A run's leavings in ``out``: checkpoints of steps 1..steps (their manifests deleted
    unless ``valid``) and metrics rows 1..steps; returns every file's bytes."""
    root = out / "checkpoints"
    for step in range(1, steps + 1):
        with write_checkpoint(root, step) as tmp:
            (tmp / "trainer_state.pt").write_bytes(b"state %d" % step)
        if not valid:
            (root / f"global_step_{step}" / "manifest.json").unlink()
    rows = "".join(
        json.dumps({"step": s, "train/score_mean": 0.5}) + "\n" for s in range(1, steps + 1)
    )
    (out / "metrics.jsonl").write_text(rows)
    return snapshot(out)


def snapshot(directory: Path) -> dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != LOCK_NAME
    }


@pytest.fixture
def holder(tmp_path):
    """Start a process holding a directory's lock: ``holder(dir, fork=False) -> Popen``."""
    procs: list[tuple[subprocess.Popen, int | None]] = []

    def start(directory: Path, fork: bool = False) -> tuple[subprocess.Popen, int | None]:
        directory.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(directory), *(["fork"] if fork else [])],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line and line[0] == "locked", line
        child = int(line[1]) if len(line) > 1 else None
        procs.append((proc, child))
        return proc, child

    yield start
    for proc, child in procs:
        for pid in (proc.pid, child):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        proc.wait()


# --------------------------------------------------------------------------- the lock


def test_a_second_train_into_a_held_dir_stops_at_once_naming_the_holder(
    tmp_path, tiny_model_dir, holder, capsys
):
    path = native(tmp_path, tiny_model_dir)
    out = tmp_path / "out"
    proc, _ = holder(out)
    start = time.monotonic()
    assert main(["train", str(path)]) == 2
    took = time.monotonic() - start
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith(
        f"config error: experiment.output_dir: {out} is in use by another temper run "
        f"(pid {proc.pid} on {socket.gethostname()}, since "
    ), err
    assert f"kill -TERM {proc.pid}" in err and "another experiment.output_dir" in err
    assert [p.name for p in out.iterdir()] == [LOCK_NAME]  # nothing written
    assert took < 30  # no model loaded, no step run


def test_check_notes_a_held_dir_and_passes(tmp_path, tiny_model_dir, holder, capsys):
    path = native(tmp_path, tiny_model_dir)
    proc, _ = holder(tmp_path / "out")
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"is in use by a running temper run (pid {proc.pid} on " in out


def test_a_held_dir_is_told_in_the_verl_key(tmp_path, tiny_model_dir, holder, capsys):
    out = tmp_path / "verl-out"
    proc, _ = holder(out)
    args = verl_args(tiny_model_dir, out)
    assert main(["train", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        f"config error: trainer.default_local_dir (temper: experiment.output_dir): {out} is "
        f"in use by another temper run (pid {proc.pid}"
    ), err
    assert "choose another trainer.default_local_dir" in err


def test_a_sigkilled_holder_leaves_no_stale_lock(tmp_path, holder):
    out = tmp_path / "out"
    proc, _ = holder(out)
    assert probe(out) is not None and probe(out).pid == proc.pid
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert probe(out) is None
    with lock_dirs([out]):
        assert probe(out) is not None  # ours now (the probe sees it held)


def test_a_forked_child_does_not_keep_its_killed_parents_lock(tmp_path, holder):
    out = tmp_path / "out"
    proc, child = holder(out, fork=True)
    assert child is not None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    os.kill(child, 0)  # the child lives on
    assert probe(out) is None
    lock_dirs([out]).release()


def test_a_checkpoint_dir_outside_the_output_dir_is_locked_too(tmp_path, tiny_model_dir, holder):
    ckpts = tmp_path / "elsewhere" / "ckpts"
    path = native(tmp_path, tiny_model_dir, checkpoint_dir=str(ckpts))
    proc, _ = holder(ckpts)
    from temper.config.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        claim_run_dir(cfg_of(path), tmp_path / "out")
    assert err.value.key == "experiment.checkpoint_dir"
    assert f"pid {proc.pid}" in err.value.reason
    assert probe(tmp_path / "out") is None  # all or none: the output dir was let go


# --------------------------------------------------------------------------- replacing a run


def test_a_start_over_checkpoints_none_valid_is_refused(tmp_path, tiny_model_dir, capsys, no_run):
    """Intact checkpoints whose manifests were deleted: auto finds none, so the run would
    start at step 0 over them and truncate metrics.jsonl (today's main does)."""
    out = tmp_path / "out"
    before = previous_run(out, valid=False)
    msg = refused([str(native(tmp_path, tiny_model_dir))], capsys)
    assert msg == (
        f"experiment.output_dir: {out} holds a previous run (2 checkpoints (global_step_1, "
        "global_step_2; none valid), metrics.jsonl with steps 1–2); none of its checkpoints is "
        "valid (global_step_2: no manifest.json: an interrupted save; global_step_1: no "
        "manifest.json: an interrupted save), so this start would "
        "begin again at step 0 over it. Fix: choose another experiment.output_dir, or start "
        f"over with experiment.overwrite=true (moves it to {tmp_path / 'out.old-<time>'})"
    )
    assert snapshot(out) == before


def test_resume_disabled_in_a_used_dir_is_refused(tmp_path, tiny_model_dir, capsys, no_run):
    out = tmp_path / "out"
    before = previous_run(out)
    path = native(tmp_path, tiny_model_dir, resume_mode="disable")
    msg = refused([str(path)], capsys)
    assert msg.startswith(
        f"experiment.resume_mode: {out} holds a previous run (2 checkpoints (global_step_1, "
        "global_step_2), metrics.jsonl with steps 1–2), and this start would begin "
        "again at step 0. Fix: continue it with experiment.resume_mode=auto, choose another "
        "experiment.output_dir, or start over with experiment.overwrite=true"
    ), msg
    assert snapshot(out) == before


def test_roll_resume_from_checkpoint_false_is_refused_in_roll_terms(
    tmp_path, tiny_model_dir, capsys, no_run
):
    """Every shipped ROLL upstream example says ``resume_from_checkpoint: false``: a
    rerun after a stop would retrain from step 1 over the first run."""
    out = tmp_path / "roll-out"
    before = previous_run(out)
    roll = ROOT / "examples" / "roll_agentic_sokoban.yaml"
    args = [
        str(roll),
        f"pretrain={tiny_model_dir}",
        f"output_dir={out}",
        f"render_save_dir={tmp_path / 'render'}",
        "resume_from_checkpoint=false",
    ]
    msg = refused(args, capsys)
    assert msg.startswith(
        f"resume_from_checkpoint (temper: experiment.resume_mode): {out} holds a previous run"
    ), msg
    assert msg.endswith(
        "Fix: continue it with resume_from_checkpoint=true, choose another output_dir, or "
        "start over with the --overwrite flag of temper train "
        f"(moves it to {tmp_path / 'roll-out.old-<time>'})"
    ), msg
    assert snapshot(out) == before


def test_metrics_of_a_run_killed_before_its_first_save_are_not_truncated(
    tmp_path, tiny_model_dir, capsys, no_run
):
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"step": 2}\n{"st')
    msg = refused([str(native(tmp_path, tiny_model_dir))], capsys)
    assert msg.startswith(
        f"experiment.output_dir: {out} holds a previous run (metrics.jsonl with steps 0–2); "
        "it saved no checkpoint, so this start would begin again at step 0 over it"
    ), msg


def test_another_runs_resume_path_into_a_used_dir_is_refused(
    tmp_path, tiny_model_dir, capsys, no_run
):
    other = tmp_path / "other" / "checkpoints"
    with write_checkpoint(other, 3) as tmp:
        (tmp / "trainer_state.pt").write_bytes(b"x")
    previous_run(tmp_path / "out")
    path = native(
        tmp_path,
        tiny_model_dir,
        resume_mode="resume_path",
        resume_from_path=str(other / "global_step_3"),
    )
    msg = refused([str(path)], capsys)
    assert msg.startswith(f"experiment.resume_from_path: {tmp_path / 'out'} holds a previous")
    assert f"would continue {other / 'global_step_3'} (another run's checkpoint) over it" in msg


def test_auto_resume_of_the_dirs_own_run_goes_on(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "out"
    previous_run(out)
    path = native(tmp_path, tiny_model_dir)
    assert main(["check", str(path)]) == 0
    lock, resume_from = claim_run_dir(cfg_of(path), out)
    lock.release()
    assert resume_from == out / "checkpoints" / "global_step_2"
    assert "starting at step 0" not in capsys.readouterr().out


def test_overwrite_moves_the_previous_run_aside_and_deletes_nothing(
    tmp_path, tiny_model_dir, capsys
):
    out = tmp_path / "out"
    before = previous_run(out, valid=False)
    (out / "tensorboard").mkdir()
    (out / "tensorboard" / "events").write_bytes(b"tb")
    before["tensorboard/events"] = b"tb"
    path = native(tmp_path, tiny_model_dir)
    assert main(["check", str(path), "--overwrite"]) == 0
    note = capsys.readouterr().out
    assert f"experiment.overwrite: the previous run in {out} (2 checkpoints" in note
    assert snapshot(out) == before  # check moves nothing
    lock, resume_from = claim_run_dir(cfg_of(path, overwrite=True), out)
    try:
        assert resume_from is None
        assert [p.name for p in out.iterdir()] == [LOCK_NAME]
        (aside,) = tmp_path.glob("out.old-*")
        assert snapshot(aside) == before
        printed = capsys.readouterr().out
        assert printed.startswith("experiment.overwrite: moved the previous run (2 checkpoints")
        assert f"): {out} to {aside}\n" in printed
        assert f"no checkpoint found in {out / 'checkpoints'}: starting at step 0" in printed
    finally:
        lock.release()


def test_overwrite_is_a_flag_for_a_verl_file_too(tmp_path, tiny_model_dir, capsys, no_run):
    out = tmp_path / "verl-out"
    previous_run(out, valid=False)
    args = verl_args(tiny_model_dir, out)
    msg = refused(args, capsys)
    assert msg.startswith(f"trainer.default_local_dir (temper: experiment.output_dir): {out}")
    assert msg.endswith(
        "Fix: choose another trainer.default_local_dir, or start over with the --overwrite "
        f"flag of temper train (moves it to {tmp_path / 'verl-out.old-<time>'})"
    ), msg
    assert main(["check", *args, "--overwrite"]) == 0
    assert "will be moved to" in capsys.readouterr().out


def test_a_fresh_start_says_where_it_starts(tmp_path, tiny_model_dir, capsys):
    path = native(tmp_path, tiny_model_dir)
    lock, resume_from = claim_run_dir(cfg_of(path), tmp_path / "out")
    lock.release()
    assert resume_from is None
    assert capsys.readouterr().out.strip() == (
        f"no checkpoint found in {tmp_path / 'out' / 'checkpoints'}: starting at step 0; "
        f"outputs in {tmp_path / 'out'}"
    )


def test_a_resume_says_which_metrics_rows_it_drops(tmp_path, capsys):
    from temper.tracking import JsonlTracker

    rows = "".join(json.dumps({"step": s}) + "\n" for s in range(1, 6))
    (tmp_path / "metrics.jsonl").write_text(rows)
    JsonlTracker(tmp_path, start_step=4).close()  # resumed after step 3's checkpoint
    assert capsys.readouterr().out.strip() == (
        f"{tmp_path / 'metrics.jsonl'}: dropped 2 rows of steps 4–5 (logged after the "
        "checkpoint this run starts from; they are logged again)"
    )


# --------------------------------------------------------------------------- real runs


@pytest.mark.slow
def test_two_real_trains_into_one_dir(tmp_path, tiny_model_dir):
    """A live ``temper train`` and a second one into its directory: the second stops
    within seconds naming the first; once the first is SIGKILLed, the directory is free
    and the same command resumes from its checkpoint."""
    path = native(tmp_path, tiny_model_dir, max_steps=400, save_freq=1, save_every_minutes=0)
    out = tmp_path / "out"
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "TEMPER_CACHE": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "temper", "train", str(path)]
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        marker = out / "checkpoints" / "global_step_1" / "manifest.json"
        deadline = time.monotonic() + 240
        while not marker.is_file():
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr[-3000:]
        err = second.stderr.strip().splitlines()
        assert len(err) == 1 and "Traceback" not in second.stderr, second.stderr[-3000:]
        assert f"is in use by another temper run (pid {first.pid} on " in err[0]
        rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x]
        steps = [r["step"] for r in rows]
        assert steps == sorted(set(steps))  # one writer
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    lock, resume_from = claim_run_dir(cfg_of(path), out)
    lock.release()
    assert resume_from is not None  # free at once, and the same command goes on


@pytest.mark.slow
def test_nothing_to_do_suggests_nothing_destructive(tmp_path, tiny_model_dir, capsys):
    from temper.pipelines import run_pipeline

    path = native(tmp_path, tiny_model_dir, save_every_minutes=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
        run_pipeline(cfg_of(path))
        capsys.readouterr()
        run_pipeline(cfg_of(path))
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("nothing to do"))
    assert "resume_mode=disable" not in line
    assert line.endswith(
        "(raise experiment.max_steps to go on; a new run goes in another experiment.output_dir)"
    )


def test_overwrite_with_a_checkpoint_dir_above_the_output_dir_moves_each_on_its_own(
    tmp_path, tiny_model_dir, capsys
):
    """checkpoint_dir=/x, output_dir=/x/run: the checkpoints go to /x.old-…, the run's
    records to /x/run.old-…; the output dir (and its lock) is not dragged along."""
    ckpts, out = tmp_path / "x", tmp_path / "x" / "run"
    out.mkdir(parents=True)
    (out / "metrics.jsonl").write_text('{"step": 1}\n')
    with write_checkpoint(ckpts, 1) as tmp:
        (tmp / "trainer_state.pt").write_bytes(b"x")
    (ckpts / "global_step_1" / "manifest.json").unlink()
    path = native(tmp_path, tiny_model_dir, checkpoint_dir=str(ckpts), output_dir=str(out))
    lock, resume_from = claim_run_dir(cfg_of(path, overwrite=True), out)
    try:
        assert resume_from is None
        assert [p.name for p in out.iterdir()] == [LOCK_NAME]
        (ckpts_aside,) = tmp_path.glob("x.old-*")
        (out_aside,) = ckpts.glob("run.old-*")
        assert sorted(p.name for p in ckpts.iterdir()) == [LOCK_NAME, "run", out_aside.name]
        assert (ckpts_aside / "global_step_1" / "trainer_state.pt").read_bytes() == b"x"
        assert (out_aside / "metrics.jsonl").read_text() == '{"step": 1}\n'
    finally:
        lock.release()
