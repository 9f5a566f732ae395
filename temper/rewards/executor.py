"""Run reward calls in worker processes, with a per-call timeout and crash isolation.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot stop a running task, so
a reward that hangs would hold a worker forever. ``RewardExecutor`` keeps its own
``multiprocessing`` workers (``spawn`` by default: safe after torch has started
threads; ``forkserver`` also works), one duplex pipe each, and hands a call to a worker
only once it is idle, so a call's clock starts when it starts running:

- a call that raises → ``CallResult(kind="error", reason="Type: message")``;
- a call still running ``timeout`` seconds after it started → the worker is killed
  (SIGKILL), ``kind="timeout"``, and a fresh worker replaces it;
- a worker that dies (segfault, ``os._exit``) → ``kind="crash"``, replaced likewise.

Nothing a reward function does stops the caller: nor can it signal the trainer (each
worker shields it with a seccomp filter, ``temper.rewards.shield``), and what it prints
reaches the trainer's stdout/stderr through pipes read here, capped per batch of calls
(``temper.rewards.output``). ``num_workers=0`` runs calls in this
process: exceptions are still caught, but **no timeout is possible** (a hang hangs the
run), the output is not captured and nothing shields the trainer — meant for debugging
(a config says so with ``reward.timeout_s: null``; ``temper.config.validate``). Workers start lazily on the first ``run`` and live until
``close()`` (also called at garbage collection / interpreter exit).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import multiprocessing as mp
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import wait
from typing import Any, Literal

from temper.rewards.output import OutputCap
from temper.rewards.worker import (
    FunctionSpec,
    WorkerSetup,
    call,
    describe_error,
    worker_main,
)

CallKind = Literal["ok", "error", "timeout", "crash", "invalid"]
logger = logging.getLogger(__name__)
#: Seconds a new worker may take to import its preloaded modules and say it is ready.
STARTUP_TIMEOUT_S = 120.0


class RewardWorkerError(RuntimeError):
    """A reward worker process could not start: nothing was scored, the run stops."""


@dataclasses.dataclass
class CallResult:
    """Outcome of one reward call: ``value`` when ``kind == "ok"``, else ``reason``."""

    kind: CallKind
    value: Any = None
    reason: str = ""
    seconds: float = 0.0


@dataclasses.dataclass
class RewardCall:
    """One call: ``spec``'s function with keyword ``arguments``, stopped after ``timeout_s``
    (None: no deadline — in process, where none can be kept; config refuses it for
    workers)."""

    spec: FunctionSpec
    arguments: dict[str, Any]
    timeout_s: float | None


class _Worker:
    def __init__(self, ctx: Any, preload: Sequence[str]) -> None:
        self.conn, child = ctx.Pipe(duplex=True)
        # its stdout and stderr: pipes read here (``output``), ends of the child's only
        (out, out_child), (err, err_child) = ctx.Pipe(duplex=False), ctx.Pipe(duplex=False)
        setup = WorkerSetup(tuple(preload), out_child, err_child, (os.getpid(), os.getpgrp()))
        self.process = ctx.Process(
            target=worker_main, args=(child, setup), daemon=True, name="temper-reward"
        )
        self.process.start()
        for end in (child, out_child, err_child):
            end.close()
        self.output: dict[str, Any] = {"stdout": out, "stderr": err}
        for reader in self.output.values():
            os.set_blocking(reader.fileno(), False)
        self.started = time.monotonic()
        self.ready = False
        self.task: int | None = None
        self.deadline = 0.0
        self.task_start = 0.0

    def read_output(self, cap: OutputCap, reader: Any | None = None) -> None:
        """Hand what the worker wrote so far (to ``reader``, or to both pipes) to ``cap``;
        a pipe at its end (the worker exited) is closed and no longer read."""
        for name, pipe in list(self.output.items()):
            if reader is not None and pipe is not reader:
                continue
            while True:
                try:
                    data = os.read(pipe.fileno(), 1 << 16)
                except BlockingIOError:
                    break
                except OSError:
                    data = b""
                if not data:
                    pipe.close()
                    del self.output[name]
                    break
                cap.feed(name, data)

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()
        for pipe in self.output.values():
            pipe.close()
        self.output.clear()

    def stop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(None)
        self.process.join(timeout=1)
        self.kill()


def _shutdown(workers: list[_Worker]) -> None:
    for w in workers:
        w.kill()
    workers.clear()


class RewardExecutor:
    """A pool of reward worker processes; ``run(calls)`` returns one ``CallResult`` each."""

    def __init__(
        self,
        num_workers: int,
        start_method: str = "spawn",
        preload: Sequence[str] = ("math_verify",),
    ) -> None:
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        self.num_workers = num_workers
        self.preload = tuple(preload)
        self._ctx = mp.get_context(start_method)
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self.restarts = 0
        self.output = OutputCap()
        self.unshielded: str | None = None  # why a worker could not shield the trainer
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)

    # ------------------------------------------------------------------ public

    def run(self, calls: Sequence[RewardCall]) -> list[CallResult]:
        """Run all ``calls`` (in parallel over the workers); results in input order. What
        the calls print is shown up to ``OutputCap``'s limit (workers only)."""
        with self._lock:
            if self.num_workers == 0:
                return [self._run_inline(c) for c in calls]
            self.output.begin()
            try:
                return self._run_pool(calls)
            finally:
                for w in self._workers:  # the last replies' output is in the pipes now
                    w.read_output(self.output)
                self.output.end()

    def close(self) -> None:
        """Stop the workers (politely, then SIGKILL). The executor restarts them if reused."""
        with self._lock:
            for w in self._workers:
                w.stop()
            self._workers.clear()

    def __enter__(self) -> RewardExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def worker_pids(self) -> list[int]:
        return [w.process.pid for w in self._workers if w.process.pid is not None]

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _run_inline(c: RewardCall) -> CallResult:
        start = time.monotonic()
        try:
            value = call(c.spec, c.arguments)
        except Exception as err:
            return CallResult("error", reason=describe_error(err), seconds=time.monotonic() - start)
        return CallResult("ok", value=value, seconds=time.monotonic() - start)

    def _replace(self, worker: _Worker) -> None:
        worker.read_output(self.output)
        worker.kill()
        self._workers[self._workers.index(worker)] = _Worker(self._ctx, self.preload)
        self.restarts += 1

    def _run_pool(self, calls: Sequence[RewardCall]) -> list[CallResult]:
        while len(self._workers) < self.num_workers:
            self._workers.append(_Worker(self._ctx, self.preload))
        results: list[CallResult | None] = [None] * len(calls)
        pending = deque(range(len(calls)))
        for w in self._workers:  # a previous run may have been interrupted mid-call
            if w.task is not None:
                self._replace(w)
        while pending or any(w.task is not None for w in self._workers):
            for w in self._workers:
                if w.ready and w.task is None and pending:
                    idx = pending.popleft()
                    try:
                        w.conn.send((calls[idx].spec, calls[idx].arguments))
                    except Exception as err:  # unpicklable arguments: this call fails alone
                        results[idx] = CallResult("error", reason=describe_error(err))
                        continue
                    w.task, w.task_start = idx, time.monotonic()
                    limit = calls[idx].timeout_s
                    w.deadline = w.task_start + (math.inf if limit is None else limit)
            self._wait_and_collect(results)
        return [r if r is not None else CallResult("crash", reason="lost") for r in results]

    def _wait_and_collect(self, results: list[CallResult | None]) -> None:
        now = time.monotonic()
        deadlines = [w.started + STARTUP_TIMEOUT_S for w in self._workers if not w.ready]
        deadlines += [w.deadline for w in self._workers if w.task is not None]
        soonest = min(deadlines, default=math.inf)
        timeout = None if soonest == math.inf else max(0.0, soonest - now)
        waitables: list[Any] = [w.conn for w in self._workers]
        waitables += [w.process.sentinel for w in self._workers]
        waitables += [pipe for w in self._workers for pipe in w.output.values()]
        ready = set(wait(waitables, timeout=timeout))
        now = time.monotonic()
        for w in list(self._workers):
            for pipe in [p for p in w.output.values() if p in ready]:
                w.read_output(self.output, pipe)
            if w.conn in ready or w.process.sentinel in ready:
                self._receive(w, results, now)
            elif w.ready and w.task is not None and now >= w.deadline:
                results[w.task] = CallResult(
                    "timeout",
                    reason=f"TimeoutError: reward call exceeded {w.deadline - w.task_start:g} s",
                    seconds=now - w.task_start,
                )
                self._replace(w)
            elif not w.ready and now >= w.started + STARTUP_TIMEOUT_S:
                modules = ", ".join(self.preload) or "none"
                raise RewardWorkerError(
                    f"reward worker: not ready within {STARTUP_TIMEOUT_S:g}s of its start "
                    f"(a new Python process importing the reward's modules: {modules}). "
                    "Fix: check that they import quickly here (python -c 'import …'), or "
                    "lower reward.num_workers on a machine this busy"
                )

    def _receive(self, w: _Worker, results: list[CallResult | None], now: float) -> None:
        try:
            status, value = w.conn.recv() if w.conn.poll() else (None, None)
        except (EOFError, OSError):
            status, value = None, None
        if status == "ready":
            w.ready = True
            if value and self.unshielded is None:
                self.unshielded = str(value)
                logger.warning(
                    "reward workers run unshielded: a reward function that signals the "
                    "trainer can stop the run (%s)",
                    value,
                )
            return
        if status is None:  # the process died
            w.process.join(timeout=1)
            w.read_output(self.output)  # its last words (a traceback) before the verdict
            code = w.process.exitcode
            if w.task is None and not w.ready:
                raise RewardWorkerError(
                    f"reward worker: exited during start-up (exit code {code}); see its stderr "
                    "above. Fix: with spawn the main module must be importable and start the "
                    "run under `if __name__ == '__main__':`"
                )
            if w.task is not None:
                results[w.task] = CallResult(
                    "crash",
                    reason=f"WorkerCrash: reward worker died (exit code {code})",
                    seconds=now - w.task_start,
                )
            self._replace(w)
            return
        if w.task is not None:
            elapsed = now - w.task_start
            if status == "ok":
                results[w.task] = CallResult("ok", value=value, seconds=elapsed)
            else:
                results[w.task] = CallResult("error", reason=str(value), seconds=elapsed)
            w.task = None
