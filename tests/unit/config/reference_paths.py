"""Where the reference files the tests read are.

The upstream verl and ROLL files live in the repository, under ``tests/data/upstream``
(unmodified copies, with their Apache-2.0 notice), so every clone runs the tests that
read them. ``SHARED_UPSTREAM`` is the project's shared reference tree (``../shared``
beside the checkout) that the copy must equal; ``test_upstream_copy`` compares them
where it is present. Tests that read files elsewhere use :func:`needs` on their paths:
present, the test runs; missing, it is skipped on a developer machine but *fails*
under ``CI=true``, where a missing file means the job is set up wrong.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[3]
UPSTREAM = REPO / "tests" / "data" / "upstream"
SHARED = REPO.parent / "shared"
SHARED_UPSTREAM = SHARED / "reference" / "upstream-configs"

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
