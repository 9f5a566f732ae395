"""Where the shared reference files are: ``shared/`` beside the checkout.

CI checks the repository out with ``shared/`` as its sibling (``../shared`` from the
repository root), and so does a developer machine laid out like CI. Tests that read
those files use :func:`needs` on their paths: present, the test runs; missing, it is
skipped on a developer machine but *fails* under ``CI=true``, where a missing
reference tree means the job is set up wrong and silently skipping the key-table
tests would hide it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[3]
SHARED = REPO.parent / "shared"
REFERENCE = SHARED / "reference"
UPSTREAM = REFERENCE / "upstream-configs"
SEEDS = REFERENCE / "seeds"

F = TypeVar("F", bound=Callable[..., Any])


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def needs(*paths: Path) -> Callable[[F], F]:
    """Run the test when every path exists; else skip it, or fail it under CI=true."""
    missing = [p for p in paths if not p.exists()]
    if not missing:
        return lambda fn: fn
    where = ", ".join(str(p) for p in missing)
    if in_ci():

        def fail(fn: F) -> F:
            @functools.wraps(fn)  # keeps the signature: parameters and fixtures still bind
            def missing_reference(*args: Any, **kwargs: Any) -> None:
                pytest.fail(f"CI=true but the reference files are missing: {where}")

            return missing_reference  # type: ignore[return-value]

        return fail
    return pytest.mark.skip(reason=f"reference files not beside the checkout: {where}")


def params(values: list[Any], *paths: Path) -> list[Any]:
    """``values`` for a parametrize list read from reference files; one placeholder when
    they are missing, so the test still runs and :func:`needs` skips or fails it (an
    empty list would be skipped silently, under CI too)."""
    if all(p.exists() for p in paths):
        return values
    return ["<reference files missing>"]
