"""Safe reading of ROLL ``device_mapping`` strings such as ``'list(range(0,16))'``."""

from __future__ import annotations

import ast
from typing import Any

from temper.config.errors import ConfigError

MAX_DEVICES = 65536


def parse_device_mapping(value: Any, key: str = "device_mapping") -> list[int] | None:
    """``'list(range(0,8))'`` -> ``[0..7]``, evaluated safely.

    Only int literals, list/tuple displays, ``list(...)``, ``range(...)``, ``+`` and
    ``*`` are allowed; anything else (names, attributes, other calls) is rejected.
    """
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        out = list(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        out = [value]
    elif isinstance(value, str):
        try:
            tree = ast.parse(value.strip(), mode="eval")
        except SyntaxError as err:
            raise _bad_mapping(key, value, "not an expression") from err
        out = _eval(tree.body, key, value)
        if isinstance(out, range):
            out = list(out)
        if isinstance(out, int):
            out = [out]
    else:
        raise _bad_mapping(key, value, f"a {type(value).__name__}")
    if not isinstance(out, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in out
    ):
        raise _bad_mapping(key, value, "not a list of non-negative device ids")
    if len(set(out)) != len(out):
        raise _bad_mapping(key, value, "a device id appears twice")
    return out


def _bad_mapping(key: str, value: Any, why: str) -> ConfigError:
    return ConfigError(
        key,
        f"cannot read device_mapping {value!r}: {why}",
        "write a list of device ids, e.g. [0, 1, 2, 3] or 'list(range(0,4))'",
    )


def _size(x: Any) -> int:
    return len(x) if isinstance(x, (list, range)) else 1


def _eval(node: ast.AST, key: str, text: str) -> Any:
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int)
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _eval(node.operand, key, text)
        if isinstance(inner, int):
            return -inner
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [_eval(e, key, text) for e in node.elts]
        if all(isinstance(i, int) for i in items):
            return items
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        args = [_eval(a, key, text) for a in node.args]
        if (
            node.func.id == "range"
            and 1 <= len(args) <= 3
            and all(isinstance(a, int) for a in args)
        ):
            r = range(*args)
            if len(r) > MAX_DEVICES:
                raise _bad_mapping(key, text, f"more than {MAX_DEVICES} devices")
            return r
        if node.func.id == "list" and len(args) == 1 and isinstance(args[0], (list, range)):
            return list(args[0])
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _eval(node.left, key, text), _eval(node.right, key, text)
        if isinstance(node.op, ast.Add):
            if isinstance(left, int) and isinstance(right, int):
                return left + right
            if isinstance(left, (list, range)) and isinstance(right, (list, range)):
                return list(left) + list(right)
        else:
            if isinstance(left, int) and isinstance(right, int):
                return left * right
            seq, n = (left, right) if isinstance(right, int) else (right, left)
            if isinstance(seq, (list, range)) and isinstance(n, int):
                if _size(seq) * max(n, 0) > MAX_DEVICES:
                    raise _bad_mapping(key, text, f"more than {MAX_DEVICES} devices")
                return list(seq) * n
    raise _bad_mapping(
        key,
        text,
        f"'{ast.unparse(node)}' is not allowed (only lists, range, list, int literals, + and *)",
    )
