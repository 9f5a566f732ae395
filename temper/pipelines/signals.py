"""Preemption safety: SIGTERM/SIGINT end the run at a step boundary with a checkpoint.

Schedulers (Slurm, Kubernetes, spot instances) send SIGTERM and wait a grace period
before SIGKILL; a user presses Ctrl-C. Either way the step in flight is finished (a
half-applied step cannot be saved consistently), a checkpoint is written, and the run
stops; ``temper train`` then exits with ``128 + signal`` (143 for SIGTERM, 130 for
SIGINT) so schedulers see an interrupted, not a failed or finished, job.

A second signal abandons the step at once, and the last checkpoint is where the run
resumes. A second SIGINT raises :class:`Interrupted` (a ``KeyboardInterrupt``, which
``temper train`` reports in one line, exit 130) — also when the process inherited SIGINT
as ignored, as every background job of a non-interactive shell does (``cmd &`` in a
script): there is no previous handler to fall back to, but a user who sends SIGINT twice
means it. A second SIGTERM runs the previous handler, else the default action (the
process ends at once, 143), ignored or not before. Signals from reward workers never
arrive (``temper.rewards.shield``), so only the user's count.
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import Any

HANDLED = (signal.SIGTERM, signal.SIGINT)


class Interrupted(KeyboardInterrupt):
    """The run stopped at once (a second SIGINT); the message says where it can resume."""


class StopSignals:
    """Context manager: while active, the first SIGTERM/SIGINT only sets ``received``."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if self.enabled and threading.current_thread() is threading.main_thread():
            for sig in HANDLED:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()

    @property
    def name(self) -> str | None:
        return signal.Signals(self.received).name if self.received is not None else None

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.received is not None:  # second signal: abandon the step
            previous = self._previous.get(signum, signal.SIG_DFL)
            self._restore()
            name = signal.Signals(signum).name
            default = (signal.default_int_handler, signal.SIG_IGN, None)  # None: set in C
            if signum == signal.SIGINT and previous in default:
                raise Interrupted(f"a second {name}")
            if callable(previous):
                previous(signum, frame)
                return
            signal.signal(signum, signal.SIG_DFL)  # ignored before: the user sent it twice
            signal.raise_signal(signum)
            return
        self.received = signum
        print(
            f"\n{signal.Signals(signum).name}: finishing this step, then saving a checkpoint "
            "and stopping (send it again to stop at once)",
            file=sys.stderr,
            flush=True,
        )
