"""Learning-rate schedules: linear warmup, then constant, linear or cosine decay.

The multiplier is a pure function of the optimizer step so it is testable by hand and
resumes exactly (the only state is the step count). The total number of optimizer steps
is often known only once the pipeline has sized the dataset, so :class:`LRSchedule`
takes it late (``set_total_steps``) and asks for it only when a schedule needs it.

Conventions follow verl / Hugging Face: at step ``s`` (the count of completed optimizer
steps, plus 1 with ``optim.zero_indexed_step: false``) with ``W`` warmup steps and ``T``
total steps,

* warmup (``s < W``): ``s / W``, or ``(s + 1) / W`` with ``optim.warmup_from_one``
  (torchtitan's ``LambdaLR``: the first update already one step into the warmup, the
  decay still counted from completed updates);
* ``constant``: 1;
* ``linear``: ``m + (1 - m)·max(0, 1 - p)``;
* ``cosine``: ``m + (1 - m)·½(1 + cos(2π·c·p))``;
* ``sqrt``: ``m + (1 - m)·(1 - √p)`` (torchtitan's ``sqrt`` decay);

with ``p = (s - W) / max(1, T - W)``, ``m = min_lr_ratio``, ``c = num_cycles``
(0.5 = one half-period, decaying to ``m`` at ``T``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from temper.config.schema import OptimConfig
from temper.registry import Registry


def _constant(_progress: float, _num_cycles: float) -> float:
    """1: no decay."""
    return 1.0


def _linear(progress: float, _num_cycles: float) -> float:
    """``max(0, 1 - p)``."""
    return max(0.0, 1.0 - progress)


def _cosine(progress: float, num_cycles: float) -> float:
    """``½(1 + cos(2π·c·p))``."""
    return 0.5 * (1.0 + math.cos(2.0 * math.pi * num_cycles * progress))


def _sqrt(progress: float, _num_cycles: float) -> float:
    """``1 - √p``."""
    return 1.0 - math.sqrt(progress)


#: The decay after warmup, by ``optim.lr_scheduler``: ``decay(p, c)`` in [0, 1] (the
#: multiplier is then ``m + (1 - m)·decay``); ``constant`` alone needs no total steps.
SCHEDULES: Registry[Callable[[float, float], float]] = Registry("lr schedule")
SCHEDULES.add("constant", _constant)
SCHEDULES.add("linear", _linear)
SCHEDULES.add("cosine", _cosine)
SCHEDULES.add("sqrt", _sqrt)


def resolve_warmup_steps(warmup_steps: int, warmup_ratio: float, total_steps: int | None) -> int:
    """``warmup_steps`` if positive; else ``int(warmup_ratio · total)`` when the ratio is set."""
    if warmup_steps > 0:
        return warmup_steps
    if warmup_ratio > 0:
        if total_steps is None:
            raise ValueError("optim.warmup_ratio needs the total number of optimizer steps")
        return int(warmup_ratio * total_steps)
    return 0


def lr_multiplier(
    step: int,
    *,
    schedule: str = "constant",
    total_steps: int | None = None,
    warmup_steps: int = 0,
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
    warmup_from_one: bool = False,
) -> float:
    """Factor applied to the peak lr at optimizer step ``step`` (see module doc)."""
    decay = SCHEDULES.get(schedule)  # validation names the key for an unknown one
    if step < warmup_steps:
        return (step + warmup_from_one) / max(1, warmup_steps)
    if schedule == "constant":
        return 1.0
    if total_steps is None:
        raise ValueError(f"lr_scheduler '{schedule}' needs the total number of optimizer steps")
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * decay(progress, num_cycles)


class LRSchedule:
    """Sets ``lr = peak · lr_multiplier(step)`` on every param group before each step."""

    def __init__(
        self, optimizer: torch.optim.Optimizer, optim: OptimConfig, total_steps: int | None = None
    ) -> None:
        self.optimizer = optimizer
        self.cfg = optim
        self.total_steps = total_steps if total_steps is not None else optim.total_training_steps
        self.step_count = 0

    def set_total_steps(self, total_steps: int) -> None:
        """Total optimizer steps of the run (decay length, warmup_ratio base)."""
        if total_steps <= 0:
            raise ValueError(f"total optimizer steps must be positive, got {total_steps}")
        self.total_steps = total_steps

    def multiplier(self, step: int | None = None) -> float:
        warmup = resolve_warmup_steps(
            self.cfg.warmup_steps, self.cfg.warmup_ratio, self.total_steps
        )
        count = self.step_count if step is None else step
        return lr_multiplier(
            count if self.cfg.zero_indexed_step else count + 1,
            schedule=self.cfg.lr_scheduler,
            total_steps=self.total_steps,
            warmup_steps=warmup,
            min_lr_ratio=self.cfg.min_lr_ratio,
            num_cycles=self.cfg.num_cycles,
            warmup_from_one=self.cfg.warmup_from_one,
        )

    def apply(self) -> float:
        """Write the lr of the current step into the optimizer; returns it."""
        lr = self.cfg.lr * self.multiplier()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def step(self) -> None:
        """One optimizer step done."""
        self.step_count += 1

    def state_dict(self) -> dict[str, Any]:
        return {"step_count": self.step_count, "total_steps": self.total_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step_count = int(state["step_count"])
        if state.get("total_steps") is not None:
            self.total_steps = int(state["total_steps"])
