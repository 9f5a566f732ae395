"""The user turns of verl interactions inside a multi-turn rollout.

After each model turn without a tool call, the episode's interaction (a simulated user,
e.g. :class:`temper.rewards.interactions.Gsm8kInteraction`) reads the conversation and
answers: its text goes back as a ``user`` message (context, mask 0), its score is kept in
the episode's ``turn_scores``, and ``done`` ends the episode. As in verl, no interaction is
asked once the episode is at its turn limits (``max_assistant_turns``,
``max_user_turns``, tool turns counted as user turns): the episode ends on that answer.

Which interaction an episode talks to, and with what, is its row's
``extra_info.interaction_kwargs`` (verl's: ``{"name": …, "ground_truth": …, …}``); a row
without them talks to the config's only interaction with its own ground truth.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from temper.rollout.chat import Message
from temper.rollout.multiturn import Feedback, MultiTurnSettings, Responder


class Interaction(Protocol):
    """A simulated user (verl's ``BaseInteraction`` lifecycle, synchronous)."""

    def start(self, instance_id: str, **kwargs: Any) -> None: ...

    def respond(
        self, instance_id: str, messages: Sequence[dict[str, Any]]
    ) -> tuple[bool, str, float, dict[str, Any]]: ...

    def finalize(self, instance_id: str) -> None: ...


def interaction_kwargs(
    extra_info: Mapping[str, Any] | None, ground_truth: Any, names: Sequence[str]
) -> dict[str, Any]:
    """The episode's ``interaction_kwargs`` (its ``name`` checked against ``names``)."""
    given = (extra_info or {}).get("interaction_kwargs")
    if given is None:
        if len(names) != 1:
            raise ValueError(
                "a row without extra_info.interaction_kwargs, with several interactions "
                f"({', '.join(names)}): say which one in its interaction_kwargs.name"
            )
        return {"name": names[0], "ground_truth": ground_truth}
    if not isinstance(given, Mapping) or given.get("name") not in names:
        raise ValueError(
            f"extra_info.interaction_kwargs must name one of the interactions "
            f"({', '.join(names)}), got {given!r}"
        )
    return dict(given)


class InteractionTurns:
    """One rollout's interaction episodes: :meth:`begin`, then :meth:`wrap` the responder
    (it keeps each conversation) with :meth:`answer` as its final-answer handler, then
    :meth:`end`."""

    _ids = itertools.count()

    def __init__(self, interactions: Mapping[str, Interaction], settings: MultiTurnSettings):
        self.interactions, self.settings = dict(interactions), settings
        self.names = list(self.interactions)
        self._episodes: list[tuple[str, str, dict[str, Any]]] = []
        self.transcripts: list[list[Message]] = []
        self.scores: list[list[float]] = []
        self._turns: list[list[int]] = []  # [assistant turns, user turns] per episode
        self.ended = 0

    def begin(self, messages: Sequence[Sequence[Message]], kwargs: Sequence[dict[str, Any]]):
        """Start one interaction instance per episode."""
        self._episodes, self.transcripts, self.scores, self._turns = [], [], [], []
        self.ended = 0
        for msgs, kw in zip(messages, kwargs, strict=True):
            kw = dict(kw)
            name = str(kw.pop("name"))
            instance = f"episode-{next(self._ids)}"
            self.interactions[name].start(instance, **kw)
            self._episodes.append((name, instance, kw))
            self.transcripts.append([dict(m) for m in msgs])
            self.scores.append([])
            self._turns.append([0, 0])

    def wrap(self, respond: Responder) -> Responder:
        """``respond`` that also records every turn (the conversation an interaction
        reads, and the turn counts its limits need)."""

        def wrapped(indices: list[int], texts: list[str]) -> list[Feedback]:
            for i, text in zip(indices, texts):
                self.transcripts[i].append({"role": "assistant", "content": text})
                self._turns[i][0] += 1
            feedback = respond(indices, texts)
            for i, fb in zip(indices, feedback):
                self.transcripts[i].extend(dict(m) for m in fb.messages)
                self._turns[i][1] += int(bool(fb.messages) and not fb.done)
            return feedback

        return wrapped

    def answer(self, indices: list[int], texts: list[str]) -> list[Feedback]:
        """The interactions' user turns for final answers (see the module docstring)."""
        out = []
        for i in indices:
            if self._at_limit(i):
                out.append(Feedback([]))  # the runner ends it at its limit
                continue
            name, instance, _ = self._episodes[i]
            done, text, score, info = self.interactions[name].respond(instance, self.transcripts[i])
            self.scores[i].append(float(score))
            self.ended += int(done)
            messages = [] if done else [{"role": "user", "content": text}]
            out.append(Feedback(messages, reward=float(score), done=done, info=dict(info)))
        return out

    def _at_limit(self, i: int) -> bool:
        assistant, user = self._turns[i]
        s = self.settings
        return (s.max_assistant_turns is not None and assistant >= s.max_assistant_turns) or (
            s.max_user_turns is not None and user >= s.max_user_turns
        )

    def end(self) -> dict[str, float]:
        """Finalize every instance; the rollout's interaction metrics."""
        for name, instance, _ in self._episodes:
            self.interactions[name].finalize(instance)
        n = max(len(self.scores), 1)
        flat = [s for scores in self.scores for s in scores]
        return {
            "interaction/turns_mean": len(flat) / n,
            "interaction/score_mean": sum(flat) / max(len(flat), 1),
            "interaction/done_frac": self.ended / n,
        }
