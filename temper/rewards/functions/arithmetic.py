"""Integer arithmetic reward (temper's toy task, data_source ``arithmetic``).

The answer is the number after the last ``####`` or, without one, the last integer in
the response; it must equal the integer ground truth (``"12"`` or ``12``). Score 1.0
correct, ``format_score`` (default 0.0) for a wrong integer, 0.0 when none was found.
"""

from __future__ import annotations

import re
from typing import Any

from temper.rewards.functions._numbers import clean_number, last_hashes_answer

_INT_RE = re.compile(r"-?\d[\d,]*")


def extract_integer(text: str) -> int | None:
    """The answer after the last ``####``, else the last integer; None if absent/non-integer."""
    answer = last_hashes_answer(text)
    if answer is None:
        found = _INT_RE.findall(text)
        answer = clean_number(found[-1]) if found else None
    if answer is None:
        return None
    try:
        value = float(answer)
    except ValueError:
        return None
    return int(value) if value.is_integer() else None


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    format_score: float = 0.0,
    score: float = 1.0,
    **kwargs: Any,
) -> dict[str, Any]:
    """``{"score", "acc", "format_ok"}`` for one response."""
    target = int(str(ground_truth).strip())
    pred = extract_integer(solution_str)
    if pred is None:
        return {"score": 0.0, "acc": 0.0, "format_ok": False}
    correct = pred == target
    return {"score": score if correct else format_score, "acc": float(correct), "format_ok": True}
