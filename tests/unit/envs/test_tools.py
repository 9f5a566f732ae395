"""Calculator safety and the tool registry's execution rules (timeouts, bad input)."""

from __future__ import annotations

import time

import pytest

from temper.envs.tools import (
    CALCULATOR_SCHEMA,
    ToolError,
    ToolSpec,
    calculate,
    execute_tool,
    register_tool,
    safe_eval,
    tool_schemas,
)


def test_arithmetic():
    assert calculate("(25 - 5) * 3") == "60"
    assert calculate("7 / 2") == "3.5"
    assert calculate("2^10") == "1024"
    assert calculate("-3 + abs(-4) + sqrt(16) + max(1, 2)") == "7"
    assert calculate("6 / 3") == "2"


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os')",
        "__import__('os').system('echo hi')",
        "open('/etc/passwd')",
        "(1).__class__",
        "[1, 2][0]",
        "x + 1",
        "lambda: 1",
        "'a' * 3",
        "True + 1",
        "1 if 1 else 2",
        "9 ** 9 ** 9",
        "10 ** 400",
        "1 / 0",
        "",
        "1 +",
        "1" * 600,
    ],
)
def test_rejected(expr):
    with pytest.raises(ToolError):
        safe_eval(expr)
    res = execute_tool("calculator", {"expression": expr})
    assert not res.ok and res.content.startswith("error:")


def test_execute_tool_inputs():
    assert execute_tool("calculator", '{"expression": "1+2"}').content == "3"
    assert "not valid JSON" in execute_tool("calculator", "{bad").content
    assert "bad arguments" in execute_tool("calculator", {"expr": "1"}).content
    assert "unknown tool" in execute_tool("nope", {}).content
    assert tool_schemas(["calculator"]) == [CALCULATOR_SCHEMA]
    assert CALCULATOR_SCHEMA["function"]["parameters"]["required"] == ["expression"]


def test_timeout():
    def slow(seconds: str) -> str:
        time.sleep(float(seconds))
        return "done"

    schema = {"type": "function", "function": {"name": "slow_test", "parameters": {}}}
    register_tool(ToolSpec("slow_test", slow, schema, timeout_s=0.1))
    start = time.monotonic()
    res = execute_tool("slow_test", {"seconds": "2"})
    assert res.timed_out and not res.ok and time.monotonic() - start < 1.0
    assert execute_tool("slow_test", {"seconds": "0"}, timeout_s=1.0).content == "done"
    with pytest.raises(ValueError):
        register_tool(ToolSpec("other", slow, schema))
