"""Text environments for agentic RL and the env manager.

Public API: ``TextEnv`` (interface), ``EnvManager`` (pool, groups, seeds,
batch-wise ``step``), ``parse_action``, the env registry (``register_env``,
``resolve_tag``, ``make_env``), the tool registry (``execute_tool``,
``tool_schemas``) and ``save_episode_render``. Built-in env types: ``sokoban``,
``frozen_lake``, ``countdown``, ``countdown_tool``, ``bandit``, and GEM's
``game:GuessTheNumber-v0``, ``rg:letter_counting``, ``roll_math``, ``roll_qa``, and
ROLL's ``deepeyes`` (an image question with a zoom-in tool, graded by the LLM judge)
(imported on first use); ROLL's env tool wrappers in :mod:`temper.envs.tool_wrapper`.

Layer rule: imports of temper only ``temper.config``, and in the GEM and DeepEyes envs
``temper.data`` (dataset rows, images) and ``temper.rewards`` (math answer check, code
sandbox, the judge's engine interface).
"""

from .actions import DEFAULT_ACTION_PATTERN, ParsedAction, parse_action
from .base import EnvSlot, EnvTurnResult, TextEnv
from .manager import EnvManager, split_groups
from .registry import EnvSpec, env_types, make_env, register_env, resolve_tag
from .render import save_episode_render, write_png
from .steps import StepRecord, history_window, render_step_prompt
from .tools import ToolResult, ToolSpec, execute_tool, get_tool, register_tool, tool_schemas

__all__ = [
    "DEFAULT_ACTION_PATTERN",
    "EnvManager",
    "EnvSlot",
    "EnvSpec",
    "EnvTurnResult",
    "ParsedAction",
    "StepRecord",
    "TextEnv",
    "ToolResult",
    "ToolSpec",
    "env_types",
    "execute_tool",
    "get_tool",
    "history_window",
    "make_env",
    "parse_action",
    "register_env",
    "register_tool",
    "render_step_prompt",
    "resolve_tag",
    "save_episode_render",
    "split_groups",
    "tool_schemas",
    "write_png",
]
