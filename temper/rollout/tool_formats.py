"""Tool-call formats (verl ``rollout.multi_turn.format``): how a model writes a call, how
its results go back, and how the tools are described to a template that ignores them.

One :class:`ToolCallFormat` per name in :data:`TOOL_CALL_FORMATS`, the only list of them:

- ``hermes``: ``<tool_call>{"name": …, "arguments": {…}}</tool_call>``, one or more per
  turn (Hermes, Qwen2.5, Qwen3, SmolLM3 templates; verl's agent-loop default); each
  result goes back as its own ``tool`` message, rendered by the chat template.
- ``qwen``: the same calls; the results of one turn go back merged into one ``user``
  message, each wrapped ``<tool_response>\\n…\\n</tool_response>`` (verl's ``qwen`` format
  of its SGLang rollout: what Qwen2.5's template renders for ``tool`` messages, written
  out so that a plain ChatML template renders it the same way).
- ``qwen3_coder``: Qwen3-Coder / Qwen3.5 XML calls, ``<tool_call><function=NAME>
  <parameter=KEY>value</parameter>…</function></tool_call>``; a value is converted by
  the type its tool's schema declares (string otherwise); results as ``tool`` messages.
- ``llama3_json``: Llama-3.x JSON calls, a turn that is (after an optional
  ``<|python_tag|>``) ``{"name": …, "parameters": {…}}`` objects separated by ``;``;
  results as ``tool`` messages (Llama templates render them as ``ipython`` turns).

A parser never raises: what it cannot read becomes a :class:`ToolCall` with ``error``
set, which the tool loop answers with an error message instead of executing it.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from temper.registry import Registry


@dataclasses.dataclass
class ToolCall:
    """One parsed call; ``error`` set when it could not be parsed (then never executed)."""

    name: str | None
    arguments: dict[str, Any]
    error: str | None = None


#: ``parse(text, schemas)``: the calls of one model turn, in order; [] = a final answer.
Parser = Callable[[str, Sequence[dict[str, Any]]], list[ToolCall]]
#: ``results([(tool name or None, result text), …])``: the messages that answer a turn.
Results = Callable[[Sequence[tuple[str | None, str]]], list[dict[str, Any]]]


@dataclasses.dataclass(frozen=True)
class ToolCallFormat:
    """A tool-call syntax: its parser, how results are fed back, and its instructions."""

    parse: Parser
    results: Results
    syntax: str  # one line, for error messages and the manual
    call_example: str  # how to call, for templates that do not render ``tools=``


TOOL_CALL_FORMATS: Registry[ToolCallFormat] = Registry("tool-call format")

# --------------------------------------------------------------------------- parsers

_TAGGED = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _tagged_bodies(text: str) -> tuple[list[str], bool]:
    """Bodies of ``<tool_call>…</tool_call>`` blocks, and whether an unclosed one follows."""
    matches = list(_TAGGED.finditer(text))
    tail = text[matches[-1].end() :] if matches else text
    return [m.group(1) for m in matches], "<tool_call>" in tail


_UNCLOSED = ToolCall(None, {}, "unclosed <tool_call> (expected </tool_call>)")


def _json_call(body: str) -> ToolCall:
    """``{"name": …, "arguments"|"parameters": {…} or a JSON string of one}``."""
    try:
        obj = json.loads(body.strip())
    except json.JSONDecodeError as e:
        return ToolCall(None, {}, f"tool call is not valid JSON: {e.msg} at char {e.pos}")
    if not isinstance(obj, dict):
        return ToolCall(None, {}, "tool call must be a JSON object with 'name' and 'arguments'")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(None, {}, "tool call has no 'name'")
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return ToolCall(name, {}, f"'arguments' of {name} is not valid JSON: {e.msg}")
    if not isinstance(args, dict):
        return ToolCall(name, {}, f"'arguments' of {name} must be a JSON object")
    return ToolCall(name, args)


def parse_hermes(text: str, schemas: Sequence[dict[str, Any]] = ()) -> list[ToolCall]:
    """Hermes calls: each ``<tool_call>`` body a JSON object. An opening tag without its
    closing one counts as one malformed call, so a half-written call is answered with an
    error instead of being taken for a final answer."""
    bodies, unclosed = _tagged_bodies(text)
    calls = [_json_call(b) for b in bodies]
    return [*calls, _UNCLOSED] if unclosed else calls


_FUNCTION = re.compile(r"<function=([^>\n]*)>(.*?)</function>", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]*)>(.*?)</parameter>", re.DOTALL)


def _param_types(schemas: Sequence[dict[str, Any]], name: str) -> dict[str, str]:
    for s in schemas:
        fn = s.get("function", {})
        if fn.get("name") == name:
            props = (fn.get("parameters") or {}).get("properties") or {}
            return {k: str((v or {}).get("type", "string")) for k, v in props.items()}
    return {}


def _typed(value: str, kind: str) -> Any:
    """A parameter's text as the JSON type its schema declares; text when it does not
    read as that type (the tool then sees what the model wrote)."""
    if kind == "string":
        return value
    if value.lower() == "null":
        return None
    try:
        if kind == "integer":
            return int(value)
        if kind == "number":
            num = float(value)
            return int(num) if num.is_integer() else num
        if kind == "boolean":
            return {"true": True, "false": False}[value.lower()]
        return json.loads(value)  # object, array
    except (ValueError, KeyError):
        return value


def parse_qwen3_coder(text: str, schemas: Sequence[dict[str, Any]] = ()) -> list[ToolCall]:
    """Qwen3-Coder / Qwen3.5 XML calls: ``<tool_call>`` blocks each holding one
    ``<function=NAME>`` with ``<parameter=KEY>value</parameter>`` children (one newline
    around a value is the template's, not the value's)."""
    bodies, unclosed = _tagged_bodies(text)
    calls = []
    for body in bodies:
        fn = _FUNCTION.search(body)
        if fn is None:
            calls.append(ToolCall(None, {}, "tool call has no <function=NAME>…</function>"))
            continue
        name = fn.group(1).strip()
        if not name:
            calls.append(ToolCall(None, {}, "tool call has no function name"))
            continue
        types = _param_types(schemas, name)
        args: dict[str, Any] = {}
        for key, raw in _PARAMETER.findall(fn.group(2)):
            value = raw[1:] if raw.startswith("\n") else raw
            value = value[:-1] if value.endswith("\n") else value
            args[key.strip()] = _typed(value, types.get(key.strip(), "string"))
        calls.append(ToolCall(name, args))
    return [*calls, _UNCLOSED] if unclosed else calls


_PYTHON_TAG = "<|python_tag|>"


def parse_llama3_json(text: str, schemas: Sequence[dict[str, Any]] = ()) -> list[ToolCall]:
    """Llama-3.x JSON calls: a turn that starts (after ``<|python_tag|>`` or blanks) with
    ``{`` is a call, or several separated by ``;``; any other turn is a final answer."""
    body = text.strip()
    body = body[len(_PYTHON_TAG) :].strip() if body.startswith(_PYTHON_TAG) else body
    if not body.startswith("{"):
        return []
    decoder, calls, pos = json.JSONDecoder(), [], 0
    while pos < len(body):
        try:
            _, end = decoder.raw_decode(body, pos)
        except json.JSONDecodeError as e:
            calls.append(
                ToolCall(None, {}, f"tool call is not valid JSON: {e.msg} at char {e.pos}")
            )
            break
        calls.append(_json_call(body[pos:end]))
        pos = end
        while pos < len(body) and body[pos] in " \t\n;":
            pos += 1
    return calls


# --------------------------------------------------------------------------- results


def tool_messages(results: Sequence[tuple[str | None, str]]) -> list[dict[str, Any]]:
    """One ``tool`` message per result (named after its tool when known)."""
    out = []
    for name, content in results:
        message = {"role": "tool", "content": content}
        if name:
            message["name"] = name
        out.append(message)
    return out


def qwen_user_message(results: Sequence[tuple[str | None, str]]) -> list[dict[str, Any]]:
    """All results in one ``user`` message: ``<tool_response>\\nR\\n</tool_response>`` per
    result, joined by newlines (so ``<|im_start|>user\\n`` + this + ``<|im_end|>`` is
    verl's ``qwen`` rendering token for token)."""
    body = "\n".join(f"<tool_response>\n{content}\n</tool_response>" for _, content in results)
    return [{"role": "user", "content": body}]


_HERMES_CALL = '<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>'

TOOL_CALL_FORMATS.add(
    "hermes",
    ToolCallFormat(
        parse_hermes,
        tool_messages,
        'hermes: <tool_call>{"name": …, "arguments": {…}}</tool_call>, results as tool messages',
        _HERMES_CALL,
    ),
)
TOOL_CALL_FORMATS.add(
    "qwen",
    ToolCallFormat(
        parse_hermes,
        qwen_user_message,
        "qwen: hermes calls, results merged into one user message of <tool_response> blocks",
        _HERMES_CALL,
    ),
)
TOOL_CALL_FORMATS.add(
    "qwen3_coder",
    ToolCallFormat(
        parse_qwen3_coder,
        tool_messages,
        "qwen3_coder: <tool_call><function=NAME><parameter=KEY>value</parameter></function>"
        "</tool_call>, results as tool messages",
        "<tool_call>\n<function=<tool>>\n<parameter=<name>>\nvalue\n</parameter>\n</function>\n"
        "</tool_call>",
    ),
)
TOOL_CALL_FORMATS.add(
    "llama3_json",
    ToolCallFormat(
        parse_llama3_json,
        tool_messages,
        'llama3_json: {"name": …, "parameters": {…}} (several joined by ;), results as tool '
        "messages",
        '{"name": "<tool>", "parameters": {...}}',
    ),
)
