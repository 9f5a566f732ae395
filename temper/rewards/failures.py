"""Stop a run whose rewards keep failing (``reward.max_failure_fraction`` / ``max_failed_steps``).

A reward failure (a function that raises, hangs, crashes its worker, returns no number;
a judge verdict that cannot be read) scores ``failure_score`` and is recorded, so one
bad row never stops a run. But a run where *most* samples fail trains on noise: a
missing ``data_source`` column, a sandbox that cannot start, a judge that answers
nonsense. :class:`FailureGuard` watches the training scoring rounds: a round where more
than ``max_failure_fraction`` of the samples failed is a failed step, and
``max_failed_steps`` failed steps in a row raise :class:`RewardFailureError`, whose
one-line message names the data source and the first failure's reason (the CLI prints
it as ``error: ...`` and exits 1). ``max_failed_steps: 0`` never stops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Failure(Protocol):
    """A failed sample as the guard reads it (``manager.RewardFailure``, frozen)."""

    @property
    def data_source(self) -> str: ...

    @property
    def function(self) -> str: ...

    @property
    def reason(self) -> str: ...


class RewardFailureError(RuntimeError):
    """Too many training steps in a row where most rewards failed."""


class FailureGuard:
    """Counts consecutive failed steps (see the module doc)."""

    def __init__(self, max_fraction: float, max_steps: int) -> None:
        self.max_fraction, self.max_steps = max_fraction, max_steps
        self.streak = 0

    def observe(self, num_samples: int, failures: Sequence[Failure]) -> None:
        """Record one training scoring round; raise once the streak reaches the limit."""
        if not num_samples or len(failures) / num_samples <= self.max_fraction:
            self.streak = 0
            return
        self.streak += 1
        if self.max_steps <= 0 or self.streak < self.max_steps:
            return
        first = failures[0]
        reason = " ".join(first.reason.split())
        raise RewardFailureError(
            f"rewards failed on {len(failures)}/{num_samples} samples in {self.streak} "
            f"training steps in a row (reward.max_failure_fraction={self.max_fraction:g}, "
            f"reward.max_failed_steps={self.max_steps}); first failure: data_source "
            f"'{first.data_source}', reward {first.function}: {reason}"
        )
