"""Grading episode ends with the LLM judge, batched over a turn's envs.

An env that grades with the judge (``TextEnv.uses_judge``, DeepEyes) leaves a
:class:`~temper.envs.base.JudgeRequest` when a step ends its episode. :func:`grade` sends
the requests of one turn to the judge in as few calls as their template arguments allow
(one per distinct set, envs in order, so a run's judge batches are the same every time)
and hands each verdict back to its env (``TextEnv.judged``). A judge call that raises
gives every episode of that call a ``None`` verdict with the error: each is scored as the
env scores a failed judgement, never crashing the turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temper.rewards.judge import JudgeEngine

from .base import JudgeRequest, TextEnv

__all__ = ["grade"]


def grade(
    envs: Sequence[tuple[int, TextEnv]], judge: JudgeEngine | None
) -> dict[int, tuple[float, dict[str, Any]]]:
    """``{env_id: (reward, info)}`` for the ``(env_id, env)`` pairs whose last step left a
    judge request (module doc)."""
    waiting: dict[tuple[Any, ...], list[tuple[int, TextEnv, JudgeRequest]]] = {}
    for env_id, env in envs:
        request = env.judge_request() if env.uses_judge else None
        if request is not None:
            key = tuple(sorted(request.template_kwargs.items()))
            waiting.setdefault(key, []).append((env_id, env, request))
    out: dict[int, tuple[float, dict[str, Any]]] = {}
    for key, items in waiting.items():
        if judge is None:
            raise RuntimeError("an env asked for the LLM judge, and the run has none")
        error = ""
        try:
            verdicts: list[str | None] = list(
                judge.complete([q.messages for _, _, q in items], dict(key))
            )
        except Exception as err:  # the judge failed: each episode records why
            error = f"{type(err).__name__}: {err}"[:300]
            verdicts = [None] * len(items)
        for (env_id, env, _), verdict in zip(items, verdicts):
            out[env_id] = env.judged(verdict, error)
    return out
