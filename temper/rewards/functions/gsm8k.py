"""GSM8K reward (verl convention).

The answer is the number after the last ``#### `` in the response (``method="strict"``)
or the last number anywhere (``method="flexible"``); ``$`` and thousands commas are
stripped and the value compared exactly (as a decimal) with the ground truth. A ground
truth that is a full GSM8K solution (``"… #### 72"``) is reduced to its final number.

Score: 1.0 correct, ``format_score`` (default 0.0) when a number was found but is
wrong, 0.0 when none was found. Like verl, only the last 300 characters are searched.
"""

from __future__ import annotations

from typing import Any, Literal

from temper.rewards.functions._numbers import last_hashes_answer, last_number, numbers_equal

TAIL_CHARS = 300


def extract_gsm8k_answer(text: str, method: Literal["strict", "flexible"] = "strict") -> str | None:
    """The response's final answer (cleaned), or None."""
    tail = text[-TAIL_CHARS:]
    if method == "strict":
        return last_hashes_answer(tail)
    if method == "flexible":
        return last_number(tail)
    raise ValueError(f"gsm8k method must be 'strict' or 'flexible', got {method!r}")


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    method: Literal["strict", "flexible"] = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
    **kwargs: Any,
) -> dict[str, Any]:
    """``{"score", "acc", "format_ok", "pred"}`` for one GSM8K response."""
    truth = str(ground_truth)
    truth = last_hashes_answer(truth) or truth.strip()
    pred = extract_gsm8k_answer(solution_str, method)
    if pred is None:
        return {"score": 0.0, "acc": 0.0, "format_ok": False, "pred": ""}
    correct = numbers_equal(pred, truth)
    return {
        "score": score if correct else format_score,
        "acc": float(correct),
        "format_ok": True,
        "pred": pred,
    }
