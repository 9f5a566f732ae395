"""What a reward worker process runs: resolve a ``FunctionSpec`` and call it.

Kept free of torch and of the config loader so a (re)spawned worker is ready in a
fraction of a second. ``FunctionSpec`` is the picklable description of a reward
function that crosses the process boundary (a built-in name, or a file path + name).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import signal
import sys
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

from temper.rewards.custom import load_custom_function
from temper.rewards.registry import get_reward_function
from temper.rewards.shield import install as install_shield

MAX_REASON_CHARS = 500


@dataclasses.dataclass(frozen=True)
class FunctionSpec:
    """A reward function by name: built-in ``name``, or ``name`` inside the file ``path``.

    ``batched``: verl batch signature ``fn(data_sources, solution_strs, ground_truths,
    extra_infos, **kwargs) -> list``. ``kwargs`` are passed to every call; ``needs``: the
    per-sample inputs a built-in declares (``temper.rewards.registry``), which the
    manager adds to each call's arguments.
    """

    name: str
    path: str | None = None
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    batched: bool = False
    needs: frozenset[str] = frozenset()

    @property
    def label(self) -> str:
        """Short name for metrics and failure records."""
        return f"custom:{self.name}" if self.path else self.name

    def __hash__(self) -> int:
        return hash((self.name, self.path, self.batched, repr(sorted(self.kwargs.items()))))


def resolve(spec: FunctionSpec) -> Any:
    """The callable a spec names (custom files are imported once per process)."""
    if spec.path:
        return load_custom_function(spec.path, spec.name)
    return get_reward_function(spec.name)


def call(spec: FunctionSpec, arguments: Mapping[str, Any]) -> Any:
    """``fn(**arguments, **spec.kwargs)``."""
    return resolve(spec)(**arguments, **spec.kwargs)


def describe_error(err: BaseException) -> str:
    """``"Type: message"`` (truncated) — the failure reason recorded for a sample."""
    text = f"{type(err).__name__}: {err}"
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


@dataclasses.dataclass(frozen=True)
class WorkerSetup:
    """How a worker starts: the modules it imports first, the pipes its stdout and stderr
    go to (the executor reads and caps them; None: the trainer's own), and the trainer
    it may not signal (pid and process group; None: unshielded)."""

    preload: Sequence[str] = ()
    stdout: Any = None
    stderr: Any = None
    trainer: tuple[int, int] | None = None


def _redirect(fd: int, pipe: Any) -> None:
    """Point ``fd`` (1 or 2) at ``pipe``: Python's writes, C's and child processes' alike."""
    getattr(sys, "stdout" if fd == 1 else "stderr").flush()
    os.dup2(pipe.fileno(), fd)
    pipe.close()


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def worker_main(conn: Any, setup: WorkerSetup) -> None:
    """Loop: receive ``(spec, arguments)``, send ``("ok", value)`` or ``("error", reason)``.

    Sends ``("ready", problem)`` after start-up so start-up time never counts against a
    sample's timeout; ``problem`` says why the trainer is not shielded from this worker's
    signals (``temper.rewards.shield``; None when it is). ``None`` asks the worker to
    exit. Ctrl-C is left to the parent. What a call prints is flushed before its reply,
    so the executor has it when the reply comes.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if setup.stdout is not None:
        _redirect(1, setup.stdout)
    if setup.stderr is not None:
        _redirect(2, setup.stderr)
    problem = None
    if setup.trainer is not None:
        with contextlib.suppress(OSError):  # a session of its own: kill(0) stays in it
            os.setsid()
        problem = install_shield(*setup.trainer)
    for module in setup.preload:  # a missing optional module only slows the first call
        with contextlib.suppress(Exception):
            importlib.import_module(module)
    _flush()
    conn.send(("ready", problem))
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        spec, arguments = task
        try:
            reply: tuple[str, Any] = ("ok", call(spec, arguments))
        except Exception as err:
            reply = ("error", describe_error(err))
            traceback.clear_frames(err.__traceback__)
        _flush()
        try:
            conn.send(reply)
        except Exception as err:  # e.g. an unpicklable return value
            conn.send(("error", f"reward result could not be sent back: {describe_error(err)}"))
