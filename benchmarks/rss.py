"""Host-memory measurements for the benchmarks (Linux; no temper import, so TRL's venv
can use it too).

* :func:`peak_rss` / :func:`reset_peak_rss`: this process's resident-set high-water mark
  (``VmHWM`` in ``/proc/self/status``), which the kernel resets to the current RSS when
  ``5`` is written to ``/proc/self/clear_refs``. Exact (no sampling), and it sees every
  allocation: torch's, oneDNN's, vLLM's in-process engine's.
* :class:`PhasePeaks`: the peak RSS of named, possibly nested, phases of one process. At
  each phase boundary the high-water mark of the segment that just ended is credited to
  every phase open during it, then reset; a phase's peak is the largest of its segments.
  Segments where only ``bare_inside`` is open are credited to ``bare_as`` as well (TRL's
  training runs inside its step but outside any of its profiled phases).
* :class:`TreeSampler`: a thread sampling the summed RSS of a process and all of its
  descendants (a run's worker processes, an out-of-process engine), keeping the peak.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_HWM = re.compile(r"VmHWM:\s+(\d+)\s+kB")
_RSS = re.compile(r"VmRSS:\s+(\d+)\s+kB")


def _status_kib(pattern: re.Pattern[str], pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        match = pattern.search(f.read())
    return int(match.group(1)) if match else 0


def peak_rss() -> int:
    """This process's RSS high-water mark since start or the last reset, in bytes."""
    return _status_kib(_HWM) << 10


def current_rss(pid: int | str = "self") -> int:
    """Resident set of ``pid`` (default: this process), in bytes."""
    return _status_kib(_RSS, pid) << 10


def reset_peak_rss() -> None:
    """Reset the high-water mark to the current RSS (``clear_refs`` mode 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


class PhasePeaks:
    """Peak RSS (bytes) of named phases; ``with peaks("name"): ...`` or enter/exit."""

    def __init__(self, bare_inside: str | None = None, bare_as: str | None = None) -> None:
        self.open: list[str] = []
        self.peaks: dict[str, int] = {}
        self.lifetime = 0  # the process's own peak (the resets hide it from VmHWM)
        self.bare_inside, self.bare_as = bare_inside, bare_as

    def _boundary(self) -> None:
        high = peak_rss()
        self.lifetime = max(self.lifetime, high)
        for name in self.open:
            self.peaks[name] = max(self.peaks.get(name, 0), high)
        if self.bare_as and self.open == [self.bare_inside]:
            self.peaks[self.bare_as] = max(self.peaks.get(self.bare_as, 0), high)
        reset_peak_rss()

    def enter(self, name: str) -> None:
        self._boundary()
        self.open.append(name)

    def exit(self, name: str) -> None:
        self._boundary()
        if name in self.open:
            self.open.remove(name)

    def process_peak(self) -> int:
        """This process's peak RSS since it started (bytes), resets included."""
        self._boundary()
        return self.lifetime

    def take(self) -> dict[str, int]:
        """The peaks so far, cleared for the next step."""
        out, self.peaks = self.peaks, {}
        return out

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        self.enter(name)
        try:
            yield
        finally:
            self.exit(name)


def _descendants(pid: int) -> list[int]:
    """``pid``'s children, grandchildren, … (from ``/proc/<pid>/task/*/children``)."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except OSError:
                continue
            out.extend(kids)
            todo.extend(kids)
    return out


class TreeSampler:
    """Samples the summed RSS of ``pid`` and its descendants every ``interval`` s in a
    daemon thread; ``peak`` is the largest sum seen (bytes). Shared pages (a forked
    worker's copy-on-write memory) count once per process, as ``ps`` shows them; a child
    counts once seen in two samples in a row (see ``_run``)."""

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid, self.interval, self.peak = pid, interval, 0
        self.at_peak: dict[str, int] = {}  # "pid:name" -> RSS at the peak
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        seen: set[int] = set()
        while not self._stop.is_set():
            sizes: dict[str, int] = {}
            kids = _descendants(self.pid)
            # a child counts from its second sample on: one caught between vfork and exec
            # shows its parent's whole RSS (the same memory), which would count twice
            for pid in [self.pid, *(k for k in kids if k in seen)]:
                with contextlib.suppress(OSError):  # exited between listing and reading
                    with open(f"/proc/{pid}/comm") as f:
                        name = f"{pid}:{f.read().strip()}"
                    sizes[name] = current_rss(pid)
            if sum(sizes.values()) > self.peak:
                self.peak, self.at_peak = sum(sizes.values()), sizes
            seen = set(kids)
            time.sleep(self.interval)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
