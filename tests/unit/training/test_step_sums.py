"""StepSums: a mini-batch's loss and metric sums held as tensors until the end equal the
Python float sums they replace, bit for bit."""

from __future__ import annotations

import torch

from temper.training.step_sums import StepSums


def test_sums_equal_python_float_sums_in_order() -> None:
    g = torch.Generator().manual_seed(0)
    parts = [
        {
            "loss": torch.randn((), generator=g),
            "kl": torch.randn((), generator=g, dtype=torch.float64),
            "clip": torch.randn((), generator=g).to(torch.bfloat16),
            "count": 3,  # a Python number among tensors
        }
        for _ in range(5)
    ]
    sums = StepSums()
    expected: dict[str, float] = {}
    for part in parts:
        sums.add(part)
        for k, v in part.items():
            expected[k] = expected.get(k, 0.0) + float(v)
    got = sums.floats()
    assert list(got) == ["loss", "kl", "clip", "count"]
    assert got == expected  # exact: float64 sums in the same order as Python's
    assert all(type(v) is float for v in got.values())


def test_a_key_first_seen_later_and_detached_values() -> None:
    w = torch.ones((), requires_grad=True)
    sums = StepSums()
    sums.add({"a": w * 2})
    sums.add({"a": w * 3, "b": torch.tensor([1.5])})  # one-element tensors of any shape
    assert sums.floats() == {"a": 5.0, "b": 1.5}
    assert StepSums().floats() == {}
