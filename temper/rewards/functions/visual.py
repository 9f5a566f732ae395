"""Rewards of image tasks: temper's ``visual_color`` task and verl's geometry3k.

- ``visual_color``: 1.0 when the response opens with the ground-truth colour (after
  spaces/newlines; case and trailing punctuation ignored), else 0.0.
- ``geo3k`` (``hiyouga/geometry3k``, seed document 003's data): verl's rule,
  ``0.9 · accuracy + 0.1 · format``: accuracy 1 when the last ``\\boxed{…}`` equals the
  ground truth (math-verify, as the ``math`` reward), format 1 when the response is
  ``<think>…</think>`` followed by a boxed answer.
"""

from __future__ import annotations

import re
from typing import Any

from temper.rewards.functions.math_boxed import answers_equal, last_boxed

_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


_LEADING_WORD = re.compile(r"[A-Za-z]+")


def first_word(text: str) -> str:
    """The letters that open ``text`` after spaces/newlines, lower-cased ("" if none):
    ``"Red."`` → ``red``; a control character or symbol first (``"\x0cred"``) is no
    answer, so a policy cannot earn the reward with junk before the word."""
    match = _LEADING_WORD.match(text.lstrip(" \n"))
    return match.group(0).lower() if match else ""


def visual_color_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **_: Any
) -> float:
    """1.0 iff the first word of the answer is the colour ``ground_truth``."""
    return float(first_word(solution_str) == str(ground_truth).strip().lower())


def geo3k_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    format_weight: float = 0.1,
    **_: Any,
) -> float:
    """``(1 - format_weight) · accuracy + format_weight · format`` (verl's geo3k)."""
    boxed = last_boxed(solution_str)
    accuracy = float(boxed is not None and answers_equal(boxed, str(ground_truth)))
    formatted = float(_FORMAT.fullmatch(solution_str.strip()) is not None)
    return (1.0 - format_weight) * accuracy + format_weight * formatted
