"""What GEM's environments share: rewards of its language games, answer extraction and
the QA exact match.

GEM (the ``gem-llm`` package that ROLL's ``qwen3_agentic_gem`` examples use) scores
every game with the same constants (:class:`GameReward`), reads an answer from the last
``\\boxed{…}`` (:func:`last_boxed_answer`) or the last ``<answer>…</answer>``
(:func:`last_tagged_answer`), and checks a QA answer by exact match after SQuAD's
normalization (:func:`normalize_answer`, :func:`exact_match`). temper implements them
natively: ``gem-llm`` pins ``math-verify[antlr4_13_2]``, which would replace the
``antlr4-python3-runtime`` 4.9 that omegaconf needs, and pulls ``reasoning-gym`` with
its own dependency tree.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from dataclasses import dataclass

from temper.rewards.functions.math_boxed import last_boxed

__all__ = [
    "TERMINAL",
    "GameReward",
    "exact_match",
    "last_boxed_answer",
    "last_tagged_answer",
    "normalize_answer",
]

#: the observation after a single-turn task ends (GEM's terminal state text)
TERMINAL = "<｜TERMINAL_STATE｜>"
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


@dataclass(frozen=True)
class GameReward:
    """GEM's language-game rewards (one set for every game)."""

    success: float = 1.0  # the task is solved
    internal_step: float = 0.0  # a step that does not end the game (a hint)
    fail: float = 0.0  # the game is lost
    invalid_action: float = 0.0  # a well-formed but illegal move (out of range, repeated)
    format_error: float = -0.1  # no move could be read from the answer


GAME_REWARD = GameReward()


def last_boxed_answer(text: str) -> str | None:
    """The content of the answer's last ``\\boxed{…}``, or None."""
    return last_boxed(text)


def last_tagged_answer(text: str) -> str | None:
    """The content of the answer's last ``<answer>…</answer>`` (stripped), or None."""
    found = _ANSWER.findall(text)
    return found[-1].strip() if found else None


def normalize_answer(text: str) -> str:
    """SQuAD's normalization: lower case, punctuation removed, the articles a/an/the
    removed, whitespace collapsed: ``"The  Eiffel-Tower!"`` → ``"eiffeltower"``."""
    lowered = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", lowered).split())


def exact_match(prediction: str, golds: str | Sequence[str]) -> bool:
    """Whether ``prediction`` equals one of ``golds`` after :func:`normalize_answer`."""
    answers = [golds] if isinstance(golds, str) else list(golds)
    pred = normalize_answer(prediction)
    return any(normalize_answer(str(g)) == pred for g in answers)
