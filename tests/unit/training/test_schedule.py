"""LR multipliers against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from temper.config.schema import OptimConfig
from temper.training.schedule import LRSchedule, lr_multiplier, resolve_warmup_steps


def test_warmup_then_constant() -> None:
    got = [lr_multiplier(s, warmup_steps=4) for s in range(6)]
    assert got == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0]


def test_linear_with_floor() -> None:
    # W=2, T=10: p = (s-2)/8; 0.1 + 0.9·(1-p)
    f = [
        lr_multiplier(s, schedule="linear", total_steps=10, warmup_steps=2, min_lr_ratio=0.1)
        for s in (2, 6, 10, 12)
    ]
    assert f == pytest.approx([1.0, 0.55, 0.1, 0.1])


def test_cosine_half_cycle_and_full_cycle() -> None:
    half = [lr_multiplier(s, schedule="cosine", total_steps=8) for s in (0, 2, 4, 8)]
    assert half == pytest.approx([1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5, 0.0])
    full = lr_multiplier(4, schedule="cosine", total_steps=8, num_cycles=1.0, min_lr_ratio=0.2)
    assert full == pytest.approx(0.2)  # cos(π) → floor at mid-run with one full cycle


def test_warmup_ratio_and_late_total() -> None:
    assert resolve_warmup_steps(-1, 0.25, 20) == 5
    assert resolve_warmup_steps(0, 0.25, 20) == 5
    assert resolve_warmup_steps(3, 0.25, 20) == 3
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = LRSchedule(opt, OptimConfig(lr=2.0, lr_scheduler="linear", warmup_ratio=0.5))
    with pytest.raises(ValueError, match="total"):
        sched.apply()
    sched.set_total_steps(4)
    lrs = []
    for _ in range(5):
        lrs.append(sched.apply())
        sched.step()
    assert lrs == pytest.approx([0.0, 1.0, 2.0, 1.0, 0.0])
    assert opt.param_groups[0]["lr"] == pytest.approx(0.0)


def test_a_schedule_counted_from_one_starts_one_step_in() -> None:
    """``zero_indexed_step: false`` (torchtitan's count): the first update uses the
    multiplier of step 1 — W=2, T=6 cosine: [½, 1, ½(1+cos(π/4)), ½, ½(1−cos(π/4)), 0]."""
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    cfg = OptimConfig(lr=1.0, lr_scheduler="cosine", warmup_steps=2, zero_indexed_step=False)
    sched = LRSchedule(opt, cfg, total_steps=6)
    lrs = []
    for _ in range(6):
        lrs.append(sched.apply())
        sched.step()
    c = math.cos(math.pi / 4)
    assert lrs == pytest.approx([0.5, 1.0, 0.5 * (1 + c), 0.5, 0.5 * (1 - c), 0.0])


def test_warmup_from_one_counts_the_update_being_taken() -> None:
    """``warmup_from_one`` (torchtitan's LambdaLR): W=2, T=6 linear, updates 0..6 —
    warmup [½, 1] at updates 0 and 1, then the decay from completed updates
    (s − W)/(T − W): [1, ¾, ½, ¼, 0]."""
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    cfg = OptimConfig(lr=1.0, lr_scheduler="linear", warmup_steps=2, warmup_from_one=True)
    sched = LRSchedule(opt, cfg, total_steps=6)
    lrs = []
    for _ in range(7):
        lrs.append(sched.apply())
        sched.step()
    assert lrs == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0])


def test_sqrt_decay() -> None:
    # W=0, T=4, floor 0.2: 0.2 + 0.8·(1 − √(s/4))
    got = [lr_multiplier(s, schedule="sqrt", total_steps=4, min_lr_ratio=0.2) for s in (0, 1, 4)]
    assert got == pytest.approx([1.0, 0.2 + 0.8 * 0.5, 0.2])
