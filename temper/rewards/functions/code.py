"""``code``: run the response's program against the row's test cases, in a sandbox.

Test cases (``ground_truth``, a dict or its JSON string; or ROLL's columns in
``extra_info``):

- **stdin/stdout** — ``{"inputs": [...], "outputs": [...]}`` (PRIME, codecontests,
  TACO, APPS without ``fn_name``): each input is fed on stdin, the program's stdout must
  match the output (trailing whitespace per line and trailing blank lines ignored;
  otherwise token by token, numbers within 1e-6 absolute or relative);
- **call-based** — the same with ``"fn_name"`` (APPS, LeetCode style): each input is
  the argument list (or a string of one JSON value per line), the function (or the
  method of ``class Solution``) is called with it, and its return value must equal the
  output, or its only element (APPS stores ``[value]``); tuples compare as lists;
- **ROLL** ``extra_info.case_type`` / ``extra_info.test_cases``: ``input`` (a list of
  ``{"stdin", "expected_stdout"}``), ``assert`` and ``pytest`` (a list of
  ``{"assert_code"}``: the code, then the asserts, then every ``test_*`` function it
  defines is called). ROLL's ``check_based`` and ``text`` cases are refused (recorded as
  that sample's failure).

The program is the last fenced block of the response (```` ```python ````, ```` ```py ````
or an untagged fence; the text after the last ``</think>``); a response without one
scores 0 with ``format_ok: False``. Each test runs in its own sandbox execution
(``temper.rewards.sandbox``: ``reward.sandbox`` and ``reward.sandbox_limits``); the
sample as a whole stops at ``sample_timeout_s`` and the tests not run by then fail.

``score_mode``: ``all`` (1 when every test passes, else 0 — verl's and ROLL's default;
stops at the first failing test) or ``fraction`` (the share of tests passed).
Python runs in the local sandboxes; other languages (a ```` ```cpp ```` fence, or
``extra_info.language``) need ``reward.sandbox=sandbox_fusion``.

Returns ``{"score", "acc", "passed", "total", "format_ok"}``. A response that fails
tests is a score, not a failure; what raises — unreadable test cases, a sandbox that
cannot start — is recorded as the sample's reward failure.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from temper.rewards.sandbox_api import ExecResult, Limits, Sandbox

SCORE_MODES = ("all", "fraction")
PYTHON_TAGS = ("python", "python3", "py", "")
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+#-]*)[^\n]*\n(.*?)```", re.DOTALL)
_LANGUAGES = {"py": "python", "python3": "python", "": "python", "c++": "cpp", "js": "javascript"}
RESULT_MARK = "\n@@temper-result@@"


@dataclass(frozen=True)
class TestCase:
    """One test: ``stdin`` for the program and what must come back."""

    stdin: str
    expected: Any  # stdout text, or the call's return value
    kind: str  # "stdio" | "call" | "assert"


@dataclass(frozen=True)
class TestSuite:
    tests: list[TestCase]
    fn_name: str | None = None
    assert_code: list[str] | None = None


# --------------------------------------------------------------------------- parsing


def extract_code(response: str) -> tuple[str | None, str]:
    """``(code, language)`` of the last fenced block after the last ``</think>``."""
    text = response.rsplit("</think>", 1)[-1]
    blocks = _FENCE.findall(text)
    if not blocks:
        return None, "python"
    tag, code = blocks[-1]
    tag = tag.strip().lower()
    return code, _LANGUAGES.get(tag, tag)


def _loads(value: Any) -> Any:
    if isinstance(value, (str, bytes)):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _stdin_text(value: Any) -> str:
    if isinstance(value, list):
        return "\n".join(str(v) for v in value) + "\n"
    return str(value)


def _call_args(value: Any) -> list[Any]:
    if isinstance(value, str):  # LeetCode/LiveCodeBench: one JSON value per line
        return [json.loads(line) for line in value.splitlines() if line.strip()]
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def parse_tests(ground_truth: Any, extra_info: Mapping[str, Any] | None) -> TestSuite:
    """The row's test cases (see the module doc); ``ValueError`` when there are none."""
    extra = dict(extra_info or {})
    case_type = extra.get("case_type")
    if case_type:  # ROLL's columns
        cases = _loads(extra.get("test_cases"))
        if not isinstance(cases, list) or not cases:
            raise ValueError(f"case_type {case_type!r} but test_cases is not a non-empty list")
        if case_type == "input":
            return TestSuite(
                [TestCase(_stdin_text(c["stdin"]), c["expected_stdout"], "stdio") for c in cases]
            )
        if case_type in ("assert", "pytest"):
            codes = [c["assert_code"] if isinstance(c, dict) else str(c) for c in cases]
            return TestSuite([TestCase("", None, "assert") for _ in codes], assert_code=codes)
        raise ValueError(
            f"ROLL case_type {case_type!r} is not supported by the code reward "
            "(supported: input, assert, pytest)"
        )
    truth = _loads(ground_truth)
    if not isinstance(truth, Mapping) or "inputs" not in truth or "outputs" not in truth:
        raise ValueError(
            "code reward: ground_truth must hold test cases as {'inputs': [...], 'outputs': "
            "[...]} (optionally 'fn_name'), or extra_info case_type/test_cases (ROLL)"
        )
    inputs, outputs = list(truth["inputs"]), list(truth["outputs"])
    if len(inputs) != len(outputs) or not inputs:
        raise ValueError(f"code reward: {len(inputs)} inputs for {len(outputs)} outputs")
    fn_name = truth.get("fn_name") or None
    if fn_name:
        tests = [
            TestCase(json.dumps(_call_args(i)), _loads(o) if isinstance(o, str) else o, "call")
            for i, o in zip(inputs, outputs)
        ]
        return TestSuite(tests, fn_name=str(fn_name))
    return TestSuite(
        [TestCase(_stdin_text(i), _stdin_text(o), "stdio") for i, o in zip(inputs, outputs)]
    )


# --------------------------------------------------------------------------- judging


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _number(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def stdout_matches(actual: str, expected: str) -> bool:
    """Same lines up to trailing whitespace, else same tokens with numbers within 1e-6."""
    if _lines(actual) == _lines(expected):
        return True
    got, want = actual.split(), expected.split()
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        if g == w:
            continue
        a, b = _number(g), _number(w)
        if a is None or b is None or not math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6):
            return False
    return True


def _plain(value: Any) -> Any:
    """Tuples as lists, recursively (JSON's view of a return value)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def call_matches(result: Any, expected: Any) -> bool:
    result, expected = _plain(result), _plain(expected)
    if result == expected:
        return True
    return isinstance(expected, list) and len(expected) == 1 and result == expected[0]


# --------------------------------------------------------------------------- programs

_CALL_HARNESS = """\
import json, sys
_ns = {"__name__": "__solution__"}
exec(compile(open("solution.py").read(), "solution.py", "exec"), _ns)
_name = %r
_fn = _ns.get(_name)
if _fn is None and "Solution" in _ns:
    _fn = getattr(_ns["Solution"](), _name)
_args = json.loads(sys.stdin.read())
_out = _fn(*_args)
sys.stdout.write(%r + json.dumps(_out, default=repr) + "\\n")
"""

_ASSERT_RUNNER = """
for _name, _obj in list(globals().items()):
    if _name.startswith("test_") and callable(_obj):
        _obj()
"""


def _program(suite: TestSuite, code: str, test: TestCase, index: int) -> dict[str, str]:
    if test.kind == "call":
        return {"main.py": _CALL_HARNESS % (suite.fn_name, RESULT_MARK), "solution.py": code}
    if test.kind == "assert":
        assert suite.assert_code is not None
        return {"main.py": f"{code}\n\n{suite.assert_code[index]}\n{_ASSERT_RUNNER}"}
    return {"main.py": code}


def _passed(test: TestCase, res: ExecResult) -> bool:
    if not res.ok:
        return False
    out = res.stdout.decode("utf-8", "replace")
    if test.kind == "assert":
        return True
    if test.kind == "stdio":
        return stdout_matches(out, str(test.expected))
    if RESULT_MARK not in out:
        return False
    try:
        value = json.loads(out.rsplit(RESULT_MARK, 1)[1])
    except json.JSONDecodeError:
        return False
    return call_matches(value, test.expected)


def run_tests(
    box: Sandbox,
    code: str,
    suite: TestSuite,
    *,
    language: str,
    limits: Limits,
    score_mode: str,
    sample_timeout_s: float,
) -> dict[str, Any]:
    """Run ``suite`` on ``code``: ``{"passed", "total", "ran", "error"}``."""
    deadline = time.monotonic() + sample_timeout_s
    passed, ran, error = 0, 0, ""
    for i, test in enumerate(suite.tests):
        left = deadline - time.monotonic()
        if left <= 0.05:
            error = f"sample time limit ({sample_timeout_s:g} s) reached"
            break
        wall = min(limits.wall_time_s, left)
        run_limits = Limits(**{**limits.__dict__, "wall_time_s": wall})
        res = box.run_program(
            language, _program(suite, code, test, i), "main.py", test.stdin.encode(), run_limits
        )
        ran += 1
        if _passed(test, res):
            passed += 1
        else:
            error = error or f"test {i}: {res.describe() if not res.ok else 'wrong answer'}"
            if score_mode == "all":
                break
    return {"passed": passed, "total": len(suite.tests), "ran": ran, "error": error}


# --------------------------------------------------------------------------- entry


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    score_mode: str = "all",
    sandbox: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Score one response (see the module doc). ``sandbox``: ``{"name", "limits",
    "sample_timeout_s", "url"}`` as the reward manager passes it from ``reward.*``."""
    from temper.rewards.sandbox import get_sandbox

    if score_mode not in SCORE_MODES:
        raise ValueError(f"score_mode must be one of {', '.join(SCORE_MODES)}, got {score_mode!r}")
    settings = dict(sandbox or {})
    extra = extra_info if isinstance(extra_info, Mapping) else {}
    suite = parse_tests(ground_truth, extra)
    code, language = extract_code(solution_str)
    wanted = str(extra.get("language") or "python").lower()
    wanted = _LANGUAGES.get(wanted, wanted)
    if code is None:
        return {
            "score": 0.0,
            "acc": 0.0,
            "passed": 0,
            "total": len(suite.tests),
            "format_ok": False,
        }
    if language != wanted:  # the model answered in another language than the task's
        return {
            "score": 0.0,
            "acc": 0.0,
            "passed": 0,
            "total": len(suite.tests),
            "format_ok": False,
        }
    box = get_sandbox(str(settings.get("name", "bwrap")), settings.get("url"))
    limits = Limits(**dict(settings.get("limits") or {}))
    timeout = float(settings.get("sample_timeout_s") or 30.0)
    out = run_tests(
        box,
        code,
        suite,
        language=language,
        limits=limits,
        score_mode=score_mode,
        sample_timeout_s=timeout,
    )
    total = out["total"]
    fraction = out["passed"] / total
    score = fraction if score_mode == "fraction" else float(out["passed"] == total)
    return {
        "score": score,
        "acc": float(out["passed"] == total),
        "passed": out["passed"],
        "total": total,
        "format_ok": True,
    }
