"""The multi-turn episode runner: many conversations, one ``generate`` call per turn.

Every turn, all live episodes go to ``engine.generate`` together (n=1), so the engine
sees large batches however many turns an episode takes. For each episode the runner
keeps one growing token sequence (see :mod:`temper.rollout.chat`):

``prompt_ids`` (system + instruction + first observation + generation prompt), then
``response_ids`` = model turn ‖ closing scaffold + observation/tool messages +
generation prompt ‖ model turn ‖ …, with ``response_mask`` 1 exactly on the ids the
model generated and their sampling log-probs kept alongside (0 elsewhere).

With ``inference_template`` (verl ``use_inference_chat_template``), each later turn is
generated from the chat template's rendering of the conversation so far, as an
inference server would see it (templates such as Qwen3's drop earlier turns'
``<think>`` there), while the trained sequence stays the incremental one above. Where
the two differ, the sampling log-probs were computed on another context, so the
trajectory carries none (the trainer recomputes old log-probs on the trained
sequence); for prefix-stable templates the two are identical and nothing changes.

What happens between turns is the caller's ``respond(indices, texts) -> [Feedback]``:
stepping environments, running tools, or both — the runner does not know. An episode
stops when its feedback says ``done``, at its assistant-turn limit
(``max_assistant_turns``), at the user/tool-turn limit (``max_user_turns``), or when
the context budget (``max_model_len``) leaves no room for another turn.

With ``segments`` (a partial rollout, :mod:`temper.rollout.partial`), every turn is
generated through the one segment loop, newer weights pushed between its segments and
at every turn boundary (:meth:`~temper.rollout.partial.Segments.next_turn`); each model
token records the version that sampled it (``Trajectory.versions``, 0 on the tokens the
model did not generate), which :func:`trajectory_tensors` returns as
``response_versions``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from temper.rollout.base import RolloutEngine, SamplingParams
from temper.rollout.chat import ChatTokenizer, Message, SanityResult, TokenizationMismatch
from temper.rollout.partial import RESPONSE_VERSIONS, Segments
from temper.rollout.turns import Turn, generate_turns

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Feedback:
    """What the world answers to one model turn.

    ``messages`` (observation as a user message, tool results as tool messages) are
    shown to the model next turn unless ``done``; ``reward`` is this turn's reward;
    ``info`` is kept per turn in the trajectory (``success``, ``format_ok``, …).
    """

    messages: list[Message]
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


Responder = Callable[[list[int], list[str]], list[Feedback]]


@dataclasses.dataclass
class EpisodeSpec:
    """The start of one episode: its first messages, and data carried to the trajectory."""

    messages: list[Message]
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)
    max_turns: int | None = None  # assistant turns (combined with the runner's limit)
    max_tokens_per_turn: int | None = None  # None: the runner's
    max_len: int | None = None  # prompt + response budget of this episode (with the runner's)


@dataclasses.dataclass
class Trajectory:
    """One played episode as a token sequence plus per-turn bookkeeping."""

    meta: dict[str, Any]
    messages: list[Message]
    prompt_ids: list[int]
    response_ids: list[int] = dataclasses.field(default_factory=list)
    response_mask: list[int] = dataclasses.field(default_factory=list)
    log_probs: list[float] = dataclasses.field(default_factory=list)
    #: the policy version that sampled each response token (0 where not the model's);
    #: ``versioned``: played as a partial rollout, so the versions are recorded
    versions: list[int] = dataclasses.field(default_factory=list)
    versioned: bool = False
    turn_rewards: list[float] = dataclasses.field(default_factory=list)
    turn_ends: list[int] = dataclasses.field(default_factory=list)  # last model token per turn
    infos: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    user_turns: int = 0
    cut_turns: int = 0  # model turns cut at the per-turn token limit
    stop_reason: str = ""  # done | max_turns | max_user_turns | context
    sanity: SanityResult | None = None
    has_log_probs: bool = True
    rerendered_turns: int = 0  # turns generated from an inference rendering ≠ the sequence

    @property
    def num_turns(self) -> int:
        return len(self.turn_rewards)

    @property
    def episode_return(self) -> float:
        return float(sum(self.turn_rewards))

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    def append(
        self,
        ids: Sequence[int],
        mask: int,
        log_probs: Sequence[float] | None = None,
        versions: Sequence[int] | None = None,
    ) -> None:
        self.response_ids.extend(int(i) for i in ids)
        self.response_mask.extend([mask] * len(ids))
        if log_probs is None:
            self.log_probs.extend([0.0] * len(ids))
        else:
            self.log_probs.extend(float(x) for x in log_probs)
        if versions is None:
            self.versions.extend([0] * len(ids))
        else:
            self.versions.extend(int(v) for v in versions)
            self.versioned = True

    def add_turn(self, turn: Turn) -> None:
        """Append a generated model turn (mask 1) and its bookkeeping."""
        self.append(turn.ids, 1, turn.log_probs, turn.versions)
        self.has_log_probs &= turn.log_probs is not None
        self.turn_ends.append(len(self.response_ids) - 1)
        self.cut_turns += int(turn.cut)

    def trim(self) -> None:
        """Drop the tokens after the last model token (context nobody answered)."""
        last = max((k for k, m in enumerate(self.response_mask) if m), default=-1)
        for column in (self.response_ids, self.response_mask, self.log_probs, self.versions):
            del column[last + 1 :]


@dataclasses.dataclass
class MultiTurnSettings:
    """Limits of the runner (``rollout.multi_turn`` and the agentic tags)."""

    max_tokens_per_turn: int = 128
    max_assistant_turns: int | None = None
    max_user_turns: int | None = None
    max_model_len: int | None = None  # prompt + response budget per episode
    sanity_check: bool = True
    strict: bool = True  # raise on a template mismatch (else warn and count)
    inference_template: bool = False  # generate from the template's rendering (see module doc)


class MultiTurnRunner:
    """Plays episodes over any :class:`RolloutEngine` (token in, token out)."""

    def __init__(
        self,
        engine: RolloutEngine,
        chat: ChatTokenizer,
        settings: MultiTurnSettings,
        *,
        stop_token_ids: Sequence[int] | None = None,
        pad_token_id: int | None = None,
    ) -> None:
        tok = chat.tokenizer
        if stop_token_ids is None:
            stop_token_ids = list(engine.eos_token_ids) or [tok.eos_token_id]
        self.engine, self.chat, self.settings = engine, chat, settings
        self.stop_token_ids = [int(i) for i in stop_token_ids if i is not None]
        pad = pad_token_id if pad_token_id is not None else engine.pad_token_id
        self.pad_token_id = int(pad if pad is not None else (tok.pad_token_id or 0))
        self.metrics: dict[str, float] = {}

    # ------------------------------------------------------------------ the loop

    def run(
        self,
        episodes: Sequence[EpisodeSpec],
        respond: Responder,
        params: SamplingParams,
        segments: Segments | None = None,
    ) -> list[Trajectory]:
        """Play every episode to its end; trajectories in the order of ``episodes``. With
        ``segments``, a partial rollout (module docstring): the first turn starts with
        ``segments.version``, every later turn after a weight push."""
        trajs, rendered = [], []
        for spec in episodes:
            ids, text = self.chat.prompt(spec.messages)
            traj = Trajectory(dict(spec.meta), [dict(m) for m in spec.messages], ids)
            traj.versioned = segments is not None  # an episode cut before its first turn too
            trajs.append(traj)
            rendered.append(text)
        live = list(range(len(episodes)))
        generate_calls = 0
        while live:
            budgets = {i: self._turn_budget(trajs[i], episodes[i]) for i in live}
            for i in [i for i in live if budgets[i] < 1]:
                trajs[i].stop_reason = "context"
            live = [i for i in live if budgets[i] >= 1]
            if not live:
                break
            if segments is not None and generate_calls:
                segments = segments.next_turn()  # a turn boundary: newer weights, if any
            generated = self._generate(
                [trajs[i] for i in live], [budgets[i] for i in live], params, segments
            )
            generate_calls += 1
            texts = []
            for i, turn in zip(live, generated):
                t = trajs[i]
                t.add_turn(turn)
                content = self.chat.assistant_content(turn.ids, self.stop_token_ids)
                t.messages.append({"role": "assistant", "content": content})
                texts.append(content)
            feedback = respond(list(live), texts)
            if len(feedback) != len(live):
                raise ValueError(f"respond() answered {len(feedback)} of {len(live)} turns")
            still = []
            for i, turn, fb in zip(live, generated, feedback):
                if self._after_turn(trajs[i], episodes[i], turn.ids, fb, rendered, i):
                    still.append(i)
            live = still
        for t in trajs:
            self._finish(t)
        self._collect_metrics(trajs, generate_calls)
        return trajs

    def _after_turn(
        self,
        t: Trajectory,
        spec: EpisodeSpec,
        ids: list[int],
        fb: Feedback,
        rendered: list[str],
        i: int,
    ) -> bool:
        """Record the feedback; append the next messages; False when the episode ends."""
        t.turn_rewards.append(float(fb.reward))
        t.infos.append(dict(fb.info))
        s = self.settings
        limits = [x for x in (spec.max_turns, s.max_assistant_turns) if x is not None]
        if fb.done:
            t.stop_reason = "done"
        elif limits and t.num_turns >= min(limits):
            t.stop_reason = "max_turns"
        elif s.max_user_turns is not None and t.user_turns >= s.max_user_turns:
            t.stop_reason = "max_user_turns"
        elif not fb.messages:
            t.stop_reason = "done"  # nothing to show: nothing left to answer
        else:
            content = t.messages[-1]["content"]
            delta, text = self.chat.continuation(rendered[i], t.messages, ids, content, fb.messages)
            limit = self._max_len(spec)
            if limit is not None and len(t) + len(delta) >= limit:
                t.stop_reason = "context"
                return False
            t.append(delta, 0)
            t.messages.extend(dict(m) for m in fb.messages)
            t.user_turns += 1
            rendered[i] = text
            return True
        return False

    def _turn_budget(self, t: Trajectory, spec: EpisodeSpec) -> int:
        per_turn = spec.max_tokens_per_turn or self.settings.max_tokens_per_turn
        limit = self._max_len(spec)
        return per_turn if limit is None else min(per_turn, limit - len(t))

    def _max_len(self, spec: EpisodeSpec) -> int | None:
        limits = [x for x in (spec.max_len, self.settings.max_model_len) if x is not None]
        return min(limits) if limits else None

    def _generate(
        self,
        trajs: list[Trajectory],
        budgets: list[int],
        params: SamplingParams,
        segments: Segments | None,
    ) -> list[Turn]:
        """One engine call (a partial rollout: one segmented call) for all live
        episodes; each row cut to its own budget."""
        rows = [self._context(t) for t in trajs]
        return generate_turns(
            self.engine, rows, self.pad_token_id, budgets, params, segments=segments
        )

    def _context(self, t: Trajectory) -> list[int]:
        """The ids a turn is generated from: the trained sequence, or with
        ``inference_template`` the template's rendering of the messages so far (the
        trajectory then loses its sampling log-probs when the two differ)."""
        ids = t.prompt_ids + t.response_ids
        if not self.settings.inference_template or not t.num_turns:
            return ids
        rendered, _ = self.chat.prompt(t.messages)
        if rendered != ids:
            t.rerendered_turns += 1
            t.has_log_probs = False
        return rendered

    # ------------------------------------------------------------------ the end

    def _finish(self, t: Trajectory) -> None:
        """Drop trailing non-model tokens (context nobody answered); sanity check."""
        t.trim()
        messages = t.messages
        while messages and messages[-1].get("role") != "assistant" and t.num_turns:
            messages = messages[:-1]  # the trimmed tail is not in the ids
        if not self.settings.sanity_check:
            return
        t.sanity = self.chat.sanity_check(t.prompt_ids + t.response_ids, messages)
        if not t.sanity.ok and not t.sanity.drift:
            msg = (
                f"chat-template tokenization mismatch: {t.sanity.detail}. The template is not "
                "prefix-stable or rewrites assistant content, so the incremental token "
                "sequence is not what the template renders."
            )
            if self.settings.strict:
                raise TokenizationMismatch(
                    f"{msg} Fix: use a template that renders history verbatim, or set "
                    "rollout.multi_turn.enable_tokenization_sanity_check=false to accept it"
                )
            log.warning(msg)

    def _collect_metrics(self, trajs: list[Trajectory], calls: int) -> None:
        checked = [t.sanity for t in trajs if t.sanity is not None]
        n = max(len(trajs), 1)
        self.metrics = {
            "rollout/generate_calls": float(calls),
            "rollout/turn_cut_frac": sum(t.cut_turns for t in trajs)
            / max(sum(t.num_turns for t in trajs), 1),
            "rollout/context_stop_frac": sum(t.stop_reason == "context" for t in trajs) / n,
            "rollout/sequence_length_mean": sum(len(t) for t in trajs) / n,
        }
        if self.settings.inference_template:
            self.metrics["rollout/inference_template_rerender_frac"] = sum(
                t.rerendered_turns for t in trajs
            ) / max(sum(max(t.num_turns - 1, 0) for t in trajs), 1)
        if checked:
            self.metrics["rollout/tokenization_drift_frac"] = sum(s.drift for s in checked) / len(
                checked
            )
            self.metrics["rollout/tokenization_mismatch_frac"] = sum(
                not s.ok and not s.drift for s in checked
            ) / len(checked)


def _pad(
    rows: Sequence[Sequence[float]], value: float, left: bool, dtype: torch.dtype
) -> torch.Tensor:
    width = max([len(r) for r in rows] + [1])
    out = torch.full((len(rows), width), value, dtype=dtype)
    for k, r in enumerate(rows):
        if r:
            t = torch.tensor(list(r), dtype=dtype)
            if left:
                out[k, width - len(r) :] = t
            else:
                out[k, : len(r)] = t
    return out


def trajectory_tensors(trajs: Sequence[Trajectory], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Training tensors of trajectories: left-padded prompts, right-padded responses.

    ``attention_mask`` (B, P+R) is 1 on every real token — observations and tool output
    are context the model attends to, only ``response_mask`` keeps them out of the loss.
    ``rollout_log_probs`` is present only when every trajectory has them;
    ``response_versions`` (the version that sampled each token, 0 where masked) when a
    partial rollout recorded them.
    """
    prompt_mask = _pad([[1] * len(t.prompt_ids) for t in trajs], 0, True, torch.long)
    present = _pad([[1] * len(t.response_ids) for t in trajs], 0, False, torch.long)
    out = {
        "prompt_ids": _pad([t.prompt_ids for t in trajs], pad_token_id, True, torch.long),
        "prompt_mask": prompt_mask,
        "response_ids": _pad([t.response_ids for t in trajs], pad_token_id, False, torch.long),
        "response_mask": _pad([t.response_mask for t in trajs], 0, False, torch.long),
        "attention_mask": torch.cat([prompt_mask, present], dim=1),
    }
    if all(t.has_log_probs for t in trajs):
        out["rollout_log_probs"] = _pad([t.log_probs for t in trajs], 0.0, False, torch.float32)
    if any(t.versioned for t in trajs):
        out[RESPONSE_VERSIONS] = _pad([t.versions for t in trajs], 0, False, torch.long)
    return out
