"""``temper train`` in a process of its own, as a user runs it, stopped at a chosen point
(a SIGKILL once a checkpoint is written, a SIGTERM mid-step) — for the tests that resume.

This folder is on the test path: tests import it as ``killed_runs``."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import yaml


def start_train(
    cfg: Mapping, name: str, tmp: Path, env: Mapping[str, str] | None = None
) -> tuple[subprocess.Popen, Path]:
    """``temper train`` on ``cfg`` (written to ``tmp/NAME.yaml``) in a new process, its
    output appended to ``tmp/NAME.log``; ``env`` adds variables."""
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(dict(cfg)))
    log = tmp / f"{name}.log"
    environ = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", **(env or {})}
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "temper", "train", str(path)],
            env=environ,
            stdout=out,
            stderr=out,
        )
    return proc, log


def wait_for(
    cond: Callable[[], bool], proc: subprocess.Popen, log: Path, timeout: float = 300.0
) -> None:
    """Until ``cond()`` holds; fails with the log's tail if the run ends first, or when
    ``timeout`` seconds pass."""
    end = time.monotonic() + timeout
    while not cond():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < end, f"timed out; log tail: {log.read_text()[-1500:]}"
        time.sleep(0.05)


def kill_at(marker: Path, proc: subprocess.Popen, log: Path, timeout: float = 300.0) -> None:
    """SIGKILL the run as soon as ``marker`` (a checkpoint's manifest) exists."""
    try:
        wait_for(marker.is_file, proc, log, timeout)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def metric_rows(out: Path) -> list[dict]:
    """The rows of ``out/metrics.jsonl`` so far (none before the file exists); a line cut
    by a SIGKILL is left out."""
    path = out / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            rows.append(json.loads(line))
    return rows
