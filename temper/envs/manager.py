"""The environment manager: a pool of environments, their groups and seeds.

Engine-agnostic: it builds the envs of an ``EnvManagerConfig`` (ROLL
``train_env_manager`` / ``val_env_manager``), hands out initial observations
with ``reset`` and applies the model's raw responses with ``step``; generation
and the turn loop belong to the caller.

Layout (ROLL semantics):

- the pool has ``num_env_groups × group_size`` env instances; ``env_id =
  group_id × group_size + i``;
- groups are assigned to tags in order, ``n_groups[k]`` groups for
  ``tags[k]``; ``n_groups: None`` splits evenly (the first tags take the
  remainder);
- all envs of a group play the same tag with the same seed (the GRPO group of
  the agentic pipeline); groups differ in seed.

Seeds: ``seed(step, group, round)`` hashes (run seed, stream, step, group,
round) with ``numpy.random.SeedSequence``; training uses even seeds, validation
(``mode="val"``) odd seeds, so the two sets never meet. For a fixed validation
set, reset the val manager with the same ``step`` every time (e.g. 0).

Trajectories per step: every env instance plays exactly **one** episode per step
(one ``reset``), all of them concurrently, so a step has ``num_env_groups ×
group_size`` trajectories. ROLL instead keeps ``env_groups × group_size`` instances
that each replay ``rollout_batch_size / envs`` episodes, every replay with a new seed
(a new ``traj_group_id``), bounded by ``max_traj_per_env`` (ROLL asserts it is at least
that replay count; -1 means "as many as needed"). The ROLL dialect therefore turns the
replays into groups (``num_env_groups = env_groups × replays``): the same episodes,
seeds grouped the same way, played side by side instead of one after another (larger
generation batches, no idle envs). Natively ``max_traj_per_env`` is thus a bound
that one episode per instance must satisfy: -1 (unlimited) or ≥ 1 — 0 or below -1
is a config error (:func:`check_max_traj_per_env`).

State (``state_dict``): the run seed, the mode, the group layout and each env's last
episode seed. Episodes are a pure function of ``(run seed, step, group, round)`` — every
``reset`` reseeds the envs' own generators — so that is all a resumed run needs to play
exactly the episodes of the uninterrupted one; loading checks that it is the same pool.

Per turn (``step``): the response is parsed (``parse_action`` with the tag's
pattern, ``action_sep``, ``enable_think``); the known actions run in order
until the episode ends or ``max_actions_per_traj`` actions have run; the
tag's ``format_penalty`` (or the manager's override) is added when the answer
did not parse or named an unknown/invalid action. The trajectory is truncated
after ``max_turns`` turns of its tag. A step whose info carries ``env_error`` (a
sandboxed env's failed run, :mod:`temper.envs.sokoban_sandbox`) ended its episode: it is
logged and counted (``episode_stats``' ``env_errors``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from temper.config.errors import ConfigError
from temper.config.schema import AgenticConfig, EnvManagerConfig, EnvTagConfig
from temper.rewards.judge import JudgeEngine
from temper.rewards.sandbox_api import SandboxChoice

from .actions import ParsedAction, parse_action
from .base import EnvSlot, EnvTurnResult, TextEnv
from .judging import grade
from .registry import EnvSpec, resolve_tag
from .steps import StepRecord, fill_template, render_concat_prompt, render_step_prompt

logger = logging.getLogger(__name__)

__all__ = ["EnvManager", "check_max_traj_per_env", "split_groups"]

# trajectories one env instance plays per step (see the module docstring)
TRAJECTORIES_PER_ENV = 1


def check_max_traj_per_env(cfg: EnvManagerConfig, key: str) -> None:
    """ConfigError unless ``cfg.max_traj_per_env`` allows the one trajectory per env
    instance and step that the manager plays: -1 (unlimited) or ≥ 1. ``key``: the
    manager's config key, e.g. ``agentic.train_env_manager``."""
    limit = cfg.max_traj_per_env
    if limit == -1 or limit >= TRAJECTORIES_PER_ENV:
        return
    raise ConfigError(
        f"{key}.max_traj_per_env",
        f"{limit} lets no environment play: each of the {cfg.num_env_groups} × "
        f"{cfg.group_size} env instances plays {TRAJECTORIES_PER_ENV} trajectory per step "
        "(more trajectories per step come from more num_env_groups)",
        "set it to -1 (unlimited) or a value ≥ 1",
    )


def split_groups(num_groups: int, tags: Sequence[str], n_groups: Sequence[int] | None) -> list[str]:
    """The tag of each group: ``n_groups`` per tag, or an even split (remainder to the first)."""
    if not tags:
        raise ValueError("no environment tags")
    if n_groups is None:
        base, extra = divmod(num_groups, len(tags))
        n_groups = [base + (1 if k < extra else 0) for k in range(len(tags))]
    if len(n_groups) != len(tags) or sum(n_groups) != num_groups:
        raise ValueError(f"n_groups {list(n_groups)} must give {num_groups} groups for {tags}")
    return [t for t, n in zip(tags, n_groups) for _ in range(n)]


@dataclass
class _EnvState:
    env: TextEnv
    spec: EnvSpec
    group_id: int
    seed: int = 0
    observation: str = ""
    instruction: str = ""
    turns: int = 0
    actions: int = 0
    episode_return: float = 0.0
    done: bool = True
    success: bool = False
    tool_calls: int = 0  # answers a tool wrapper ran as tool calls (temper.envs.tool_wrapper)
    tool_successes: int = 0  # of which ran without error
    env_errors: int = 0  # steps the env failed (info["env_error"]): at most one, the last
    frames: list[Any] = field(default_factory=list)


class EnvManager:
    """A pool of text environments played batch-wise (see the module docstring)."""

    def __init__(
        self,
        cfg: EnvManagerConfig,
        custom_envs: dict[str, EnvTagConfig],
        *,
        seed: int = 0,
        mode: Literal["train", "val"] = "train",
        action_sep: str = "||",
        enable_think: bool = False,
        max_actions_per_traj: int | None = None,
        record_frames: bool = False,
        key: str = "agentic.train_env_manager",
        judge: JudgeEngine | None = None,
        sandbox: SandboxChoice | None = None,
    ) -> None:
        """``judge``: the run's LLM judge, for the envs that grade with it
        (``TextEnv.uses_judge``; :meth:`step` batches their requests); ``sandbox``: the
        run's sandbox (``reward.sandbox``), for the envs that play in it
        (``TextEnv.uses_sandbox``; bubblewrap with default limits when None)."""
        self.cfg, self.mode, self.run_seed = cfg, mode, int(seed)
        self.action_sep, self.enable_think = action_sep, enable_think
        self.max_actions_per_traj = max_actions_per_traj
        self.record_frames = record_frames
        check_max_traj_per_env(cfg, key)
        specs: dict[str, EnvSpec] = {}
        for tag in cfg.tags:
            if tag not in custom_envs:
                known = ", ".join(sorted(custom_envs)) or "none defined"
                raise ConfigError(
                    f"{key}.tags",
                    f"environment tag '{tag}' is not defined in agentic.custom_envs ({known})",
                    "define it under agentic.custom_envs or fix the tag",
                )
            specs[tag] = resolve_tag(tag, custom_envs[tag])
        try:
            self.group_tags = split_groups(cfg.num_env_groups, cfg.tags, cfg.n_groups)
        except ValueError as e:
            raise ConfigError(f"{key}.n_groups", str(e), "give one count per tag") from e
        self.specs = specs
        self.group_size = cfg.group_size
        self._states = [
            _EnvState(specs[tag].make(), specs[tag], g)
            for g, tag in enumerate(self.group_tags)
            for _ in range(cfg.group_size)
        ]
        choice = sandbox or SandboxChoice()
        for st in self._states:
            if st.spec.cls.uses_sandbox:
                st.env.use_sandbox(choice)
        boxed = sorted({s.tag for s in specs.values() if s.cls.uses_sandbox})
        if boxed and choice.name == "none":
            logger.warning(
                "reward.sandbox: none: the envs of %s run their programs with NO isolation",
                ", ".join(boxed),
            )
        self.judge = judge
        for spec in specs.values():
            if spec.cls.uses_judge and judge is None:
                raise ConfigError(
                    "reward.judge.model_path",
                    f"env type '{spec.env_type}' (tag {spec.tag}) grades answers with an LLM "
                    "judge, and this run has none",
                    "set reward.judge.model_path (ROLL: the reward section's model)",
                )

    @classmethod
    def from_agentic(
        cls, agentic: AgenticConfig, which: Literal["train", "val"], seed: int, **kw: Any
    ) -> EnvManager:
        """The train or val manager of an ``AgenticConfig``."""
        cfg = agentic.train_env_manager if which == "train" else agentic.val_env_manager
        return cls(
            cfg,
            agentic.custom_envs,
            seed=seed,
            mode=which,
            action_sep=agentic.action_sep,
            enable_think=agentic.enable_think,
            max_actions_per_traj=agentic.max_actions_per_traj,
            key=f"agentic.{which}_env_manager",
            **kw,
        )

    # ------------------------------------------------------------------ layout and seeds

    @property
    def num_envs(self) -> int:
        """Env instances in the pool (``num_env_groups × group_size``)."""
        return len(self._states)

    def seed(self, step: int, group_id: int, round_: int = 0) -> int:
        """The episode seed of a group (even for train, odd for val)."""
        stream = 0 if self.mode == "train" else 1
        ss = np.random.SeedSequence([self.run_seed, stream, int(step), int(group_id), round_])
        return int(ss.generate_state(1, dtype=np.uint32)[0] >> 1) * 2 + stream

    # ------------------------------------------------------------------ episodes

    def _instruction(self, st: _EnvState) -> str:
        env, spec = st.env, st.spec
        parts = [spec.env_instruction or env.instructions]
        if spec.env_instruction:
            parts.append(env.action_space_text)
        if spec.turn_template or spec.next_step_template:  # ROLL's templates state the
            # reply format themselves
            return "\n".join(p for p in parts if p)
        line = ""
        if "<answer>" in spec.action_pattern:  # a free-form pattern states its own format
            fmt = (
                "<think>…</think><answer>…</answer>" if self.enable_think else "<answer>…</answer>"
            )
            line = f"Reply in the format {fmt}."
        if spec.max_words:
            line += f" Keep the reply under {spec.max_words} words."
        parts.append(line.strip())
        return "\n".join(p for p in parts if p)

    def turn_text(self, env_id: int, observation: str, suffix: str | None = None) -> str:
        """What the model reads after a turn: the observation, then the tag's
        ``turn_prompt`` (a question asked last is what small models answer) — or, with a
        ``turn_template`` (ROLL's ``agent_template``), that template rendered with
        ``observation``, ``turn_idx`` (1 on the first turn), ``actions_left``,
        ``max_response_length`` (the tag's per-turn token budget) and ``suffix`` (the env's
        :meth:`TextEnv.suffix`, or ``suffix`` when given), filled as ``str.format`` fills ROLL's (``{{``/``}}`` are
        braces; :func:`temper.envs.steps.fill_template`)."""
        st = self._states[env_id]
        if st.spec.turn_template:
            fields = {
                "observation": observation,
                "turn_idx": st.turns + 1,
                "actions_left": max(0, st.spec.max_turns - st.turns),
                "max_response_length": st.spec.max_tokens_per_turn,
                "suffix": st.env.suffix() if suffix is None else suffix,
            }
            return fill_template(st.spec.turn_template, fields)
        prompt = st.spec.turn_prompt
        return f"{observation}\n\n{prompt}" if prompt else observation

    def step_text(self, env_id: int, records: Sequence[StepRecord]) -> str:
        """A step-wise episode's next prompt (:func:`temper.envs.steps.render_step_prompt`):
        the env's instruction, the tag's window over ``records`` (the episode's steps so
        far) and its current observation, in the tag's ``turn_template`` when it has one."""
        st = self._states[env_id]
        return render_step_prompt(
            instruction=st.instruction,
            observation=st.observation,
            records=records,
            history_length=st.spec.history_length,
            template=st.spec.turn_template,
            turn_prompt=st.spec.turn_prompt,
            max_response_length=st.spec.max_tokens_per_turn,
        )

    def concat_text(self, env_id: int, records: Sequence[StepRecord]) -> str:
        """A step-concat episode's next prompt
        (:func:`temper.envs.steps.render_concat_prompt`): the window's observations and the
        current one with the env's suffix, in the tag's ``turn_template`` when it has one."""
        st = self._states[env_id]
        return render_concat_prompt(
            observation=st.observation,
            suffix=st.env.suffix(),
            records=records,
            history_length=st.spec.history_length,
            template=st.spec.turn_template,
        )

    def system_message(self, tag: str) -> str:
        """The tag's system message (ROLL's ``agent_system_template``), or ''."""
        return self.specs[tag].system_template

    def reset(
        self, step: int, round_: int = 0, groups: Sequence[int] | None = None
    ) -> list[EnvSlot]:
        """Start one episode in every env (of ``groups`` only, when given: the others keep
        their state); seeds from (run seed, step, group, round)."""
        slots = []
        wanted = None if groups is None else set(groups)
        for env_id, st in enumerate(self._states):
            if wanted is not None and st.group_id not in wanted:
                continue
            st.seed = self.seed(step, st.group_id, round_)
            st.observation, info = st.env.reset(st.seed)
            st.instruction = self._instruction(st)
            st.turns = st.actions = 0
            st.episode_return, st.done, st.success = 0.0, False, False
            st.tool_calls = st.tool_successes = st.env_errors = 0
            st.frames = self._frame(st) if self.record_frames else []
            slots.append(
                EnvSlot(
                    env_id,
                    st.group_id,
                    st.spec.tag,
                    st.seed,
                    st.observation,
                    st.instruction,
                    dict(info),
                )
            )
        return slots

    def _frame(self, st: _EnvState) -> list[Any]:
        """The text frame, plus the image frame where the env renders ``rgb_array``."""
        out: list[Any] = [st.env.render("text")]
        if "rgb_array" in st.spec.cls.render_modes:
            out.append(st.env.render("rgb_array"))
        return out

    def step(self, env_ids: Sequence[int], responses: Sequence[str]) -> list[EnvTurnResult]:
        """Apply one raw model response to each env; see the module docstring."""
        if len(env_ids) != len(responses):
            raise ValueError(f"{len(env_ids)} env ids but {len(responses)} responses")
        results = [self._step_one(int(i), r) for i, r in zip(env_ids, responses)]
        self._judge(results)
        return results

    def _judge(self, results: Sequence[EnvTurnResult]) -> None:
        """Grade the episode ends the turn left for the judge (:func:`judging.grade`): each
        env's reward for its verdict joins its step's reward and its episode's return."""
        graded = grade([(r.env_id, self._states[r.env_id].env) for r in results], self.judge)
        for r in results:
            if r.env_id not in graded:
                continue
            reward, info = graded[r.env_id]
            st = self._states[r.env_id]
            r.reward += reward
            st.episode_return += reward
            r.info.update(info)
            r.success = st.success = bool(info.get("success", False)) and r.terminated

    def _step_one(self, env_id: int, response: str) -> EnvTurnResult:
        st = self._states[env_id]
        if st.done:
            raise ValueError(f"env {env_id} is done; reset the manager first")
        valid = st.env.valid_actions()
        if st.env.whole_response:  # the env parses the answer itself (TextEnv.whole_response)
            parsed = ParsedAction(response, True, "", actions=[response], content=response)
        else:
            parsed = parse_action(
                response,
                st.spec.action_pattern,
                valid_actions=valid,
                require_think=self.enable_think,
                action_sep=self.action_sep if valid is not None else None,
            )
        budget = None
        if self.max_actions_per_traj is not None:
            budget = max(0, self.max_actions_per_traj - st.actions)
        todo = parsed.actions if budget is None else parsed.actions[:budget]
        reward, terminated, truncated, all_valid, executed = 0.0, False, False, True, 0
        info: dict[str, Any] = {}
        for action in todo:
            obs, r, terminated, truncated, info = st.env.step(action)
            st.observation, executed = obs, executed + 1
            reward += float(r)
            all_valid = all_valid and bool(info.get("action_is_valid", True))
            if self.record_frames:
                st.frames.extend(self._frame(st))
            if terminated or truncated:
                break
        st.actions += executed
        st.turns += 1
        if info.get("tool_call"):
            st.tool_calls += 1
            st.tool_successes += int(not info.get("tool_error"))
        if info.get("env_error"):
            st.env_errors += 1
            logger.warning(
                "env %d (tag %s, seed %d) failed, its episode ends: %s",
                env_id,
                st.spec.tag,
                st.seed,
                info["env_error"],
            )
        format_ok = parsed.valid and all_valid
        penalty = (
            0.0
            if format_ok or st.env.whole_response
            else float(
                self.cfg.format_penalty
                if self.cfg.format_penalty is not None
                else st.spec.format_penalty
            )
        )
        reward += penalty
        success = bool(info.get("success", False)) and terminated
        if not (terminated or truncated) and (
            st.turns >= st.spec.max_turns
            or (self.max_actions_per_traj is not None and st.actions >= self.max_actions_per_traj)
        ):
            truncated = True
        st.done, st.success = terminated or truncated, success
        st.episode_return += reward
        info = {**info, "parse_reason": parsed.reason, "turn": st.turns, "actions": st.actions}
        return EnvTurnResult(
            env_id=env_id,
            observation=st.observation,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            done=st.done,
            actions=list(parsed.actions),
            executed=executed,
            format_ok=format_ok,
            penalty=penalty,
            success=success,
            info=info,
        )

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """Seeds and layout (see the module docstring), plain ints and strings."""
        return {
            "run_seed": self.run_seed,
            "mode": self.mode,
            "group_tags": list(self.group_tags),
            "group_size": self.group_size,
            "seeds": [st.seed for st in self._states],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: the same run seed, mode and layout, or a ConfigError
        (another layout would not replay the same episodes)."""
        mine = self.state_dict()
        for key in ("run_seed", "mode", "group_tags", "group_size"):
            if state.get(key) != mine[key]:
                raise ConfigError(
                    "experiment.resume_mode",
                    f"the checkpoint's {self.mode} env manager has {key}={state.get(key)!r}, "
                    f"this run {mine[key]!r}: resuming would not play the same episodes",
                    "resume with the same seed and env managers, or start a new run "
                    "(resume_mode=disable)",
                )
        for st, seed in zip(self._states, state["seeds"]):
            st.seed = int(seed)

    # ------------------------------------------------------------------ queries

    def active(self) -> list[int]:
        """Env ids whose trajectory is still running."""
        return [i for i, st in enumerate(self._states) if not st.done]

    def episode_stats(self, env_id: int) -> dict[str, Any]:
        """Return, success, turns, actions, tool calls (successful ones) and env failures
        of the env's current/last episode."""
        st = self._states[env_id]
        return {
            "tag": st.spec.tag,
            "group_id": st.group_id,
            "seed": st.seed,
            "return": st.episode_return,
            "success": st.success,
            "turns": st.turns,
            "actions": st.actions,
            "tool_calls": st.tool_calls,
            "tool_successes": st.tool_successes,
            "env_errors": st.env_errors,
        }

    def observation(self, env_id: int) -> str:
        """The env's current observation: the state its next step starts from."""
        return self._states[env_id].observation

    def env(self, env_id: int) -> TextEnv:
        """The env instance (e.g. to render it)."""
        return self._states[env_id].env

    def frames(self, env_id: int) -> list[Any]:
        """Frames recorded this episode (``record_frames=True``): after the reset and after
        each executed action, the text frame followed by the rgb image when the env has one."""
        return list(self._states[env_id].frames)

    def close(self) -> None:
        """Close every env."""
        for st in self._states:
            st.env.close()
