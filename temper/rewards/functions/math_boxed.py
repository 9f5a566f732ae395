"""MATH reward: the last ``\\boxed{…}`` answer checked with ``math-verify``.

The response's last ``\\boxed{...}`` (or ``\\fbox{...}``; nested braces handled) is
parsed and compared with the ground truth by ``math_verify.parse``/``verify``, so
``\\frac{1}{2}``, ``\\dfrac12`` and ``0.5`` are equal and ``x^2+1`` equals ``1+x^2``.
Score 1.0 correct, ``format_score`` (default 0.0) for a wrong boxed answer, 0.0 when
nothing is boxed. A ground truth math-verify cannot parse is compared as a string.

math-verify's own SIGALRM timeouts (``parse_timeout_s``/``verify_timeout_s``) are used
only on a process's main thread (signals do not work elsewhere); the reward executor's
per-sample timeout is the outer guard against pathological inputs.
"""

from __future__ import annotations

import threading
from typing import Any

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def _braced(text: str, open_idx: int) -> str | None:
    """Content of the brace group opening at ``text[open_idx] == '{'`` (nesting aware)."""
    depth = 0
    for i in range(open_idx, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_idx + 1 : i]
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` (``\\boxed 5`` too), or None."""
    start = max(text.rfind(cmd) for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    cmd = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    rest = start + len(cmd)
    if text.startswith(" ", rest) and not text[rest:].lstrip().startswith("{"):
        token = text[rest:].split("$")[0].strip().split()
        return token[0] if token else None
    brace = text.find("{", rest)
    if brace < 0 or text[rest:brace].strip():
        return None
    return _braced(text, brace)


def _strip_math_delimiters(text: str) -> str:
    text = text.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if text.startswith(left) and text.endswith(right) and len(text) > len(left + right):
            return text[len(left) : -len(right)].strip()
    return text


def answers_equal(
    pred: str, truth: str, parse_timeout_s: int = 5, verify_timeout_s: int = 5
) -> bool:
    """math-verify equivalence of two LaTeX answers (without ``$`` delimiters)."""
    from math_verify import parse, verify

    on_main = threading.current_thread() is threading.main_thread()
    p_t = parse_timeout_s if on_main else None
    v_t = verify_timeout_s if on_main else None
    truth_inner = last_boxed(truth) or _strip_math_delimiters(truth)
    gold = parse(f"${truth_inner}$", parsing_timeout=p_t)
    if not gold:
        return pred.strip() == truth_inner.strip()
    answer = parse(f"${pred}$", parsing_timeout=p_t)
    if not answer:
        return pred.strip() == truth_inner.strip()
    return bool(verify(gold, answer, timeout_seconds=v_t))


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    format_score: float = 0.0,
    score: float = 1.0,
    parse_timeout_s: int = 5,
    verify_timeout_s: int = 5,
    **kwargs: Any,
) -> dict[str, Any]:
    """``{"score", "acc", "format_ok", "pred"}`` for one response."""
    pred = last_boxed(solution_str)
    if pred is None:
        return {"score": 0.0, "acc": 0.0, "format_ok": False, "pred": ""}
    correct = answers_equal(pred, str(ground_truth), parse_timeout_s, verify_timeout_s)
    return {
        "score": score if correct else format_score,
        "acc": float(correct),
        "format_ok": True,
        "pred": pred,
    }
