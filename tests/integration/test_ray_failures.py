"""A Ray worker killed in the middle of a run: ``temper train`` stops naming the role and
rank, the last checkpoint is intact, and the same command resumes from it to the end."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_ray_backend import ray_config_dict  # same folder: pytest puts it on sys.path

pytest.importorskip("ray")
pytestmark = [pytest.mark.slow, pytest.mark.ray]


def write_config(tmp_path, model_dir) -> str:
    cfg = ray_config_dict(
        tmp_path,
        model_dir,
        experiment={"max_steps": 3, "save_freq": 1},
        resources={"devices_per_node": 3, "actor_train": [0, 1], "actor_infer": [2]},
    )
    path = tmp_path / "ray.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def temper_train(config: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "temper", "train", config],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def test_worker_killed_mid_step_stops_the_run_and_resume_continues(tmp_path, tiny_model_dir):
    env = {**os.environ, "TEMPER_CACHE": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    config = write_config(tmp_path, tiny_model_dir)
    proc = temper_train(config, env)
    lines, pids, killed = [], None, None
    deadline = time.monotonic() + 400
    assert proc.stdout is not None
    for line in proc.stdout:  # the run's own report: pids, then a line per checkpoint
        lines.append(line)
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the run did not reach step 2's checkpoint in time:\n" + "".join(lines))
        found = re.search(r"ray: actor ranks 0\.\.1 up \(pids \[(\d+), (\d+)\]\)", line)
        if found:
            pids = [int(found.group(1)), int(found.group(2))]
        if line.startswith("checkpoint:") and "global_step_2" in line and killed is None:
            assert pids is not None, "".join(lines)
            os.kill(pids[1], signal.SIGKILL)  # step 3 has begun: the driver is in it
            killed = pids[1]
    code = proc.wait(timeout=120)
    out = "".join(lines)
    assert killed is not None, out
    assert code != 0, out
    assert "actor rank 1: worker process died" in out
    assert "Traceback" not in out  # one clear line, not a stack dump
    run_dir = tmp_path / "run"
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # step 3 died with its worker: nothing half-logged
    # the same command again: resume_mode=auto picks step 2's checkpoint and finishes
    again = subprocess.run(
        [sys.executable, "-m", "temper", "train", config],
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"resumed from {run_dir / 'checkpoints' / 'global_step_2'} at step 2" in again.stdout
    steps = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    assert (run_dir / "checkpoints" / "global_step_3").is_dir()


@pytest.mark.parametrize("mode", ["fixed", "streaming"])
def test_rollout_killed_while_running_ahead_stops_in_one_line_and_resume_continues(
    tmp_path, tiny_model_dir, mode
):
    """One-step-off on Ray (trainer on slots 0-1, rollout on slot 2), whole batches on the
    fixed schedule or groups streamed: the rollout worker killed while it generates ahead
    stops the run with one line naming it (no hang: the test's deadline bounds it), and
    the same command resumes to the end."""
    env = {**os.environ, "TEMPER_CACHE": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    cfg = yaml.safe_load(Path(write_config(tmp_path, tiny_model_dir)).read_text())
    cfg["async_training"] = {"staleness": 1, "mode": mode}
    if mode == "streaming":
        cfg["async_training"]["stream_chunk"] = 1
    config = tmp_path / "ray_async.yaml"
    config.write_text(yaml.safe_dump(cfg))
    proc = temper_train(str(config), env)
    lines, pid, killed = [], None, None
    deadline = time.monotonic() + 400
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the run did not reach step 1's checkpoint in time:\n" + "".join(lines))
        found = re.search(r"ray: rollout ranks 0\.\.0 up \(pids \[(\d+)\]\)", line)
        if found:
            pid = int(found.group(1))
        if line.startswith("checkpoint:") and "global_step_1" in line and killed is None:
            assert pid is not None, "".join(lines)
            os.kill(pid, signal.SIGKILL)  # step 2 has begun: batch 3 is generating ahead
            killed = pid
    code = proc.wait(timeout=120)
    out = "".join(lines)
    assert killed is not None, out
    assert code != 0, out
    assert "rollout rank 0: worker process died" in out, out[-3000:]
    assert "Traceback" not in out
    run_dir = tmp_path / "run"
    again = subprocess.run(
        [sys.executable, "-m", "temper", "train", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=400,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    # streaming: step 2 may still finish on groups generated before the kill
    last = 1 if mode == "fixed" else int(re.findall(r"global_step_(\d+) at step", again.stdout)[0])
    assert f"resumed from {run_dir / 'checkpoints' / f'global_step_{last}'} at step {last}" in (
        again.stdout
    )
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    if mode == "fixed":  # the schedule is the step's: batch s has version max(0, s - 2)
        assert [r["async/staleness_max"] for r in rows] == [0, 1, 1]
    else:  # timing decides, within the bound
        assert all(r["async/staleness_max"] <= 1 for r in rows)
