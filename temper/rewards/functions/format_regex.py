"""Format reward: does the response match a regular expression?

Default pattern ``<think>.*</think>\\s*<answer>.*</answer>`` (DeepSeek-R1 style),
matched with ``re.DOTALL`` against the whole stripped response (``full=True``) or
anywhere in it (``full=False``). Score ``match_score`` (1.0) / ``miss_score`` (0.0).
"""

from __future__ import annotations

import functools
import re
from typing import Any

DEFAULT_PATTERN = r"<think>.*</think>\s*<answer>.*</answer>"


@functools.lru_cache(maxsize=64)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.DOTALL)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any = None,
    extra_info: Any = None,
    *,
    pattern: str = DEFAULT_PATTERN,
    full: bool = True,
    match_score: float = 1.0,
    miss_score: float = 0.0,
    **kwargs: Any,
) -> dict[str, Any]:
    """``{"score", "format_ok"}``."""
    regex = _compiled(pattern)
    text = solution_str.strip()
    ok = (regex.fullmatch(text) if full else regex.search(text)) is not None
    return {"score": match_score if ok else miss_score, "format_ok": ok}
