"""ROLL's env tools (GEM's text tools): a tool reads a tagged call out of the model's
whole answer, runs it, and returns the observation the model sees next.

Unlike the chat tools of :mod:`temper.envs.tools` (JSON function calls through the chat
template), an env tool is wrapped around an environment
(:class:`temper.envs.tool_wrapper.ToolEnvWrapper`) and parses the answer text itself.
:data:`ENV_TOOLS` is keyed by ROLL's ``tool_id``:

- ``python_code`` (:class:`PythonCodeTool`): the first ``<code>…</code>`` or
  ```` ```python …``` ```` block (the one ending first) runs as a Python program in the
  code reward's sandbox (:mod:`temper.rewards.sandbox`: bubblewrap, no network, a fresh
  directory, CPU/memory/process limits) with a ``timeout`` in seconds; the observation
  is ``"Code execution result: " + stdout`` (and stderr, only its last line with
  ``keep_error_last_line``). A run that fails with a ``NameError`` is run once more with
  common imports prepended (math, itertools, collections, …), as GEM does. The call
  failed when the program failed or printed nothing.
- ``search`` (:class:`SearchTool`): the first ``<search>…</search>`` query goes to the
  retriever at ``search_url`` (the protocol of :mod:`temper.envs.retriever`); the
  observation is the ``topk`` documents inside ``<information>…</information>``; the call
  failed when the retriever did not answer.

``mcp`` (ROLL's MCP client tool) is refused by name (:data:`REFUSED_TOOLS`).
"""

from __future__ import annotations

import abc
import json
import re
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from temper.registry import Registry
from temper.rewards.sandbox import get_sandbox, sandbox_problem
from temper.rewards.sandbox_api import Limits

__all__ = ["ENV_TOOLS", "REFUSED_TOOLS", "EnvTool", "PythonCodeTool", "SearchTool", "ToolOutcome"]


@dataclass(frozen=True)
class ToolOutcome:
    """One answer offered to a tool: whether it held a call (``parsed``), whether the call
    failed (``error``), what the model sees next, and the answer up to the call's end."""

    parsed: bool
    error: bool
    observation: str
    parsed_action: str


class EnvTool(abc.ABC):
    """A tool an env tool wrapper offers (module docstring). Construction takes the
    tool's ``tool_args`` as keyword arguments."""

    tool_type: ClassVar[str] = ""

    @abc.abstractmethod
    def instruction(self) -> str:
        """What the first observation tells the model about the tool."""

    @abc.abstractmethod
    def execute(self, action: str) -> ToolOutcome:
        """Find a call in the whole answer ``action`` and run it."""

    def problem(self) -> str | None:
        """Why the tool cannot run on this machine, or None (``temper check``)."""
        return None


# --------------------------------------------------------------------------- python

_PYTHON_PATTERNS = (r"<code>(.*?)</code>", r"```\n?python(.*?)```")
#: prepended when a program fails on an undefined name (models leave out imports)
_PRELUDE = (
    "import math, itertools, collections, functools, fractions, decimal, statistics, re, "
    "string, heapq, bisect, random\n"
    "from math import *\n"
    "from itertools import *\n"
    "from collections import Counter, defaultdict, deque, OrderedDict\n"
    "from fractions import Fraction\n"
    "from functools import lru_cache, reduce\n"
)


class PythonCodeTool(EnvTool):
    """Run the answer's Python block in the sandbox (module docstring)."""

    tool_type = "python_code"

    def __init__(
        self,
        *,
        timeout: float = 5.0,
        sandbox: str = "bwrap",
        keep_error_last_line: bool = False,
        tool_instruction: str | None = None,
        patterns: Sequence[str] | None = None,
        memory_mb: int = 512,
    ) -> None:
        if timeout <= 0:
            raise ValueError("timeout must be positive (seconds)")
        if sandbox not in ("bwrap", "none"):
            raise ValueError(f"sandbox {sandbox!r}: use bwrap (contained) or none (a bare process)")
        self.timeout, self.sandbox_name = float(timeout), sandbox
        self.keep_error_last_line = bool(keep_error_last_line)
        self.patterns = [re.compile(p, re.DOTALL) for p in (patterns or _PYTHON_PATTERNS)]
        self.tool_instruction = tool_instruction
        self.limits = Limits(wall_time_s=self.timeout, cpu_time_s=self.timeout, memory_mb=memory_mb)

    def instruction(self) -> str:
        if self.tool_instruction:
            return self.tool_instruction
        return (
            "You may run Python code while you reason: write a complete program inside "
            "<code>...</code> (imports included, no markdown inside the tags) and print "
            "every value you need; the program runs in a sandbox and its printed output "
            "is shown to you before you continue. Use code for calculations that are "
            "long or error-prone, and keep reasoning step by step around it."
        )

    def problem(self) -> str | None:
        return sandbox_problem(self.sandbox_name)

    def parse(self, action: str) -> tuple[str | None, str]:
        """The code of the block that ends first, and the answer up to its end."""
        code, end = None, len(action) + 1
        for pattern in self.patterns:
            m = pattern.search(action)
            if m and m.end() < end:
                code, end = m.group(1).strip(), m.end()
        return code, action[:end] if code is not None else action

    def run(self, code: str) -> tuple[bool, str, str]:
        """``(ok, stdout, stderr)`` of the program in the sandbox."""
        box = get_sandbox(self.sandbox_name)
        res = box.run_program("python", {"main.py": code}, "main.py", b"", self.limits)
        stdout = res.stdout.decode("utf-8", "replace")
        stderr = res.stderr.decode("utf-8", "replace").strip()
        if res.timed_out:
            stderr = f"Execution timed out after {self.timeout:g} seconds."
        return res.ok, stdout, stderr

    def execute(self, action: str) -> ToolOutcome:
        code, parsed_action = self.parse(action)
        if code is None:
            return ToolOutcome(False, True, "", parsed_action)
        ok, stdout, stderr = self.run(code)
        if not ok and "is not defined" in stderr:
            ok, stdout, stderr = self.run(_PRELUDE + code)
        if stderr and self.keep_error_last_line:
            stderr = stderr.split("\n")[-1]
        result = (f"{stdout}\n{stderr}" if stderr else stdout).lstrip(" \n")
        error = not ok or not result
        return ToolOutcome(True, error, f"Code execution result: {result}\n", parsed_action)


# --------------------------------------------------------------------------- search

_SEARCH = re.compile(r"<search>(.*?)</search>", re.DOTALL)
SEARCH_ERROR = "[SearchTool Error:"


class SearchTool(EnvTool):
    """Send the answer's ``<search>`` query to a retriever (module docstring)."""

    tool_type = "search"

    def __init__(
        self,
        *,
        search_url: str | None = None,
        topk: int = 3,
        timeout: float = 5.0,
        num_workers: int = 1,
    ) -> None:
        # num_workers: GEM's pool size for batched calls; calls here are one at a time
        if not search_url:
            raise ValueError(
                "search_url is required: the retriever's URL (http://host:port/retrieve)"
            )
        if topk < 1:
            raise ValueError("topk must be at least 1")
        self.search_url, self.topk, self.timeout = str(search_url), int(topk), float(timeout)

    def instruction(self) -> str:
        return (
            "A search engine can help you answer. Reason inside <think>...</think>; when "
            "you find you are missing some knowledge, write a query as "
            "<search> your query </search> and the results will be shown to you inside "
            "<information>...</information>. You may think and search as often as you "
            "need. Give the final answer as <answer> your answer </answer>."
        )

    def problem(self) -> str | None:
        try:
            self.query("test")
        except Exception as err:
            return f"the retriever at {self.search_url} does not answer: {err}"
        return None

    def query(self, text: str) -> list[dict[str, Any]]:
        """The retriever's ranked results for ``text`` (raises on failure)."""
        request = {"query": text, "topk": self.topk, "return_scores": True}
        try:
            import msgpack
        except ImportError:
            msgpack = None
        if msgpack is not None:
            body, kind = msgpack.packb(request), "application/msgpack"
        else:
            body, kind = json.dumps(request).encode(), "application/json"
        req = urllib.request.Request(self.search_url, body, {"Content-Type": kind}, method="POST")
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            data = resp.read()
            if "json" in (resp.headers.get("Content-Type") or "") or msgpack is None:
                payload = json.loads(data)
            else:
                payload = msgpack.unpackb(data)
        return list(payload["result"])

    @staticmethod
    def passages(results: Sequence[dict[str, Any]]) -> str:
        """``Doc i(Title: <first line>) <rest>`` per result, one per line."""
        out = []
        for i, item in enumerate(results, start=1):
            title, _, text = str(item["document"]["contents"]).partition("\n")
            out.append(f"Doc {i}(Title: {title}) {text}\n")
        return "".join(out)

    def execute(self, action: str) -> ToolOutcome:
        m = _SEARCH.search(action)
        if m is None:
            return ToolOutcome(False, True, "", "")
        try:
            found = self.passages(self.query(m.group(1).strip()))
        except Exception as err:  # an unreachable retriever is a failed call, not a crash
            found = f"{SEARCH_ERROR} {err}]"
        observation = f"\n\n<information>{found}</information>\n\n"
        return ToolOutcome(True, SEARCH_ERROR in found, observation, action[: m.end()])


# --------------------------------------------------------------------------- registry

#: ROLL ``tool_id`` -> tool class
ENV_TOOLS: Registry[type[EnvTool]] = Registry("env tool")
ENV_TOOLS.add("python_code", PythonCodeTool)
ENV_TOOLS.add("search", SearchTool)

#: tool ids ROLL has that cannot run here, and why
REFUSED_TOOLS = {
    "mcp": "ROLL's MCP tool is a client of a Model Context Protocol server (the fastmcp "
    "package and a server at server_url), neither of which temper ships",
}
