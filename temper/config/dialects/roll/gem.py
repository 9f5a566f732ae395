"""ROLL's env tool wrappers (``custom_envs.<tag>.tool_wrapper``, GEM's ``ToolEnvWrapper``)
in temper's terms.

ROLL writes a wrapper as ``wrapper_args`` (``tool_reward``, ``tool_success_reward``,
``max_tool_uses``: the wrapper's constructor arguments) and a list of ``tool_configs``
(``tool_id`` and its ``tool_args``); temper's ``agentic.custom_envs.<tag>.tool_wrapper``
holds the same arguments and the tools as a mapping from id to arguments, in order.

``python_code``'s ``sandbox_type`` becomes ``sandbox``: GEM's ``bwrap`` is temper's
bubblewrap sandbox, and GEM's ``none`` (a plain subprocess behind a blocklist of
imports) runs in the bubblewrap sandbox too — temper runs model-written code contained
unless the native config asks for ``sandbox: none`` itself. Which tools exist and what
arguments they take is checked natively (:func:`temper.envs.tool_wrapper.check_tools`),
for the tags the env managers use: a tag nobody plays may name a tool that cannot run
here (ROLL's QA examples define an MCP tag beside the one they train).
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core.derivation import derivation
from temper.config.dialects.roll.derive import Ctx
from temper.config.errors import ConfigError

#: ROLL's wrapper_args (GEM ToolEnvWrapper's keyword arguments)
WRAPPER_ARGS = ("tool_reward", "tool_success_reward", "max_tool_uses")
#: GEM's python sandbox types -> temper's sandbox
SANDBOX_TYPES = {"bwrap": "bwrap", "none": "bwrap"}


@derivation("custom_envs.*.tool_wrapper")
def tool_wrappers(ctx: Ctx) -> None:
    """``custom_envs.*.tool_wrapper`` → ``agentic.custom_envs.*.tool_wrapper``."""
    for tag, spec in (ctx.get("custom_envs") or {}).items():
        wrapper = spec.get("tool_wrapper") if isinstance(spec, dict) else None
        if not wrapper:
            continue
        key = f"custom_envs.{tag}.tool_wrapper"
        ctx.write(f"agentic.custom_envs.{tag}.tool_wrapper", _native(ctx, wrapper, key), key)


def _native(ctx: Ctx, wrapper: Any, key: str) -> dict[str, Any]:
    if not isinstance(wrapper, dict):
        raise ConfigError(key, "must be a mapping", "write wrapper_args and tool_configs")
    extra = sorted(set(wrapper) - {"wrapper_args", "tool_configs"})
    if extra:
        raise ConfigError(
            f"{key}.{extra[0]}",
            "is not a tool wrapper setting",
            "use wrapper_args and tool_configs",
        )
    args = dict(wrapper.get("wrapper_args") or {})
    for name in args:
        if name not in WRAPPER_ARGS:
            raise ConfigError(
                f"{key}.wrapper_args.{name}",
                "is not an argument of the tool wrapper",
                f"use {', '.join(WRAPPER_ARGS)}",
            )
    tools: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(wrapper.get("tool_configs") or []):
        where = f"{key}.tool_configs[{i}]"
        if not isinstance(tool, dict) or "tool_id" not in tool:
            raise ConfigError(where, "names no tool_id", "give each tool a tool_id and tool_args")
        tool_id = str(tool["tool_id"])
        tool_args = dict(tool.get("tool_args") or {})
        if "sandbox_type" in tool_args:
            kind = tool_args.pop("sandbox_type")
            if kind not in SANDBOX_TYPES:
                raise ConfigError(
                    f"{where}.tool_args.sandbox_type",
                    f"unknown value {kind!r}",
                    f"use one of: {', '.join(SANDBOX_TYPES)}",
                )
            tool_args["sandbox"] = SANDBOX_TYPES[kind]
            if kind == "none":
                ctx.remark(
                    f"{where}.tool_args.sandbox_type: none: the python tool's code runs in "
                    "temper's bubblewrap sandbox (no network, a fresh directory, limits) "
                    "rather than GEM's bare subprocess"
                )
        if tool_id in tools:
            raise ConfigError(f"{where}.tool_id", f"{tool_id} is listed twice", "list it once")
        tools[tool_id] = tool_args
    return {"tools": tools, **args}
