"""ROLL's GEM dataset envs: a question from a dataset, one answer, a check
(``env_type: roll_math`` and ``roll_qa``).

Both are single-turn (GEM's contextual bandits): the reset shows the row's
``question_key`` column, the model's whole answer is read by the env
(:attr:`TextEnv.whole_response`), and the episode ends with reward 1 for a correct
answer and 0 otherwise; an answer with nothing to extract is 0 and counted invalid.

- ``roll_math`` (ROLL's ``MathEnv``): the answer's last ``\\boxed{…}`` against the row's
  ``answer_key`` (a string, number, or list of accepted answers) with math-verify
  (:func:`temper.rewards.functions.math_boxed.answers_equal`);
- ``roll_qa`` (ROLL's ``QaEnv``): the last ``<answer>…</answer>`` (the last
  ``\\boxed{…}`` with ``extract_boxed``) by exact match after SQuAD normalization; the
  question is shown inside GEM's QA prompt (think, then answer in tags).

``dataset_name`` is a local file (parquet, jsonl, json, csv) or directory
(:mod:`temper.data.sources`); with ``split`` a directory's ``<split>`` entry is read when
it exists (a saved ``DatasetDict``). ROLL passes hub ids (``open-r1/DAPO-Math-17k-Processed``,
``axon-rl/HotpotQA``), which this machine cannot download: :meth:`problem` says so at
``temper check``. The reset seed picks the row, so a group shares its question (ROLL
samples by seed in training, too). Rows load on the first reset, once per process.
"""

from __future__ import annotations

import abc
import functools
import random
from pathlib import Path
from typing import Any

from temper.data.errors import DataError
from temper.data.sources import read_rows
from temper.rewards.functions.math_boxed import answers_equal

from .base import TextEnv
from .gem_text import TERMINAL, exact_match, last_boxed_answer, last_tagged_answer
from .registry import register_env

__all__ = ["MathEnv", "QaEnv"]

_QA_PROMPT = (
    "For any question, always reason through your thought process using:\n"
    "<think> your reasoning here </think>\n"
    "Then, provide your final answer using:\n"
    "<answer> your answer here </answer>\n\n"
    "Question: {question}\n"
)


def _source(dataset_name: str, split: str | None) -> Path:
    path = Path(dataset_name).expanduser()
    if split and path.is_dir() and (path / split).exists():
        return path / split
    return path


@functools.cache
def _load(dataset_name: str, split: str | None, question_key: str, answer_key: str) -> tuple:
    """The rows' (question, answer) pairs, read once per process."""
    key = "env_config.dataset_name"
    rows = []
    for src in read_rows(str(_source(dataset_name, split)), key):
        if src.row is None or question_key not in src.row or answer_key not in src.row:
            continue  # a broken row, or one without the columns: not a question
        rows.append((str(src.row[question_key]), src.row[answer_key]))
    if not rows:
        raise DataError(
            key,
            f"{dataset_name} has no row with the columns {question_key!r} and {answer_key!r}",
            "set env_config.question_key / answer_key to the dataset's columns",
        )
    return tuple(rows)


class _DatasetEnv(TextEnv):
    """A dataset question per episode (module docstring); subclasses check the answer."""

    whole_response = True

    def __init__(
        self,
        *,
        dataset_name: str = "",
        split: str | None = None,
        question_key: str = "problem",
        answer_key: str = "answer",
        seed: int = 0,
        max_steps: int | None = None,
    ) -> None:
        # seed: GEM shuffles its dataset with it; here the reset seed picks the row.
        # max_steps: ROLL's MathEnv swallows it (**_); the tag's max_steps bounds turns.
        if not dataset_name:
            raise ValueError("env_config.dataset_name is required (a local data file)")
        self.dataset_name, self.split = str(dataset_name), split
        self.question_key, self.answer_key = question_key, answer_key
        self.question: str = ""
        self.answer: Any = None
        self.last = ""

    @property
    def action_space_text(self) -> str:
        return ""

    @property
    def instructions(self) -> str:
        return ""

    def problem(self) -> str | None:
        path = _source(self.dataset_name, self.split)
        if not path.exists():
            return (
                f"{self.dataset_name} is not a local file or directory (a hub dataset id "
                "cannot be downloaded here)"
            )
        return None

    def _rows(self) -> tuple:
        return _load(self.dataset_name, self.split, self.question_key, self.answer_key)

    def _show(self, question: str) -> str:
        return question

    def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        rows = self._rows()
        index = random.Random(int(seed)).randrange(len(rows))
        self.question, self.answer = rows[index]
        self.last = self._show(self.question)
        return self.last, {"index": index}

    @abc.abstractmethod
    def _extract(self, text: str) -> str | None:
        """The answer the reply gives, or None when it gives none in the env's format."""

    @abc.abstractmethod
    def _correct(self, answer: str) -> bool:
        """Whether ``answer`` is the row's."""

    def step(self, action_text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        answer = self._extract(action_text)
        correct = answer is not None and self._correct(answer)
        self.last = TERMINAL
        info = {"action_is_valid": answer is not None, "success": correct}
        return TERMINAL, 1.0 if correct else 0.0, True, True, info

    def render(self, mode: str = "text") -> str:
        if mode != "text":
            raise ValueError(f"{self.env_type} renders text only")
        return self.last


def _golds(answer: Any) -> list[str]:
    return [str(a) for a in answer] if isinstance(answer, list | tuple) else [str(answer)]


@register_env("roll_math")
class MathEnv(_DatasetEnv):
    """A math question; the last ``\\boxed{}`` checked with math-verify."""

    def _extract(self, text: str) -> str | None:
        return last_boxed_answer(text)

    def _correct(self, answer: str) -> bool:
        for gold in _golds(self.answer):
            try:
                if answers_equal(answer, gold):
                    return True
            except Exception:  # math-verify gave up on this pair: not a match (GEM's too)
                continue
        return False


@register_env("roll_qa")
class QaEnv(_DatasetEnv):
    """A question answered in ``<answer>`` tags (or boxed), by exact match."""

    def __init__(
        self,
        *,
        dataset_name: str = "",
        split: str | None = None,
        question_key: str = "question",
        answer_key: str = "answer",
        seed: int = 0,
        max_steps: int | None = None,
        extract_boxed: bool = False,
        load_from_cache_file: bool = True,
    ) -> None:
        # load_from_cache_file: GEM's datasets.map cache switch; nothing is cached here
        super().__init__(
            dataset_name=dataset_name,
            split=split,
            question_key=question_key,
            answer_key=answer_key,
            seed=seed,
            max_steps=max_steps,
        )
        self.extract_boxed = bool(extract_boxed)

    def _show(self, question: str) -> str:
        return _QA_PROMPT.format(question=question)

    def _extract(self, text: str) -> str | None:
        return last_boxed_answer(text) if self.extract_boxed else last_tagged_answer(text)

    def _correct(self, answer: str) -> bool:
        return exact_match(answer, _golds(self.answer))
