"""Environment registry: ``env_type`` → ``TextEnv`` class, and tag resolution.

A tag (``agentic.custom_envs.<tag>``, an ``EnvTagConfig``) names an
``env_type`` and its ``env_config`` parameters. ``resolve_tag`` checks both
against the registered class — unknown types and unknown parameters raise
``ConfigError`` naming the key, with did-you-mean — and returns an ``EnvSpec``
that builds fresh env instances.

ROLL ``env_config`` keys accepted (see ``examples`` and ROLL's ``envs.yaml``):

- sokoban: ``dim_x``, ``dim_y``, ``dim_room`` ([rows, cols]), ``num_boxes``,
  ``max_steps``, ``search_depth``, ``grid_lookup``, ``grid_vocab``;
- sokoban_native_env (ROLL's agent-native Sokoban): sokoban's, ``system_template``,
  ``observation_suffix``;
- sokoban_sandbox (ROLL's SokobanSandbox, :mod:`temper.envs.sokoban_sandbox`): sokoban's;
  it plays in the run's sandbox (``reward.sandbox``), not in a ROCK service (ROLL's
  ``base_url``: the ROLL dialect notes it);
- frozen_lake: ``size``, ``p``, ``is_slippery``, ``map_seed``, ``desc``, ``max_steps``;
- countdown / countdown_tool: ``num_numbers``, ``max_number``, ``max_target``,
  ``score``, ``format_score``, ``max_attempts``, ``tools`` (ROLL reads puzzles from a
  dataset; temper draws them from the seed);
- bandit: ``lo_arm_name``, ``hi_arm_name``, ``lo_arm_score``, ``hi_arm_loscore``,
  ``hi_arm_hiscore``, ``hi_arm_hiscore_prob``;
- GEM (ROLL's ``qwen3_agentic_gem``): ``game:GuessTheNumber-v0``: ``min_number``,
  ``max_number``, ``max_turns``; ``rg:letter_counting``: ``size``, ``seed``,
  ``min_words``, ``max_words``; ``roll_math`` / ``roll_qa``: ``dataset_name`` (a local
  file or directory), ``split``, ``question_key``, ``answer_key``, ``seed``,
  ``max_steps`` (and ``roll_qa``'s ``extract_boxed``, ``load_from_cache_file``);
- deepeyes (ROLL's DeepEyes, :mod:`temper.envs.deepeyes`): ``data_args`` (``file_name``,
  ``preprocessing_num_workers``), ``max_steps``, ``acc_weight``, ``format_weight``,
  ``tool_weight``, ``enable_thinking`` (the judge's chat template), ``mode``, ``seed``,
  ``epoch``, ``idx`` (ROLL's dataset walk: here the reset seed picks the row);
- every type: ``render_mode`` (ignored: frames are rendered as asked),
  ``action_lookup`` (ignored: the env's own action names are used; ids 1..n work),
  and ``env_instruction`` / ``action_pattern`` / ``format_penalty`` /
  ``max_tokens`` (newer ROLL places them in env_config: they are lifted to the
  tag when the tag leaves them at their defaults).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from temper.config.errors import ConfigError, did_you_mean
from temper.config.schema import EnvTagConfig, EnvToolWrapperConfig
from temper.registry import Registry

from .base import TextEnv

__all__ = ["ENV_TYPES", "EnvSpec", "env_types", "make_env", "register_env", "resolve_tag"]

#: ``env_type`` -> ``TextEnv`` class; the built-in types are imported on first use
ENV_TYPES: Registry[type[TextEnv]] = Registry("environment type")


def _builtin(path: str) -> Callable[[], type[TextEnv]]:
    module, name = path.rsplit(":", 1)

    def load() -> type[TextEnv]:
        cls: type[TextEnv] = getattr(importlib.import_module(module), name)  # registers itself
        return cls

    return load


for _name, _path in {
    "sokoban": "temper.envs.sokoban:SokobanEnv",
    "sokoban_native_env": "temper.envs.native:SokobanNativeEnv",
    "sokoban_sandbox": "temper.envs.sokoban_sandbox:SokobanSandboxEnv",
    "frozen_lake": "temper.envs.frozen_lake:FrozenLakeEnv",
    "countdown": "temper.envs.countdown_tool:CountdownEnv",
    "countdown_tool": "temper.envs.countdown_tool:CountdownToolEnv",
    "bandit": "temper.envs.bandit:BanditEnv",
    "game:GuessTheNumber-v0": "temper.envs.gem_games:GuessTheNumberEnv",
    "rg:letter_counting": "temper.envs.gem_reasoning:LetterCountingEnv",
    "roll_math": "temper.envs.gem_datasets:MathEnv",
    "roll_qa": "temper.envs.gem_datasets:QaEnv",
    "deepeyes": "temper.envs.deepeyes:DeepEyesEnv",
}.items():
    ENV_TYPES.add_lazy(_name, _builtin(_path))

#: ROLL env_config keys with no effect here, and why
IGNORED_KEYS: dict[str, str] = {
    "render_mode": "frames are rendered in the mode asked for",
    "action_lookup": "the env's own action names are used (ids 1..n also work)",
    "special_token_list": "special tokens <|…|> are always stripped from answers",
}
#: keys newer ROLL places in env_config that belong to the tag
_TAG_LEVEL = {
    "env_instruction": "env_instruction",
    "action_pattern": "action_pattern",
    "format_penalty": "format_penalty",
    "max_tokens": "max_words",
}


def register_env(name: str) -> Callable[[type[TextEnv]], type[TextEnv]]:
    """Class decorator registering a ``TextEnv`` subclass as ``env_type: name``."""

    def deco(cls: type[TextEnv]) -> type[TextEnv]:
        cls.env_type = name
        ENV_TYPES.add(name, cls, replace=True)  # a built-in replaces its lazy entry
        return cls

    return deco


def env_types() -> list[str]:
    """All registered env types, sorted."""
    return ENV_TYPES.names()


def env_class(env_type: str, key: str = "env_type") -> type[TextEnv]:
    """The class registered as ``env_type``; ``ConfigError`` on ``key`` otherwise."""
    if env_type in ENV_TYPES:
        return ENV_TYPES.get(env_type)
    raise ConfigError(
        key,
        f"unknown environment type '{env_type}'{did_you_mean(env_type, env_types())}",
        f"use one of: {', '.join(env_types())}",
    )


def params_of(cls: type) -> set[str]:
    """The keyword-only parameters of ``cls``'s constructor (what a config may set)."""
    sig = inspect.signature(cls)
    return {n for n, p in sig.parameters.items() if n != "self" and p.kind == p.KEYWORD_ONLY}


@dataclass(frozen=True)
class EnvSpec:
    """A resolved tag: everything needed to build and drive its environments."""

    tag: str
    env_type: str
    cls: type[TextEnv]
    params: dict[str, Any] = field(default_factory=dict)
    env_instruction: str = ""
    action_pattern: str = r"<answer>(.*?)</answer>"
    format_penalty: float = -0.1
    max_turns: int = 5
    max_tokens_per_turn: int = 128
    max_words: int | None = None
    turn_prompt: str = ""
    system_template: str = ""
    turn_template: str = ""
    pre_step_template: str = ""  # the VL trajectory manager's text around the image
    next_step_template: str = ""
    history_length: int | None = None  # the step env manager's window (EnvTagConfig)
    tool_wrapper: EnvToolWrapperConfig | None = None  # tools in front of the env

    def make(self) -> TextEnv:
        """A fresh environment instance (inside its tool wrapper, when the tag has one)."""
        env = self.cls(**self.params)
        if self.tool_wrapper is None:
            return env
        from .tool_wrapper import ToolEnvWrapper, build_tools

        w = self.tool_wrapper
        return ToolEnvWrapper(
            env,
            build_tools(w),
            tool_reward=w.tool_reward,
            tool_success_reward=w.tool_success_reward,
            max_tool_uses=w.max_tool_uses,
        )


def resolve_tag(tag: str, cfg: EnvTagConfig, prefix: str = "agentic.custom_envs") -> EnvSpec:
    """Check a tag's ``env_type`` and ``env_config`` and return its ``EnvSpec``."""
    key = f"{prefix}.{tag}"
    cls = env_class(cfg.env_type, f"{key}.env_type")
    accepted = params_of(cls)
    defaults = {f.name: f.default for f in fields(EnvTagConfig)}
    tag_values = {f.name: getattr(cfg, f.name) for f in fields(EnvTagConfig)}
    params: dict[str, Any] = {}
    for name, value in (cfg.env_config or {}).items():
        if name in IGNORED_KEYS:
            continue
        if name in _TAG_LEVEL and name not in accepted:
            dst = _TAG_LEVEL[name]
            if tag_values[dst] == defaults[dst]:
                tag_values[dst] = value
            continue
        if name not in accepted:
            valid = sorted(accepted | set(IGNORED_KEYS) | set(_TAG_LEVEL))
            raise ConfigError(
                f"{key}.env_config.{name}",
                f"unknown parameter of env_type '{cfg.env_type}'{did_you_mean(name, valid)}",
                f"use one of: {', '.join(valid)}",
            )
        params[name] = value
    try:
        probe = cls(**params)  # fail at load, not mid-run
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{key}.env_config", str(e), "fix the environment parameters") from e
    wrapper = cfg.tool_wrapper if cfg.tool_wrapper.tools else None
    if wrapper is not None:
        from .tool_wrapper import check_tools

        check_tools(wrapper, f"{key}.tool_wrapper")
        if not probe.whole_response:
            raise ConfigError(
                f"{key}.tool_wrapper",
                f"env type '{cfg.env_type}' reads the actions the manager extracts from an "
                "answer; a tool wrapper hands the env the whole answer",
                "remove tool_wrapper, or use an env type that reads whole answers "
                "(roll_math, roll_qa, rg:letter_counting, game:GuessTheNumber-v0)",
            )
    if cfg.history_length is not None and cfg.history_length < 0:
        raise ConfigError(
            f"{key}.history_length",
            f"{cfg.history_length} steps: a window cannot be negative",
            "set 0 (all earlier steps), n ≥ 1 (the last n - 1), or remove it (none)",
        )
    if tag_values["max_turns"] < 1:
        raise ConfigError(f"{key}.max_turns", "must be at least 1", "set a positive turn count")
    return EnvSpec(
        tag=tag,
        env_type=cfg.env_type,
        cls=cls,
        params=params,
        env_instruction=tag_values["env_instruction"] or "",
        action_pattern=tag_values["action_pattern"],
        format_penalty=float(tag_values["format_penalty"]),
        max_turns=int(tag_values["max_turns"]),
        max_tokens_per_turn=int(tag_values["max_tokens_per_turn"]),
        max_words=tag_values["max_words"],
        turn_prompt=tag_values["turn_prompt"] or "",
        system_template=cfg.system_template or "",
        turn_template=cfg.turn_template or "",
        pre_step_template=cfg.pre_step_template or "",
        next_step_template=cfg.next_step_template or "",
        history_length=cfg.history_length,
        tool_wrapper=wrapper,
    )


def make_env(env_type: str, **params: Any) -> TextEnv:
    """Build an env directly: ``make_env("sokoban", dim_x=6, dim_y=6)``."""
    return env_class(env_type)(**params)
