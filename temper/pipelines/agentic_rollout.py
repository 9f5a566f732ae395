"""Environments ↔ the multi-turn runner: episode starts, env steps, tools, rendering.

The env manager (:mod:`temper.envs.manager`) owns environments, groups and seeds; the
runner (:mod:`temper.rollout.multiturn`) owns token sequences and generation. This
module connects them: each env slot becomes an episode whose first user message is
the tag's instruction + the first observation; each model answer is stepped in its
env (``EnvManager.step`` parses the action and adds the format penalty) and the new
observation becomes the next user message. Envs that offer tools (``tool_names()``)
and ``rollout.multi_turn.tool_config_path`` tools run through the tool loop (``multi_turn.format``)
first: a turn with ``<tool_call>`` is answered by the tools, a turn without one is the
env's action.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.data.batch import Batch
from temper.envs import EnvManager, EnvSlot, save_episode_render, tool_schemas
from temper.envs import tools as tool_registry
from temper.pipelines.trajectories import trajectory_batch
from temper.rewards.interactions import load_interactions
from temper.rollout import RolloutEngine, SamplingParams
from temper.rollout.interaction_turns import InteractionTurns
from temper.rollout.multiturn import (
    EpisodeSpec,
    Feedback,
    MultiTurnRunner,
    MultiTurnSettings,
    Responder,
    Trajectory,
)
from temper.rollout.partial import Segments
from temper.rollout.tool_engine import ToolCallingEngine
from temper.rollout.tools import (
    ToolLoop,
    ToolSettings,
    check_multi_turn,
    load_tool_schemas,
    registry_executor,
    schema_names,
    tool_chat,
)


@dataclasses.dataclass
class EpisodeLog:
    """One played episode as the model saw it: for renders and validation samples."""

    slot: EnvSlot
    messages: list[dict[str, Any]]
    episode_return: float
    num_turns: int
    stop_reason: str


@dataclasses.dataclass
class Played:
    """One round of an env manager's episodes.

    ``batch``: the training rows (one per episode, or one per env step), ``scores`` the
    episode returns; ``episodes``: one row per episode with what
    :func:`temper.pipelines.trajectories.episode_metrics` reads; ``logs``: the
    dialogues; ``metrics``: the rollout's own (generate calls, cut turns, …)."""

    batch: Batch
    episodes: Batch
    logs: list[EpisodeLog]
    metrics: dict[str, float]


class Player(Protocol):
    """What plays an env manager's episodes with the policy (an ``ENV_MANAGERS`` entry
    builds one per run)."""

    @property
    def pad_token_id(self) -> int: ...

    def play_round(
        self,
        manager: EnvManager,
        step: int,
        params: SamplingParams,
        round_: int = 0,
        groups: Sequence[int] | None = None,
        segments: Segments | None = None,
    ) -> Played:
        """The episodes of every env group (of ``groups``, when given) for ``step``;
        with ``segments``, as a partial rollout (:mod:`temper.rollout.partial`): each
        sample's ``response_versions``."""
        ...


class EnvResponder:
    """Steps the envs of ``slots`` with the model's answers (a runner ``Responder``)."""

    def __init__(self, manager: EnvManager, slots: list[EnvSlot], *, plain: bool = False) -> None:
        """``plain``: the next turn is the observation in the tag's template with an empty
        ``{suffix}`` and no note on an invalid answer (ROLL's ``GEMRunner``)."""
        self.manager, self.slots, self.plain = manager, slots, plain

    def __call__(self, indices: list[int], texts: list[str]) -> list[Feedback]:
        results = self.manager.step([self.slots[i].env_id for i in indices], texts)
        out = []
        for r in results:
            note = (
                ""
                if r.format_ok or self.plain
                else f"Invalid answer ({r.info.get('parse_reason') or 'invalid action'}).\n"
            )
            info = {
                "success": r.success,
                "format_ok": r.format_ok,
                "executed": r.executed,
                "terminated": r.terminated,
                "truncated": r.truncated,
                "tool_call": bool(r.info.get("tool_call", False)),
                "tool_error": bool(r.info.get("tool_error", False)),
                "env_error": bool(r.info.get("env_error")),
            }
            suffix = "" if self.plain else None
            text = note + self.manager.turn_text(r.env_id, r.observation, suffix)
            messages = [] if r.done else [{"role": "user", "content": text}]
            out.append(Feedback(messages, reward=r.reward, done=r.done, info=info))
        return out


class AgenticPlayer:
    """Plays one env manager's episodes with the policy; built once per run."""

    def __init__(self, cfg: TemperConfig, engine: RolloutEngine, tokenizer: Any) -> None:
        mt = cfg.rollout.multi_turn
        self.cfg = cfg
        config_schemas = config_tool_schemas(cfg)
        self.config_tools = schema_names(config_schemas)
        env_tools = sorted(
            {
                t
                for mgr in (cfg.agentic.train_env_manager, cfg.agentic.val_env_manager)
                for tag in mgr.tags
                for t in _tag_tools(cfg, tag)
            }
        )
        schemas = config_schemas + tool_schemas(
            [t for t in env_tools if t not in self.config_tools]
        )
        self.tools_on = bool(schemas) and (mt.enable or bool(env_tools))
        check_multi_turn(mt, tools=self.tools_on)
        kwargs = dict(cfg.data.apply_chat_template_kwargs)
        chat, self.tool_text = tool_chat(
            tokenizer, schemas if self.tools_on else [], kwargs, mt.format
        )
        self.chat = chat
        self.settings = multi_turn_settings(cfg)
        self.runner = MultiTurnRunner(engine, chat, self.settings)
        self.tool_loop = ToolLoop(
            registry_executor(tool_registry.execute_tool), tool_settings(cfg), schemas
        )

    def play(
        self,
        manager: EnvManager,
        step: int,
        params: SamplingParams,
        round_: int = 0,
        groups: Sequence[int] | None = None,
        segments: Segments | None = None,
    ) -> tuple[list[Trajectory], list[EnvSlot], dict[str, float]]:
        """Reset every env of ``manager`` (of ``groups``, when given) for ``step``
        (generation round ``round_`` of dynamic sampling: other seeds) and play the
        episodes to the end (with ``segments``, as a partial rollout)."""
        slots, specs = self.episodes(manager, step, round_, groups)
        respond: Responder = self.responder(manager, slots)
        if self.tools_on:
            self.tool_loop.reset_counters()  # per-step tool metrics
            respond = self.tool_loop.responder(respond, lambda i: self._allowed(manager, slots[i]))
        trajs = self.runner.run(specs, respond, params, segments)
        metrics = dict(self.runner.metrics)
        if self.tools_on:
            metrics.update(self.tool_loop.metrics())
        return trajs, slots, metrics

    @property
    def pad_token_id(self) -> int:
        return self.runner.pad_token_id

    def play_round(
        self,
        manager: EnvManager,
        step: int,
        params: SamplingParams,
        round_: int = 0,
        groups: Sequence[int] | None = None,
        segments: Segments | None = None,
    ) -> Played:
        """:meth:`play` as a :class:`Played` round: one training row per episode."""
        trajs, slots, metrics = self.play(manager, step, params, round_, groups, segments)
        batch = trajectory_batch(trajs, self.pad_token_id)
        logs = [
            EpisodeLog(s, t.messages, t.episode_return, t.num_turns, t.stop_reason)
            for t, s in zip(trajs, slots)
        ]
        return Played(batch, batch, logs, metrics)

    def episodes(
        self,
        manager: EnvManager,
        step: int,
        round_: int = 0,
        groups: Sequence[int] | None = None,
    ) -> tuple[list[EnvSlot], list[EpisodeSpec]]:
        """Reset ``manager`` for ``step``: its slots and each episode's first message
        (tool instructions when the template does not describe tools itself, the tag's
        instruction, the first observation). Groups are ``uid``s ``"<step>:<group>"``
        (``"<step>:<group>#r<round>"`` in later rounds)."""
        slots = manager.reset(step, round_, groups)
        suffix = f"#r{round_}" if round_ else ""
        specs = []
        for s in slots:
            spec = manager.specs[s.tag]
            specs.append(
                EpisodeSpec(
                    self.first_messages(manager, s),
                    {
                        "uid": f"{step}:{s.group_id}{suffix}",
                        "tag": s.tag,
                        "group_id": s.group_id,
                        "seed": s.seed,
                        "env_id": s.env_id,
                    },
                    max_turns=self._turn_cap(spec.max_turns),
                    max_tokens_per_turn=spec.max_tokens_per_turn,
                )
            )
        return slots, specs

    def first_messages(self, manager: EnvManager, s: EnvSlot) -> list[dict[str, Any]]:
        """An episode's first messages: the tag's system message (ROLL
        ``agent_system_template``) when it has one, then tool instructions (when the
        template does not describe tools itself), the instruction and the first turn."""
        turn = manager.turn_text(s.env_id, s.observation)
        text = f"{s.instruction}\n\n{turn}" if s.instruction else turn
        if self.tool_text and self._allowed(manager, s):
            text = f"{self.tool_text}\n\n{text}"
        system = manager.system_message(s.tag)
        first = [{"role": "system", "content": system}] if system else []
        return [*first, {"role": "user", "content": text}]

    def responder(self, manager: EnvManager, slots: list[EnvSlot]) -> Responder:
        """What answers the model's turns: the envs of ``slots``."""
        return EnvResponder(manager, slots)

    def _turn_cap(self, env_turns: int) -> int | None:
        """Model turns an episode may take. The manager ends it after the tag's
        ``max_turns`` env steps; tool turns come on top, so with tools and no
        ``max_user_turns`` each env step may be preceded by up to 3 tool turns
        (verl bounds tool loops the same way, by default) — never unbounded."""
        if not self.tools_on:
            return None
        extra = self.settings.max_user_turns
        return env_turns + (extra if extra is not None else 3 * env_turns)

    def _allowed(self, manager: EnvManager, slot: EnvSlot) -> list[str]:
        return self.config_tools + [
            t for t in manager.env(slot.env_id).tool_names() if t not in self.config_tools
        ]


def _tag_tools(cfg: TemperConfig, tag: str) -> list[str]:
    """Tools a tag's env offers (built once to ask it)."""
    from temper.envs import resolve_tag

    return resolve_tag(tag, cfg.agentic.custom_envs[tag]).make().tool_names()


def save_renders(
    out_dir: str | Path,
    step: int,
    manager: EnvManager,
    trajs: list[Trajectory],
    slots: list[EnvSlot],
    limit: int = 4,
) -> list[Path]:
    """Frames (text, and PNG for grid games) and the dialogue of the first ``limit`` episodes."""
    logs = [
        EpisodeLog(s, t.messages, t.episode_return, t.num_turns, t.stop_reason)
        for t, s in zip(trajs, slots)
    ]
    return save_logs(out_dir, step, manager, logs, limit)


def save_logs(
    out_dir: str | Path, step: int, manager: EnvManager, logs: list[EpisodeLog], limit: int = 4
) -> list[Path]:
    """:func:`save_renders` of played episodes' logs (either env manager's)."""
    root = Path(out_dir) / f"step_{step:05d}"
    written: list[Path] = []
    for log in logs[:limit]:
        s = log.slot
        name = f"{s.tag}_g{s.group_id}_e{s.env_id}"
        written += save_episode_render(manager.frames(s.env_id), root, name)
        dialog = root / f"{name}_dialog.txt"
        dialog.write_text(
            "".join(f"=== {m['role']} ===\n{m['content']}\n" for m in log.messages)
            + f"=== return {log.episode_return:.3f}, turns {log.num_turns}, "
            f"stop {log.stop_reason} ===\n",
            encoding="utf-8",
        )
        written.append(dialog)
    return written


def rlvr_tool_engine(base: RolloutEngine, cfg: TemperConfig, tokenizer: Any) -> ToolCallingEngine:
    """RLVR with ``rollout.multi_turn.enable`` (verl): ``base`` wrapped in a
    :class:`ToolCallingEngine` offering the ``tool_config_path`` tools (run by
    :func:`temper.envs.tools.execute_tool`). Lives here because it joins two layers."""
    check_multi_turn(cfg.rollout.multi_turn, tools=True)
    if cfg.data.chat_template == "raw":  # a Jinja template is the tokenizer's (load_tokenizer)
        raise ConfigError(
            "data.chat_template",
            "multi-turn tool calling renders each turn with a chat template, and raw has none",
            "set data.chat_template=native (or a Jinja template)",
        )
    return ToolCallingEngine(
        base,
        tokenizer,
        execute=registry_executor(tool_registry.execute_tool),
        schemas=config_tool_schemas(cfg),
        settings=multi_turn_settings(cfg),
        tools=tool_settings(cfg),
        system_prompt=cfg.data.system_prompt,
        template_kwargs=dict(cfg.data.apply_chat_template_kwargs),
        interactions=config_interactions(cfg),
    )


def config_interactions(cfg: TemperConfig) -> InteractionTurns | None:
    """The interactions of ``rollout.multi_turn.interaction_config_path`` (None without
    it); a file that does not load is a ``ConfigError`` naming the key."""
    path = cfg.rollout.multi_turn.interaction_config_path
    if not path:
        return None
    try:
        interactions = load_interactions(path)
    except (OSError, ValueError) as e:
        raise ConfigError(
            "rollout.multi_turn.interaction_config_path", str(e), "fix the file"
        ) from e
    return InteractionTurns(interactions, multi_turn_settings(cfg))


def config_tool_schemas(cfg: TemperConfig) -> list[dict[str, Any]]:
    """The tools of ``rollout.multi_turn.tool_config_path`` (none without it); each must be
    in temper's tool registry (``ConfigError`` naming the key otherwise)."""
    path = cfg.rollout.multi_turn.tool_config_path
    if not path:
        return []
    key = "rollout.multi_turn.tool_config_path"
    try:
        schemas = load_tool_schemas(path)
    except (OSError, ValueError) as e:
        raise ConfigError(key, str(e), "fix the file") from e
    known = tool_registry.tool_names()
    unknown = [n for n in schema_names(schemas) if n not in known]
    if unknown:
        raise ConfigError(
            key,
            f"tools {unknown} are not in temper's tool registry (known: {', '.join(known)})",
            "register them with temper.envs.tools.register_tool, or remove them",
        )
    return schemas


def multi_turn_settings(cfg: TemperConfig) -> MultiTurnSettings:
    """The runner's limits from ``rollout`` / ``rollout.multi_turn``."""
    mt = cfg.rollout.multi_turn
    return MultiTurnSettings(
        max_tokens_per_turn=cfg.rollout.response_length,
        max_assistant_turns=mt.max_assistant_turns,
        max_user_turns=mt.max_user_turns,
        max_model_len=cfg.rollout.max_model_len,
        sanity_check=mt.enable_tokenization_sanity_check,
        inference_template=mt.use_inference_chat_template,
    )


def tool_settings(cfg: TemperConfig) -> ToolSettings:
    mt = cfg.rollout.multi_turn
    return ToolSettings(
        mt.max_tool_response_length, mt.tool_response_truncate_side, mt.tool_timeout_s, mt.format
    )
