"""What reward functions print, capped: the first lines of each batch shown, the rest
counted and said in one line.

A reward function runs once per sample, hundreds of times a step; one that prints its
inputs (a debugging ``print`` left in) fills the run's log with megabytes a step and
buries the trainer's own lines. The reward workers' stdout and stderr are pipes the
executor reads (``temper.rewards.executor``); :class:`OutputCap` forwards what arrives
to the trainer's stdout and stderr until ``limit`` bytes of one batch of calls (a step's
scoring, a validation's) are shown — cut at a line end where there is one —, then
counts the rest, and ``end`` says how much was not shown. The first lines, the ones a
user reads to debug, always get through.
"""

from __future__ import annotations

import sys
from typing import TextIO

#: Bytes of reward output shown per batch of calls.
LIMIT = 32 << 10


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    if n < 1 << 20:
        return f"{n / 1024:.1f} KiB"
    return f"{n / (1 << 20):.1f} MiB"


def _write(stream: TextIO, data: bytes) -> None:
    """``data`` onto ``stream`` as is (its byte layer, where it has one)."""
    binary = getattr(stream, "buffer", None)
    if binary is None:
        stream.write(data.decode("utf-8", "replace"))
        stream.flush()
        return
    stream.flush()  # what was written as text goes first
    binary.write(data)
    binary.flush()


class OutputCap:
    """Forward reward output up to ``limit`` bytes per batch (``begin`` … ``end``)."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.limit = limit
        self.shown = 0
        self.dropped = 0

    def begin(self) -> None:
        self.shown = self.dropped = 0

    def feed(self, stream: str, data: bytes) -> None:
        """``data`` a worker wrote to its ``stream`` (``stdout`` or ``stderr``)."""
        room = self.limit - self.shown
        if room <= 0:
            self.dropped += len(data)
            return
        if len(data) > room:
            cut = data.rfind(b"\n", 0, room) + 1 or room  # a whole line where one fits
            data, rest = data[:cut], data[cut:]
            self.dropped += len(rest)
            self.shown = self.limit  # once cut, nothing more of this batch is shown
        else:
            self.shown += len(data)
        _write(sys.stdout if stream == "stdout" else sys.stderr, data)

    def end(self) -> str | None:
        """The one line saying what was not shown (also printed on stderr), or None."""
        if not self.dropped:
            return None
        line = (
            f"reward output: {_size(self.dropped)} more that reward functions printed in this "
            f"batch of calls not shown (the first {_size(self.limit)} of each batch are)"
        )
        print(line, file=sys.stderr, flush=True)
        return line
