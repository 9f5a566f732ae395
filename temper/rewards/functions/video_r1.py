"""Video-R1 reward: ROLL's ``VideoR1RewardWorker`` (after Video-R1's ``grpo.py``).

``score = accuracy + format``:

- ``format``: 1 when the whole response is ``<think>…</think>`` then ``<answer>…</answer>``
  (whitespace between), else 0;
- ``accuracy`` compares the ``<answer>`` contents of response and ground truth (the whole
  text where there is no such tag), by the row's problem type:

  ==================  ======================================================
  multiple choice     1 when the first letters agree (a ``\\boxed{}`` unwrapped)
  numerical           1 when both parse as numbers equal to 2 decimals and
                      agree on having a decimal point or comma
  OCR                 ``1 - WER`` (word error rate), clipped to [0, 1]
  free-form           mean F-measure of ROUGE-1, -2 and -L (stemmed)
  regression          ``1 - |out - gt| / |gt|``, clipped to [0, 1]
  other               0
  ==================  ======================================================

The problem type comes from ``extra_info["problem_type"]``, else from the row's
``reward_model`` column where it is a string (ROLL's Video-R1 rows put it there; its
dialect adds that column to ``data.extra_info_columns``).
"""

from __future__ import annotations

import re
from typing import Any

_ANSWER = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL)
_BOXED = re.compile(r"\\boxed{(.*?)}")
_FORMAT = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)

#: Problem types with an accuracy rule (module doc).
PROBLEM_TYPES = ("multiple choice", "numerical", "OCR", "free-form", "regression")


def answer_of(text: str) -> str:
    """The stripped ``<answer>`` contents of ``text``, or ``text`` without one."""
    match = _ANSWER.search(text)
    return match.group(1).strip() if match else text


def unboxed(text: str) -> str:
    """The last ``\\boxed{…}`` contents of ``text``, or ``text`` without one."""
    found = _BOXED.findall(text)
    return found[-1] if found else text


def number(text: str) -> float | None:
    """``text`` as a number (thousands commas dropped), or None."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word-level edit distance over the reference's word count (at least 1)."""
    ref, hyp = reference.split(), hypothesis.split()
    row = list(range(len(hyp) + 1))
    for i, word in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, other in enumerate(hyp, 1):
            prev, row[j] = row[j], prev if word == other else 1 + min(prev, row[j], row[j - 1])
    return row[-1] / max(1, len(ref))


def rouge_mean(reference: str, hypothesis: str) -> float:
    """Mean F-measure of ROUGE-1, ROUGE-2 and ROUGE-L with stemming (``rouge-score``)."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)
    scores = scorer.score(reference, hypothesis)
    return sum(s.fmeasure for s in scores.values()) / 3


def accuracy(response: str, truth: str, problem_type: str) -> float:
    """The accuracy term of one response (module doc)."""
    out, gt = answer_of(response), answer_of(truth)
    if problem_type == "multiple choice":
        return float(unboxed(out).strip().strip(".")[:1] == unboxed(gt).strip().strip(".")[:1])
    if problem_type == "free-form":
        return max(0.0, min(1.0, rouge_mean(gt, out)))
    if problem_type == "OCR":
        return max(0.0, min(1.0, 1 - word_error_rate(gt, out)))
    if problem_type == "numerical":
        if any(c in gt for c in ".,") != any(c in out for c in ".,"):
            return 0.0
        a, b = number(gt), number(out)
        return float(a is not None and b is not None and round(a, 2) == round(b, 2))
    if problem_type == "regression":
        a, b = number(gt), number(out)
        if a is None or b is None:
            return 0.0
        relative = (abs(b - a) + 1e-9) / (abs(a) + 1e-9)
        return 1 - min(1.0, max(0.0, relative))
    return 0.0


def problem_type_of(extra_info: Any) -> str:
    """The row's problem type (module doc); empty when it names none."""
    info = extra_info if isinstance(extra_info, dict) else {}
    value = info.get("problem_type")
    if value is None and isinstance(info.get("reward_model"), str):
        value = info["reward_model"]
    return str(value or "")


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """``{"score", "acc_reward", "fmt_reward"}`` of one response (module doc)."""
    acc = accuracy(solution_str, str(ground_truth), problem_type_of(extra_info))
    fmt = float(_FORMAT.fullmatch(solution_str) is not None)
    return {"score": acc + fmt, "acc_reward": acc, "fmt_reward": fmt}
