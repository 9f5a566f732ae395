"""Tools an agent may call during an episode, and their registry.

A tool is a plain Python callable taking keyword arguments and returning text,
plus an OpenAI function schema (``{"type": "function", "function": {"name",
"description", "parameters"}}``) that the rollout loop passes to the chat
template. The tool-calling *loop* lives in ``temper.rollout``; it calls
``execute_tool(name, arguments)`` here and shows ``ToolResult.content`` to the
model as the tool message.

Execution rules:

- arguments may be a dict or a JSON string (what models emit); bad JSON, an
  unknown tool, or unexpected arguments give ``ok=False`` with the error as
  content — never an exception into the loop;
- each call runs in a daemon worker thread and is abandoned after ``timeout_s``
  (the result is then an error). A Python thread cannot be killed, so tools must
  bound their own work too: the calculator caps sizes and exponents.

The calculator evaluates arithmetic by walking the ``ast`` of the expression
(numbers, ``+ - * / // % **``, unary ``+ -``, parentheses and ``abs``, ``round``,
``min``, ``max``, ``sqrt``); no name lookup, attribute, subscript or ``eval``
is ever reached, so ``__import__('os')`` is rejected.
"""

from __future__ import annotations

import ast
import json
import math
import operator
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from temper.registry import Registry

__all__ = [
    "CALCULATOR_SCHEMA",
    "ToolError",
    "ToolResult",
    "ToolSpec",
    "calculate",
    "execute_tool",
    "get_tool",
    "register_tool",
    "safe_eval",
    "tool_names",
    "tool_schemas",
]


class ToolError(ValueError):
    """A tool refused its input (shown to the model as the tool's error text)."""


@dataclass(frozen=True)
class ToolSpec:
    """A registered tool."""

    name: str
    fn: Callable[..., str]
    schema: dict[str, Any]  # OpenAI function schema
    timeout_s: float = 5.0


@dataclass
class ToolResult:
    """The outcome of one tool call."""

    name: str
    ok: bool
    content: str  # the result text, or "error: …"
    elapsed_s: float
    timed_out: bool = False


# --------------------------------------------------------------------------- calculator

_MAX_EXPR_CHARS = 500
_MAX_ABS = 10**100
_MAX_EXPONENT = 256
_BIN: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
}


def _check(value: Any) -> int | float:
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("result is not a finite number")
    if abs(value) > _MAX_ABS:
        raise ToolError("number too large")
    return value


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ToolError(f"unsupported constant {node.value!r}")
        return _check(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT and abs(left) > 1:
            raise ToolError("exponent too large")
        try:
            return _check(_BIN[type(node.op)](left, right))
        except ZeroDivisionError as e:
            raise ToolError("division by zero") from e
        except OverflowError as e:
            raise ToolError("number too large") from e
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCS
        and not node.keywords
    ):
        args = [_eval(a) for a in node.args]
        try:
            return _check(_FUNCS[node.func.id](*args))
        except (TypeError, ValueError) as e:
            raise ToolError(f"{node.func.id}: {e}") from e
    raise ToolError(f"unsupported syntax: {type(node).__name__}")


def safe_eval(expression: str) -> int | float:
    """Evaluate an arithmetic expression without ``eval`` (rules in the module docstring).

    ``^`` is read as power (models write ``2^3``). Raises ``ToolError``.
    """
    expr = str(expression).strip().replace("^", "**").replace("×", "*").replace("÷", "/")
    if not expr:
        raise ToolError("empty expression")
    if len(expr) > _MAX_EXPR_CHARS:
        raise ToolError(f"expression longer than {_MAX_EXPR_CHARS} characters")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise ToolError(f"syntax error: {e.msg}") from e
    return _eval(tree)


def format_number(value: int | float) -> str:
    """``6.0`` → ``"6"``; other floats with up to 12 significant digits."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.12g}"
    return str(value)


def calculate(expression: str) -> str:
    """The calculator tool: the value of ``expression`` as text."""
    return format_number(safe_eval(expression))


CALCULATOR_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": (
            "Evaluate an arithmetic expression: numbers, + - * / // % ** (or ^), "
            "parentheses, abs, round, min, max, sqrt. Returns the value."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {
                    "type": "string",
                    "description": "The expression, e.g. '(25 - 5) * 3'.",
                }
            },
            "required": ["expression"],
        },
    },
}

# --------------------------------------------------------------------------- registry

TOOLS: Registry[ToolSpec] = Registry("tool")


def register_tool(spec: ToolSpec) -> ToolSpec:
    """Add (or replace) a tool under ``spec.name``."""
    if spec.schema.get("function", {}).get("name") != spec.name:
        raise ValueError(f"tool '{spec.name}': schema function name must be '{spec.name}'")
    TOOLS.add(spec.name, spec, replace=True)
    return spec


def tool_names() -> list[str]:
    """Registered tool names, sorted."""
    return TOOLS.names()


def get_tool(name: str) -> ToolSpec:
    """The tool called ``name``; ``UnknownNameError`` (a ``KeyError``) listing the known
    ones, with "did you mean", otherwise."""
    return TOOLS.get(name)


def tool_schemas(names: list[str] | None = None) -> list[dict[str, Any]]:
    """OpenAI function schemas of ``names`` (all tools when None), for the chat template."""
    return [get_tool(n).schema for n in (tool_names() if names is None else names)]


def execute_tool(
    name: str, arguments: dict[str, Any] | str | None, timeout_s: float | None = None
) -> ToolResult:
    """Run tool ``name`` with ``arguments`` (dict or JSON text) under a timeout; never raises."""
    start = time.monotonic()

    def fail(msg: str, timed_out: bool = False) -> ToolResult:
        return ToolResult(name, False, f"error: {msg}", time.monotonic() - start, timed_out)

    if name not in TOOLS:
        return fail(f"unknown tool '{name}' (known: {', '.join(tool_names())})")
    spec = TOOLS.get(name)
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as e:
            return fail(f"arguments are not valid JSON: {e.msg}")
    arguments = arguments or {}
    if not isinstance(arguments, dict):
        return fail("arguments must be a JSON object")
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["out"] = str(spec.fn(**arguments))
        except TypeError as e:
            box["err"] = f"bad arguments: {e}"
        except Exception as e:
            box["err"] = str(e) or type(e).__name__

    worker = threading.Thread(target=run, name=f"tool-{name}", daemon=True)
    worker.start()
    worker.join(spec.timeout_s if timeout_s is None else timeout_s)
    if worker.is_alive():
        return fail(f"timed out after {spec.timeout_s if timeout_s is None else timeout_s}s", True)
    if "err" in box:
        return fail(box["err"])
    return ToolResult(name, True, box["out"], time.monotonic() - start)


register_tool(ToolSpec("calculator", calculate, CALCULATOR_SCHEMA, timeout_s=2.0))
