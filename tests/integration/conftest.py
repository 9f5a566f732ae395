"""Fixtures the integration modules share."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray for a module's tests (each start costs seconds here); stopped when
    the module ends, so the next module's settings start a fresh one."""
    ray = pytest.importorskip("ray")
    yield
    if ray.is_initialized():
        ray.shutdown()
