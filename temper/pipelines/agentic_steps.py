"""The step-wise env manager (ROLL's ``StepEnvManager``): every env step is a sample.

Where the trajectory env manager grows one conversation per episode and trains on it as
one sample, the step-wise manager prompts the model afresh at every env step — the
task's instruction, a window of the episode's last steps and the current observation
(:meth:`temper.envs.EnvManager.step_text`, the tag's ``history_length`` and
``turn_template``) — and turns each step into its own training sample: that prompt and
that one answer. Every sample carries

- ``uid``: its episode group (same seed and config: the GRPO group, ROLL's
  ``traj_group_id``), ``episode_index`` and ``step_index`` (0 first);
- ``anchor_index``: the observation the step started from, verbatim — samples of one
  group with equal keys started from identical states (GiGPO's anchor states);
- ``step_rewards``: the env's reward for the step (format penalty included), and
  ``scores``: its episode's return (``agentic.step_score=episode``) or the step's
  discounted return-to-go (``return_to_go``: :func:`returns_to_go`, ROLL's
  ``step_reinforce``), which the shaping phase normalizes as it does a trajectory's.

Each round plays every env of the manager to its end, one ``generate`` per env step for
all live episodes. A step's prompt is bounded like a dataset prompt: an episode whose
next prompt is longer than ``data.max_prompt_length`` tokens, or leaves no room to answer
in ``rollout.max_model_len``, ends there (``stop_reason`` ``context``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.data.batch import Batch
from temper.envs import EnvManager, EnvSlot, EnvTurnResult, StepRecord
from temper.pipelines.agentic_rollout import (
    EpisodeLog,
    Played,
    _tag_tools,
    multi_turn_settings,
)
from temper.rollout import RolloutEngine, SamplingParams
from temper.rollout.chat import ChatTokenizer
from temper.rollout.multiturn import (
    EpisodeSpec,
    Feedback,
    MultiTurnRunner,
    Trajectory,
    trajectory_tensors,
)
from temper.rollout.partial import Segments

#: What a step sample carries for the advantage estimators (``AdvantageInputs`` fields).
STEP_INPUTS = frozenset({"step_rewards", "episode_index", "step_index", "anchor_index"})


class StepPlayer:
    """Plays an env manager's episodes step by step (see the module docstring)."""

    def __init__(self, cfg: TemperConfig, engine: RolloutEngine, tokenizer: Any) -> None:
        self.cfg = cfg
        kwargs = dict(cfg.data.apply_chat_template_kwargs)
        chat = ChatTokenizer(tokenizer, template_kwargs=kwargs)  # check_step refuses tools
        self.runner = MultiTurnRunner(engine, chat, multi_turn_settings(cfg))
        self.max_prompt_length = cfg.data.max_prompt_length

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
        """Reset every env of ``manager`` (of ``groups``, when given) for ``step`` (round
        ``round_`` of dynamic sampling: other seeds) and play the episodes step by step
        to their ends. With ``segments`` (a partial rollout) an env step is a turn
        boundary: newer weights are pushed before the next step's answers."""
        slots = manager.reset(step, round_, groups)
        suffix = f"#r{round_}" if round_ else ""
        records: dict[int, list[StepRecord]] = {s.env_id: [] for s in slots}
        dialogs: dict[int, list[dict[str, Any]]] = defaultdict(list)
        stops: dict[int, str] = {}
        samples: list[Trajectory] = []
        calls, live = 0, list(slots)
        while live:
            specs = [self._spec(manager, s, step, suffix, records[s.env_id]) for s in live]
            fits = [
                len(self.runner.chat.prompt(sp.messages)[0]) <= self.max_prompt_length
                for sp in specs
            ]
            for slot in (s for s, ok in zip(live, fits) if not ok):
                stops[slot.env_id] = "context"  # the prompt outgrew data.max_prompt_length
            live = [s for s, ok in zip(live, fits) if ok]
            specs = [sp for sp, ok in zip(specs, fits) if ok]
            if not live:
                break
            results: dict[int, EnvTurnResult] = {}
            if segments is not None and calls:
                segments = segments.next_turn()
            trajs = self.runner.run(specs, _Responder(manager, live, results), params, segments)
            calls += int(self.runner.metrics.get("rollout/generate_calls", 0))
            still = []
            for i, (slot, t) in enumerate(zip(live, trajs)):
                r = results.get(i)
                if r is None:  # no room left to answer: the episode ends before this step
                    stops[slot.env_id] = t.stop_reason or "context"
                    continue
                samples.append(t)
                answer = str(t.messages[-1]["content"])
                records[slot.env_id].append(
                    StepRecord(t.meta["anchor_index"], answer, r.reward, r.format_ok)
                )
                dialogs[slot.env_id] += t.messages[-2:]
                if r.done:
                    stops[slot.env_id] = "done"
                else:
                    still.append(slot)
            live = still
        samples.sort(key=lambda t: (t.meta["env_id"], t.meta["step_index"]))
        batch = self._batch(samples, manager, records)
        episodes, logs = self._episodes(slots, manager, records, dialogs, stops)
        n = max(len(samples), 1)
        metrics = {
            "rollout/generate_calls": float(calls),
            "rollout/turn_cut_frac": sum(t.cut_turns for t in samples) / n,
            "rollout/sequence_length_mean": sum(len(t) for t in samples) / n,
            "rollout/context_stop_frac": sum(v == "context" for v in stops.values())
            / max(len(slots), 1),
            "env/step_samples": float(len(samples)),
            **anchor_group_metrics(batch["uid"], batch["anchor_index"]),
        }
        return Played(batch, episodes, logs, metrics)

    def _spec(
        self,
        manager: EnvManager,
        slot: EnvSlot,
        step: int,
        suffix: str,
        records: list[StepRecord],
    ) -> EpisodeSpec:
        """The single-turn episode of one env step."""
        spec = manager.specs[slot.tag]
        system = manager.system_message(slot.tag)
        first = [{"role": "system", "content": system}] if system else []
        text = self._text(manager, slot.env_id, records)
        meta = {
            "uid": f"{step}:{slot.group_id}{suffix}",
            "tag": slot.tag,
            "group_id": slot.group_id,
            "seed": slot.seed,
            "env_id": slot.env_id,
            "episode_index": f"{step}:{slot.env_id}{suffix}",
            "step_index": len(records),
            "anchor_index": manager.observation(slot.env_id),
        }
        return EpisodeSpec(
            [*first, {"role": "user", "content": text}],
            meta,
            max_turns=1,
            max_tokens_per_turn=spec.max_tokens_per_turn,
        )

    def _text(self, manager: EnvManager, env_id: int, records: list[StepRecord]) -> str:
        """The user message of the step after ``records``."""
        return manager.step_text(env_id, records)

    def _batch(
        self,
        samples: list[Trajectory],
        manager: EnvManager,
        records: dict[int, list[StepRecord]],
    ) -> Batch:
        """One row per step: its tokens, ``scores`` (the episode's return), the step's
        reward and keys, and the episode's outcome for dumps and loss masks."""
        if not samples:
            raise ConfigError(
                "data.max_prompt_length",
                f"no env step had room to answer: every first prompt is longer than "
                f"{self.max_prompt_length} tokens or leaves no room in rollout.max_model_len",
                "raise data.max_prompt_length and rollout.max_model_len (ROLL: "
                "sequence_length), or shorten the tags' templates",
            )
        env_ids = [int(t.meta["env_id"]) for t in samples]
        returns = {e: sum(r.reward for r in rs) for e, rs in records.items()}
        success = {e: bool(manager.episode_stats(e)["success"]) for e in records}
        objects: dict[str, list[Any]] = {
            "uid": [str(t.meta["uid"]) for t in samples],
            "tag": [str(t.meta["tag"]) for t in samples],
            "episode_index": [str(t.meta["episode_index"]) for t in samples],
            "anchor_index": [str(t.meta["anchor_index"]) for t in samples],
            "episode_return": [returns[e] for e in env_ids],
            "success": [success[e] for e in env_ids],
            "num_turns": [len(records[e]) for e in env_ids],
            "invalid_actions": [int(not t.infos[-1].get("format_ok", True)) for t in samples],
            "truncated": [t.cut_turns > 0 for t in samples],
            "stop_reason": [t.stop_reason for t in samples],
            "turn_rewards": [list(t.turn_rewards) for t in samples],
            "turn_ends": [list(t.turn_ends) for t in samples],
            "start_key": [(t.meta["tag"], tuple(t.prompt_ids)) for t in samples],
        }
        tensors = trajectory_tensors(samples, self.pad_token_id)
        agentic = self.cfg.agentic
        if agentic.step_score == "return_to_go":  # ROLL's step_reinforce
            to_go = {
                e: returns_to_go([r.reward for r in rs], agentic.step_score_gamma)
                for e, rs in records.items()
            }
            step_scores = [to_go[e][int(t.meta["step_index"])] for e, t in zip(env_ids, samples)]
        else:
            step_scores = [returns[e] for e in env_ids]
        tensors["scores"] = torch.tensor(step_scores, dtype=torch.float32)
        tensors["step_rewards"] = torch.tensor(
            [t.turn_rewards[-1] for t in samples], dtype=torch.float32
        )
        tensors["step_index"] = torch.tensor(
            [int(t.meta["step_index"]) for t in samples], dtype=torch.long
        )
        return Batch.from_dict(tensors, objects)

    @staticmethod
    def _episodes(
        slots: list[EnvSlot],
        manager: EnvManager,
        records: dict[int, list[StepRecord]],
        dialogs: dict[int, list[dict[str, Any]]],
        stops: dict[int, str],
    ) -> tuple[Batch, list[EpisodeLog]]:
        """One row per episode (what ``episode_metrics`` reads) and the dialogues."""
        rows = [records[s.env_id] for s in slots]
        returns = [sum(r.reward for r in rs) for rs in rows]
        objects: dict[str, list[Any]] = {
            "tag": [s.tag for s in slots],
            "episode_return": returns,
            "success": [bool(manager.episode_stats(s.env_id)["success"]) for s in slots],
            "num_turns": [len(rs) for rs in rows],
            "invalid_actions": [sum(not r.valid for r in rs) for rs in rows],
            "truncated": [stops.get(s.env_id) == "context" for s in slots],
            "tool_calls": [manager.episode_stats(s.env_id)["tool_calls"] for s in slots],
            "tool_successes": [manager.episode_stats(s.env_id)["tool_successes"] for s in slots],
            "env_errors": [manager.episode_stats(s.env_id)["env_errors"] for s in slots],
        }
        episodes = Batch.from_dict({"scores": torch.tensor(returns)}, objects)
        logs = [
            EpisodeLog(s, dialogs[s.env_id], ret, len(rs), stops.get(s.env_id, ""))
            for s, ret, rs in zip(slots, returns, rows)
        ]
        return episodes, logs


class StepConcatPlayer(StepPlayer):
    """ROLL's ``StepConcatEnvManager``: the step samples of :class:`StepPlayer`, each
    prompt the tag's window of earlier observations and the current one
    (:meth:`temper.envs.EnvManager.concat_text`) — GEM's observation concatenation."""

    def _text(self, manager: EnvManager, env_id: int, records: list[StepRecord]) -> str:
        return manager.concat_text(env_id, records)


def returns_to_go(rewards: Sequence[float], gamma: float) -> list[float]:
    """The discounted return from each step of an episode on:
    ``G_t = r_t + γ·G_{t+1}``, ``G_T = r_T`` (ROLL's step returns of ``step_reinforce``)."""
    out = [0.0] * len(rewards)
    following = 0.0
    for t in reversed(range(len(rewards))):
        following = float(rewards[t]) + gamma * following
        out[t] = following
    return out


def anchor_group_metrics(groups: list[str], anchors: list[str]) -> dict[str, float]:
    """Sizes of the step groups (samples of one episode group from one state):
    ``env/anchor_group_size_max`` / ``_mean`` and ``env/anchor_grouped_frac``, the share of
    step samples whose state another sample of their group also started from (those get
    a step-level advantage)."""
    sizes = Counter(zip(groups, anchors))
    n = max(len(anchors), 1)
    return {
        "env/anchor_group_size_max": float(max(sizes.values(), default=0)),
        "env/anchor_group_size_mean": n / max(len(sizes), 1),
        "env/anchor_grouped_frac": sum(c for c in sizes.values() if c > 1) / n,
    }


class _Responder:
    """Steps the envs of one round's live episodes with their answers; each step is a
    whole single-turn episode for the runner (``done``), its result kept for the caller."""

    def __init__(
        self, manager: EnvManager, live: list[EnvSlot], results: dict[int, EnvTurnResult]
    ) -> None:
        self.manager, self.live, self.results = manager, live, results

    def __call__(self, indices: list[int], texts: list[str]) -> list[Feedback]:
        stepped = self.manager.step([self.live[i].env_id for i in indices], texts)
        out = []
        for i, r in zip(indices, stepped):
            self.results[i] = r
            info = {"success": r.success, "format_ok": r.format_ok, "executed": r.executed}
            out.append(Feedback([], reward=r.reward, done=True, info=info))
        return out


def check_step(cfg: TemperConfig) -> None:
    """What the step-wise env manager cannot honour (``ConfigError``)."""
    agentic = cfg.agentic
    if agentic.use_turn_rewards:
        raise ConfigError(
            "agentic.use_turn_rewards",
            "with agentic.env_manager=step every env step is its own sample: there are no "
            "turns inside a sample to place rewards on (the step rewards reach gigpo's "
            "step returns instead)",
            "remove agentic.use_turn_rewards (ROLL use_turn_scores), or set "
            "agentic.env_manager=trajectory",
        )
    mt = cfg.rollout.multi_turn
    if mt.tool_config_path:
        raise ConfigError(
            "rollout.multi_turn.tool_config_path",
            "the step-wise env manager prompts each env step as one question and one "
            "answer; a tool call would need turns inside the step",
            "remove it, or set agentic.env_manager=trajectory",
        )
    for which in ("train_env_manager", "val_env_manager"):
        for tag in getattr(agentic, which).tags:
            if tag in agentic.custom_envs and _tag_tools(cfg, tag):
                raise ConfigError(
                    f"agentic.custom_envs.{tag}.env_type",
                    f"env type {agentic.custom_envs[tag].env_type} offers tools; the "
                    "step-wise env manager prompts each env step as one question and one "
                    "answer",
                    "set agentic.env_manager=trajectory for tool environments",
                )
