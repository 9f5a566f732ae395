"""Countdown reward (TinyZero task): reach the target using each given number once.

The equation is the content of the last ``<answer>…</answer>``, else the last line made
only of digits, ``+ - * /``, parentheses and spaces. An ``=`` keeps the side holding
operators (``"(3+5)*3 = 24"`` → ``(3+5)*3``). The expression is parsed with ``ast`` and
evaluated with exact fractions over integer literals, ``+ - * /``, unary minus and
parentheses only — names, calls, attributes, powers are rejected, nothing is ``eval``-ed.

Ground truth: ``{"target": int, "numbers": [int, …]}`` as a dict or a JSON string.
Score 1.0 when the equation uses exactly the given numbers (each once) and equals the
target; ``format_score`` (default 0.1) when it is well formed but wrong (other numbers,
wrong value, division by zero); 0.0 when no well-formed equation is found.
"""

from __future__ import annotations

import ast
import json
import re
from fractions import Fraction
from typing import Any

MAX_EQUATION_CHARS = 512
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_EQUATION_LINE_RE = re.compile(r"^[\d\s+\-*/().=]*\d[\d\s+\-*/().=]*$")
_BINARY = {ast.Add, ast.Sub, ast.Mult, ast.Div}


class _NotAllowed(ValueError):
    """The expression contains something other than integer arithmetic."""


def parse_ground_truth(ground_truth: Any) -> tuple[int, list[int]]:
    """``(target, numbers)`` from a dict or JSON string."""
    data = json.loads(ground_truth) if isinstance(ground_truth, str) else ground_truth
    return int(data["target"]), [int(n) for n in data["numbers"]]


def extract_equation(text: str) -> str | None:
    """The candidate equation (see module doc), without any ``= result`` side."""
    answers = _ANSWER_RE.findall(text)
    if answers:
        candidate = answers[-1].strip()
    else:
        lines = [ln.strip() for ln in text.splitlines()]
        candidate = next((ln for ln in reversed(lines) if _EQUATION_LINE_RE.match(ln)), None)
    if not candidate:
        return None
    if "=" in candidate:
        sides = [s.strip() for s in candidate.split("=")]
        with_ops = [s for s in sides if any(op in s for op in "+-*/")]
        candidate = with_ops[0] if with_ops else sides[0]
    return candidate or None


def _walk(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.Expression):
        return _walk(node.body, used)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _walk(node.operand, used)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _walk(node.left, used), _walk(node.right, used)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        return left / right  # ZeroDivisionError propagates
    raise _NotAllowed(type(node).__name__)


def evaluate_equation(expression: str) -> tuple[Fraction, list[int]]:
    """Exact value and the integer literals used; ``ValueError`` if not plain arithmetic.

    Raises ``ZeroDivisionError`` for a division by zero.
    """
    if len(expression) > MAX_EQUATION_CHARS:
        raise ValueError(f"equation longer than {MAX_EQUATION_CHARS} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as err:
        raise ValueError(f"not an expression: {err.msg}") from None
    used: list[int] = []
    return _walk(tree, used), used


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    format_score: float = 0.1,
    score: float = 1.0,
    **kwargs: Any,
) -> dict[str, Any]:
    """``{"score", "acc", "format_ok"}`` for one response."""
    target, numbers = parse_ground_truth(ground_truth)
    equation = extract_equation(solution_str)
    if equation is None:
        return {"score": 0.0, "acc": 0.0, "format_ok": False}
    try:
        value, used = evaluate_equation(equation)
    except ZeroDivisionError:
        return {"score": format_score, "acc": 0.0, "format_ok": True}
    except (ValueError, RecursionError):
        return {"score": 0.0, "acc": 0.0, "format_ok": False}
    correct = sorted(used) == sorted(numbers) and value == target
    return {"score": score if correct else format_score, "acc": float(correct), "format_ok": True}
