"""One row per step, in step order, from the rows of a ``metrics.jsonl`` as written.

A run writes its steps in order, each metric once per step (a step may take two rows:
the training row, then a validation row of other keys). A file that breaks this holds
more than one run's record — two runs that shared an output directory interleave their
steps (1, 2, 3, 4, 3, 5, 4, …), and a resumed run re-logs the steps after its
checkpoint (the jsonl tracker drops the old rows on resume; a file copied or written
before that does not). Drawn as written, such a file zigzags and double-counts; so the
report draws the last value of each step's metric and says in one line what it found.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

#: Steps listed in the warning before "…".
SHOWN = 5


@dataclass(frozen=True)
class Steps:
    """``rows``: one per step, ascending, each metric's last value; ``warning``: one
    line when the file's rows were out of order or repeated a step's metric, else None."""

    rows: list[dict[str, Any]]
    warning: str | None


def _listed(steps: Iterable[int]) -> str:
    ordered = sorted(steps)
    more = ", …" if len(ordered) > SHOWN else ""
    return ", ".join(map(str, ordered[:SHOWN])) + more


def by_step(rows: list[dict[str, Any]], name: str = "metrics.jsonl") -> Steps:
    """Merge ``rows`` (each with an int-like ``step``) into one row per step."""
    merged: dict[int, dict[str, Any]] = {}
    backwards: tuple[int, int] | None = None  # (step, the later step it came after)
    repeated: set[int] = set()
    highest: int | None = None
    for row in rows:
        step = int(row["step"])
        if highest is not None and step < highest and backwards is None:
            backwards = (step, highest)
        highest = step if highest is None else max(highest, step)
        into = merged.setdefault(step, {"step": step})
        if any(key in into for key in row if key != "step"):
            repeated.add(step)
        into.update({k: v for k, v in row.items() if k != "step"})
    found = []
    if backwards is not None:
        found.append(f"steps out of order (step {backwards[0]} after step {backwards[1]})")
    if repeated:
        found.append(f"{len(repeated)} step(s) logged more than once ({_listed(repeated)})")
    warning = None
    if found:
        warning = (
            f"{name}: {' and '.join(found)}: it holds more than one run's rows (two runs "
            "in one output directory, or steps a resumed run logged again); drawing the "
            "last value of each step, in step order"
        )
    return Steps([merged[s] for s in sorted(merged)], warning)
