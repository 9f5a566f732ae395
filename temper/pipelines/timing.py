"""Phase timings of one step: ``timing/<phase>_s``; throughput from them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from torch.profiler import record_function


class Timer:
    """Collects ``timing/<name>_s`` for the phases of one step (the driver's and the
    producer's: ``rollout``, ``reward``, …); a phase entered twice (generation rounds of
    dynamic sampling) adds up. Each phase is also a ``torch.profiler`` range named
    ``phase/<name>``, so a profiled step (``experiment.profile_steps``) shows them."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        with record_function(f"phase/{name}"):
            yield
        key = f"timing/{name}_s"
        self.times[key] = self.times.get(key, 0.0) + time.perf_counter() - start


def throughput(tokens: float, step_seconds: float) -> dict[str, float]:
    """``perf/tokens_per_s``: the step's prompt and response tokens per second."""
    return {"perf/tokens_per_s": tokens / max(step_seconds, 1e-9)}
