"""reasoning-gym's letter counting through GEM (``env_type: rg:letter_counting``).

GEM's ``rg:<task>`` envs are single-turn: the reset shows one question of a
reasoning-gym dataset, the answer's last ``\\boxed{…}`` is scored by the dataset's
``score_answer``, and the episode ends. For letter counting (reasoning-gym's task):

- an item is a span of ``min_words``..``max_words`` consecutive words of a text, a
  letter drawn from the letters of the span, and the question
  ``How many times does the letter "x" appear in the text: "…"?``; the answer is the
  case-insensitive count;
- item ``i`` of a dataset is drawn from ``seed + i`` (``env_config.seed``, ``size``
  items); the episode's reset seed picks the item, so a group shares it;
- the score of an answer ``a`` for the truth ``t``: 1 when ``a == t``,
  ``len(t) / len(a)`` when ``t`` occurs in ``a``, else 0 (none boxed: 0).

The text here is temper's own word list (:data:`WORDS`), not reasoning-gym's novel, so
the questions differ from upstream's while the task, its answer and its score are the
same.
"""

from __future__ import annotations

import random
from typing import Any

from .base import TextEnv
from .gem_text import TERMINAL, last_boxed_answer
from .registry import register_env

__all__ = ["LetterCountingEnv", "letter_counting_item", "score_answer"]

_TEXT = (
    "the morning train left the station under a grey sky while children waved from "
    "the bridge and a baker carried warm bread across the market square where farmers "
    "sold apples pears and honey to travellers who had walked since dawn along the "
    "river path a small dog followed them barking at ducks that floated near the reeds "
    "and the old clock above the library struck seven as shops opened their shutters "
    "one by one the teacher unlocked the school gate and swept fallen leaves from the "
    "steps while a cyclist rang her bell passing the fountain in the middle of the "
    "garden where pigeons gathered around an elderly man reading his newspaper on a "
    "wooden bench near the museum entrance tourists studied maps and argued quietly "
    "about which street led to the harbour where fishing boats returned with nets full "
    "of silver fish and gulls circled above the masts calling loudly into the wind "
    "later that afternoon clouds gathered over the hills and rain began to fall on the "
    "rooftops so people hurried home with umbrellas and lanterns glowing in windows"
)
#: the text spans are drawn from (a fixed sequence of everyday words)
WORDS = tuple(_TEXT.split())


def letter_counting_item(
    index: int, seed: int, min_words: int = 5, max_words: int = 15
) -> dict[str, str]:
    """Item ``index`` of the dataset ``seed``: ``{"question", "answer", "letter"}``."""
    rng = random.Random(seed + index)
    length = min(rng.randint(min_words, max_words), len(WORDS))
    start = rng.randint(0, len(WORDS) - length)
    span = WORDS[start : start + length]
    letters = sorted(set("".join(span).lower())) or ["a"]
    letter = rng.choice(letters)
    count = sum(word.lower().count(letter) for word in span)
    text = " ".join(span)
    question = f'How many times does the letter "{letter}" appear in the text: "{text}"?'
    return {"question": question, "answer": str(count), "letter": letter}


def score_answer(answer: str | None, truth: str) -> float:
    """reasoning-gym's default score: 1 for ``answer == truth``,
    ``len(truth) / len(answer)`` when ``truth`` occurs inside ``answer``, else 0."""
    if not answer:
        return 0.0
    if answer == truth:
        return 1.0
    return len(truth) / len(answer) if truth in answer else 0.0


@register_env("rg:letter_counting")
class LetterCountingEnv(TextEnv):
    """Count a letter in a span of words (rules in the module docstring)."""

    whole_response = True

    def __init__(
        self, *, size: int = 500, seed: int = 42, min_words: int = 5, max_words: int = 15
    ) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        if not 0 < min_words <= max_words:
            raise ValueError("need 0 < min_words <= max_words")
        self.size, self.seed = int(size), int(seed)
        self.min_words, self.max_words = int(min_words), int(max_words)
        self.item: dict[str, str] = {}
        self.last = ""

    @property
    def action_space_text(self) -> str:
        return ""

    @property
    def instructions(self) -> str:
        return ""

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        index = random.Random(int(seed)).randrange(self.size)
        self.item = letter_counting_item(index, self.seed, self.min_words, self.max_words)
        self.last = self.item["question"]
        return self.last, {"index": index}

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        answer = last_boxed_answer(action_text)
        reward = score_answer(answer, self.item["answer"])
        self.last = TERMINAL
        info = {"action_is_valid": answer is not None, "success": reward >= 1.0}
        return TERMINAL, reward, True, True, info

    def render(self, mode: str = "text") -> str:
        if mode != "text":
            raise ValueError("letter counting renders text only")
        return self.last
