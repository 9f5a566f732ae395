"""DeepEyes' episode reward: an LLM judge's accuracy, the answer's format, a tool bonus.

When a DeepEyes episode ends, its last answer is scored (ROLL's
``DeepEyesEnv.obtain_outcome_reward``):

- the answer (:func:`extract_answer`): the text between the last ``<answer>`` and the
  ``</answer>`` after it, stripped (the whole reply when it has no ``<answer>``);
- a format error when ``<think>`` and ``</think>`` differ in count, or after the last
  ``</think>`` ``<answer>`` and ``</answer>`` do; an answer of 1000 characters or more
  is a format error scored 0 for accuracy (a long answer games the judge);
- accuracy ``acc`` ∈ {0, 1}: the judge's verdict (:func:`verdict_score`) on the prompt
  :func:`judge_messages` writes from the question, the ground truth and the answer;
- ``format = -1`` on a format error, else 0;
- ``tool = 1`` when the episode called tools (more than one step), every call ran, and
  ``acc > 0.5``; else 0;

``reward = acc_weight · acc + format_weight · format + tool_weight · tool``
(:func:`combine`; the file's weights are 0.8, 0.2, 1.2).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "LONG_ANSWER",
    "OutcomeReward",
    "combine",
    "extract_answer",
    "judge_messages",
    "verdict_score",
]

LONG_ANSWER = 1000  # characters: an answer this long is a format error, accuracy 0

_INSTRUCTION = (
    "You compare a model's answer to a question with the reference answer. The answer is "
    "right (Judgement: 1) when it means the same as the reference, even when it is "
    "shorter or worded differently ('red' answers 'The car is red.'); otherwise it is "
    "wrong (Judgement: 0). Reply with the digit only."
)
# (question, reference, answer, verdict): worked cases shown before the real one
_EXAMPLES: Sequence[tuple[str, str, str, int]] = (
    ("What colour is the mug on the table?", "The mug is green.", "green", 1),
    ("Which side of the road is the bus on?", "The bus is on the right.", "right side", 1),
    ("Is the dog sitting or standing?", "The dog is sitting.", "It is sitting down.", 1),
    ("Is the sign above the door?", "No, the sign is beside the door.", "no", 1),
    ("How many chairs are there?", "There are three chairs.", "4", 0),
    ("What is the man holding?", "The man is holding an umbrella.", "a phone", 0),
)


def _case(question: str, reference: str, answer: str) -> str:
    return f"[Question]: {question}\n[Standard Answer]: {reference}\n[Model_answer] : {answer}\n"


def judge_messages(question: str, reference: str, answer: str) -> list[dict[str, str]]:
    """The judge's conversation: a system line, then one user message with the
    instruction, the worked cases and the case to judge, ending in ``Judgement:``."""
    shown = "\n".join(_case(q, r, a) + f"Judgement: {v}\n" for q, r, a, v in _EXAMPLES)
    text = f"{_INSTRUCTION}\n\n{shown}\n{_case(question, reference, answer)}Judgement:"
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": text},
    ]


def verdict_score(verdict: str) -> float | None:
    """The judge's verdict as accuracy: after its last ``Judgement:``, 1.0 when a ``1``
    appears (before a ``0``: ROLL checks for ``1`` first), 0.0 when only ``0`` does;
    without ``Judgement:`` the whole (stripped) reply must be ``1`` or ``0``. None when
    unreadable (scored 0, counted as a judge format error)."""
    if "Judgement:" in verdict:
        tail = verdict.rsplit("Judgement:", 1)[1]
        if "1" in tail:
            return 1.0
        return 0.0 if "0" in tail else None
    text = verdict.strip()
    return 1.0 if text == "1" else 0.0 if text == "0" else None


def extract_answer(response: str) -> tuple[str, bool]:
    """``(answer, format_error)`` of a reply (module doc)."""
    error = response.count("<think>") != response.count("</think>")
    tail = response.split("</think>")[-1]
    error = error or tail.count("<answer>") != tail.count("</answer>")
    answer = response.split("<answer>")[-1].split("</answer>")[0].strip()
    return answer, error


@dataclass(frozen=True)
class OutcomeReward:
    """The parts of an episode's reward and their weighted sum."""

    reward: float
    acc: float
    format: float
    tool: float


def combine(
    acc: float,
    format_error: bool,
    *,
    answer_length: int,
    steps: int,
    tool_failed: bool,
    acc_weight: float,
    format_weight: float,
    tool_weight: float,
) -> OutcomeReward:
    """``acc_weight · acc + format_weight · format + tool_weight · tool`` (module doc);
    ``steps``: the episode's env steps (answers), ``tool_failed``: a tool call of it did
    not run."""
    if answer_length >= LONG_ANSWER:
        acc, format_error = 0.0, True
    fmt = -1.0 if format_error else 0.0
    tool = 1.0 if steps > 1 and acc > 0.5 and not tool_failed else 0.0
    total = acc_weight * acc + format_weight * fmt + tool_weight * tool
    return OutcomeReward(total, acc, fmt, tool)
