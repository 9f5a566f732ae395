"""Tool calling inside a multi-turn rollout (verl ``rollout.multi_turn``).

The model calls tools in the syntax of ``rollout.multi_turn.format`` (hermes by default:
``<tool_call>{"name": …, "arguments": {…}}</tool_call>``, one or more per turn; the
formats are :data:`temper.rollout.tool_formats.TOOL_CALL_FORMATS`). Each call is executed
and the results go back as the format says (``tool`` messages, or one ``user`` message);
the model then continues. A turn without any ``<tool_call>`` is the model's
final answer, handed to the inner responder (an environment, or nothing).

Nothing a model writes may crash the loop: malformed JSON, a missing name, an unclosed
tag, an unknown tool, bad arguments, a tool that raises or hangs — each becomes an
``error: …`` tool message, so the model sees what went wrong and the episode goes on.
Tool output longer than ``max_tool_response_length`` characters is cut on the side
``tool_response_truncate_side`` names.

Tools are executed by an injected ``execute(name, arguments, timeout_s) -> (ok, text)``
(the pipeline wires in :func:`temper.envs.tools.execute_tool`), so this layer knows
no tool implementations; ``tool_config_path`` (an OpenAI function-schema YAML, verl's
format) only says which tools are offered and how the chat template describes them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from temper.config.errors import ConfigError, did_you_mean
from temper.config.schema import MultiTurnConfig
from temper.rollout.chat import ChatTokenizer
from temper.rollout.multiturn import Feedback, Responder
from temper.rollout.tool_formats import TOOL_CALL_FORMATS, ToolCall

Executor = Callable[[str, dict[str, Any], float], tuple[bool, str]]


def check_multi_turn(mt: MultiTurnConfig, *, tools: bool | None = None) -> None:
    """Config-time check of ``rollout.multi_turn`` (no model needed): every value is one
    the rollout honours, or a ConfigError names the key, the reason and the fix.

    ``format`` must name a registered tool-call format (running a model through another
    syntax's parser would silently find no calls); checked when tools are in use —
    ``tools``, by default ``enable`` or a ``tool_config_path`` (the agentic pipeline also
    passes True for envs that offer tools). ``use_inference_chat_template`` is honoured
    by the runner (each turn generated from the template's rendering of the
    conversation): nothing to check.
    """
    if mt.interaction_config_path and not mt.enable:
        raise ConfigError(
            "rollout.multi_turn.interaction_config_path",
            "interactions answer the model's turns inside the multi-turn rollout, which is off",
            "set rollout.multi_turn.enable=true, or remove interaction_config_path",
        )
    if tools is None:
        tools = mt.enable or bool(mt.tool_config_path)
    if tools and mt.format not in TOOL_CALL_FORMATS:
        names = TOOL_CALL_FORMATS.primary_names()
        raise ConfigError(
            "rollout.multi_turn.format",
            f"tool-call format '{mt.format}'{did_you_mean(str(mt.format), names)} "
            f"is not supported: temper parses {', '.join(names)} calls (verl's gpt-oss, "
            "glm, seed, minimax, kimi, deepseek_v4 and gemma4 parsers are not built), so a "
            "model writing another syntax would never have a call executed",
            f"set rollout.multi_turn.format to one of {', '.join(names)}, with a model whose "
            "chat template writes that syntax",
        )


def parse_tool_calls(
    text: str, fmt: str = "hermes", schemas: Sequence[dict[str, Any]] = ()
) -> list[ToolCall]:
    """The calls in ``text`` in format ``fmt`` (see :mod:`temper.rollout.tool_formats`);
    [] when there is none (a final answer)."""
    return TOOL_CALL_FORMATS.get(fmt).parse(text, schemas)


def truncate_text(text: str, limit: int, side: Literal["left", "right", "middle"]) -> str:
    """Cut ``text`` to about ``limit`` characters: ``left`` keeps the start, ``right``
    the end, ``middle`` both ends (verl's ``tool_response_truncate_side``)."""
    if limit <= 0 or len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-limit:]
    half = limit // 2
    return text[:half] + "...(truncated)..." + text[len(text) - (limit - half) :]


def load_tool_schemas(path: str | Path) -> list[dict[str, Any]]:
    """OpenAI function schemas from a tool config YAML.

    Accepts verl's layout (``tools: [{class_name, config, tool_schema: {type: function,
    function: {...}}}]``), a ``tools:`` list of schemas, or a bare list. ``class_name``
    is ignored: tools are looked up by function name in temper's tool registry.
    """
    import yaml

    data = yaml.safe_load(Path(path).read_text())
    items = data.get("tools", []) if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ValueError(f"{path}: expected a list of tools (or 'tools: [...]')")
    schemas = []
    for k, item in enumerate(items):
        schema = item.get("tool_schema", item) if isinstance(item, dict) else None
        if isinstance(schema, dict) and "function" not in schema and "name" in schema:
            schema = {"type": "function", "function": schema}
        name = (schema or {}).get("function", {}).get("name") if isinstance(schema, dict) else None
        if not name or not isinstance(schema, dict):
            raise ValueError(f"{path}: tool #{k} has no function name")
        schemas.append(schema)
    return schemas


def schema_names(schemas: Sequence[dict[str, Any]]) -> list[str]:
    return [s["function"]["name"] for s in schemas]


@dataclasses.dataclass
class ToolSettings:
    """``rollout.multi_turn`` keys of the tool loop."""

    max_tool_response_length: int = 256
    tool_response_truncate_side: Literal["left", "right", "middle"] = "middle"
    tool_timeout_s: float = 10.0
    format: str = "hermes"  # a TOOL_CALL_FORMATS name


class ToolLoop:
    """Turns a model response into tool messages, or passes a final answer on.

    Counters (``calls``, ``errors``, ``timeouts``) cover the calls since the last
    :meth:`reset_counters`; callers reset them at the start of each rollout so
    :meth:`metrics` are per-step values, not running totals.
    """

    def __init__(
        self,
        execute: Executor,
        settings: ToolSettings,
        schemas: Sequence[dict[str, Any]] = (),
    ) -> None:
        """``schemas``: the offered tools' function schemas (formats whose values are
        untyped text, such as qwen3_coder, convert arguments by them)."""
        self.execute, self.settings, self.schemas = execute, settings, list(schemas)
        self.calls = self.errors = self.timeouts = 0

    def reset_counters(self) -> None:
        """Start counting afresh (one rollout = one step's metrics)."""
        self.calls = self.errors = self.timeouts = 0

    def feedback(self, text: str, allowed: Sequence[str]) -> Feedback | None:
        """Tool messages for ``text``'s calls; None when it has no call (final answer)."""
        # looked up here, not at construction: a loop built while tools are off never
        # reads its format (check_multi_turn refuses unknown ones where tools are on)
        fmt = TOOL_CALL_FORMATS.get(self.settings.format)
        calls = fmt.parse(text, self.schemas)
        if not calls:
            return None
        results, errors = [], 0
        for call in calls:
            ok, content = self._run(call, allowed)
            errors += int(not ok)
            content = truncate_text(
                content,
                self.settings.max_tool_response_length,
                self.settings.tool_response_truncate_side,
            )
            results.append((call.name, content))
        messages = fmt.results(results)
        self.calls += len(calls)
        self.errors += errors
        return Feedback(messages, info={"tool_calls": len(calls), "tool_errors": errors})

    def _run(self, call: ToolCall, allowed: Sequence[str]) -> tuple[bool, str]:
        if call.error is not None:
            return False, f"error: {call.error}"
        assert call.name is not None
        if call.name not in allowed:
            known = ", ".join(allowed) or "none"
            return False, f"error: unknown tool '{call.name}' (available: {known})"
        try:
            ok, content = self.execute(call.name, call.arguments, self.settings.tool_timeout_s)
        except Exception as e:  # an executor must not raise; if it does, the model hears it
            return False, f"error: {type(e).__name__}: {e}"
        if not ok and "timed out" in content:
            self.timeouts += 1
        return ok, content

    def responder(
        self, inner: Responder | None, allowed: Callable[[int], Sequence[str]]
    ) -> Responder:
        """A responder that answers tool calls itself and passes final answers to
        ``inner`` (None: a final answer ends the episode with reward 0).
        ``allowed(i)`` lists the tools episode ``i`` may call."""

        def respond(indices: list[int], texts: list[str]) -> list[Feedback]:
            out: list[Feedback | None] = [
                self.feedback(t, allowed(i)) for i, t in zip(indices, texts)
            ]
            final = [k for k, fb in enumerate(out) if fb is None]
            if final:
                if inner is None:
                    answers = [Feedback([], done=True) for _ in final]
                else:
                    answers = inner([indices[k] for k in final], [texts[k] for k in final])
                for k, fb in zip(final, answers):
                    out[k] = fb
            return [fb for fb in out if fb is not None]

        return respond

    def metrics(self) -> dict[str, float]:
        """``tools/calls`` (parsed calls, malformed ones included), ``tools/ok_calls``
        (executed and returned a result), ``tools/error_frac`` = errors / calls,
        ``tools/timeouts``; over the calls since :meth:`reset_counters`."""
        return {
            "tools/calls": float(self.calls),
            "tools/ok_calls": float(self.calls - self.errors),
            "tools/error_frac": self.errors / max(self.calls, 1),
            "tools/timeouts": float(self.timeouts),
        }


def registry_executor(execute_tool: Callable[..., Any]) -> Executor:
    """Adapt :func:`temper.envs.tools.execute_tool` (returns a ``ToolResult``)."""

    def execute(name: str, arguments: dict[str, Any], timeout_s: float) -> tuple[bool, str]:
        result = execute_tool(name, arguments, timeout_s=timeout_s)
        return bool(result.ok), str(result.content)

    return execute


def tool_prompt(schemas: Sequence[dict[str, Any]], fmt: str = "hermes") -> str:
    """Tool instructions in format ``fmt``, for chat templates that ignore ``tools=``."""
    lines = "\n".join(json.dumps(s, separators=(",", ":")) for s in schemas)
    return (
        "You may call tools. Available tools:\n<tools>\n"
        f"{lines}\n</tools>\n"
        f"To call one, write {TOOL_CALL_FORMATS.get(fmt).call_example} "
        "and wait for its result; when you are done, give your answer without a tool call."
    )


def tool_chat(
    tokenizer: Any,
    schemas: Sequence[dict[str, Any]],
    template_kwargs: dict[str, Any] | None,
    fmt: str = "hermes",
) -> tuple[ChatTokenizer, str]:
    """The chat tokenizer for a tool conversation, and the text to prepend to the first
    user message: templates that render ``tools=`` describe the tools themselves (text
    ""); for those that ignore it (plain ChatML), :func:`tool_prompt` does."""
    plain = ChatTokenizer(tokenizer, template_kwargs=template_kwargs)
    if not schemas:
        return plain, ""
    probe = [{"role": "user", "content": "x"}]
    with_tools = ChatTokenizer(tokenizer, tools=schemas, template_kwargs=template_kwargs)
    if with_tools.render(probe, True) != plain.render(probe, True):
        return with_tools, ""
    return plain, tool_prompt(schemas, fmt)
