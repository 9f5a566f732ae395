"""ROLL's asynchronous generation (``async_generation_ratio``) → ``async_training.staleness``."""

from __future__ import annotations

import pytest
from test_roll_dialect import MATH, merge, run

from temper.config.errors import ConfigError


@pytest.mark.parametrize("ratio", [1, 2, 1.0])
def test_whole_ratios_run_that_many_versions_ahead(ratio):
    cfg, notes = run(merge(MATH, {"async_generation_ratio": ratio}))
    assert cfg.async_training.staleness == int(ratio)
    (note,) = [n for n in notes if n.startswith("async_generation_ratio")]
    assert f"max(0, s - {int(ratio) + 1}) updates" in note and "partial rollout" in note


@pytest.mark.parametrize("ratio", [0, 0.0, None])
def test_zero_is_synchronous(ratio):
    cfg, notes = run(merge(MATH, {"async_generation_ratio": ratio}))
    assert cfg.async_training.staleness == 0
    assert not any(n.startswith("async_generation_ratio") for n in notes)


@pytest.mark.parametrize("ratio", [0.5, 1.5])
def test_fractional_ratios_are_refused_as_roll_refuses_them(ratio):
    with pytest.raises(ConfigError, match="async_generation_ratio.*whole number"):
        run(merge(MATH, {"async_generation_ratio": ratio}))
