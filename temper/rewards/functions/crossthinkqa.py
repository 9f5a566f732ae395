"""CrossThinkQA reward (ROLL ``CrossThinkQARuleRewardWorker``): multiple-choice answers.

The ground truth is an option letter (``"B"``, ``"(B)"``, ``"B. Paris"``: its first
standalone capital letter). The response is read after its last ``</think>``:

1. **answer**: the last ``\\boxed{…}`` (the *format* is then correct); else the text
   after the last ``answer is`` or ``answer:`` (any case); else none.
2. **letter**: the first standalone capital letter of that answer (``\\boxed{C}``,
   ``answer is (C)``, ``Answer: C. 42`` all give ``C``).

``reward_type`` (ROLL's key) turns (correct, format) into the base reward:

=========  ==================  ===================  ====================  =========
type       correct + boxed     correct, not boxed   wrong + boxed         otherwise
=========  ==================  ===================  ====================  =========
loose      1.0                 1.0                  -1.0                  -1.0
soft       1.0                 0.5                  -0.5                  -1.0
strict     1.0                 -1.0                 -1.0                  -1.0
=========  ==================  ===================  ====================  =========

``score = base + repetition + response_length_penalty_coef · length`` where, as in ROLL,
``repetition = -0.5 · (1 - distinct 3-grams / 3-grams)`` over the lower-cased words of
the whole response (0 under 3 words) and ``length`` is ROLL's ramp ``-0.5`` below 100,
``-0.5·(400 - n)/300`` from 100 to 400, ``0`` above 400. ``acc`` is ROLL's ``scores``:
1 when the base reward is positive.

Where this differs from ROLL, deliberately:

- ROLL takes the first capital letter of the answer, standalone or not, and with no
  ``\\boxed`` and no ``answer is`` it reads the *whole response*; so ``"Answer: B"`` is
  read as ``A`` and any reply starting with ``"A…"`` counts as answer A. Here the letter
  must stand alone, ``answer:`` is an answer phrase too, and no answer means wrong.
- ROLL's ``n`` for the length ramp is the width of the padded response tensor (the
  same for every sample of a batch, and above 400 for any ``response_length`` over 400,
  so the term is then 0); here ``n`` is the response's number of words.
"""

from __future__ import annotations

import re
from typing import Any

from temper.rewards.functions.math_boxed import last_boxed

REWARD_TYPES = ("loose", "soft", "strict")
# (correct, boxed) -> base reward, per reward_type (ROLL crossthinkqa_reward_fn)
_TABLE = {
    "loose": {(True, True): 1.0, (True, False): 1.0, (False, True): -1.0, (False, False): -1.0},
    "soft": {(True, True): 1.0, (True, False): 0.5, (False, True): -0.5, (False, False): -1.0},
    "strict": {(True, True): 1.0, (True, False): -1.0, (False, True): -1.0, (False, False): -1.0},
}
_LETTER = re.compile(r"(?<![A-Za-z])([A-Z])(?![A-Za-z])")
_PHRASE = re.compile(r"answer\s*(?:is\b|:)", re.IGNORECASE)
END_THINK = "</think>"


def option_letter(text: str) -> str | None:
    """The first capital letter that stands alone in ``text`` (not inside a word)."""
    found = _LETTER.search(text)
    return found.group(1) if found else None


def extract_answer(response: str) -> tuple[str | None, bool]:
    """``(answer text or None, boxed)`` of a response (see the module doc)."""
    cut = response.rfind(END_THINK)
    text = response[cut + len(END_THINK) :].lstrip("\n") if cut >= 0 else response
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed, True
    phrases = list(_PHRASE.finditer(text))
    if phrases:
        return text[phrases[-1].end() :], False
    return None, False


def repetition_penalty(text: str, ngram: int = 3, max_penalty: float = -0.5) -> float:
    """``max_penalty · (1 - distinct n-grams / n-grams)`` over lower-cased words."""
    words = text.lower().split()
    if len(words) < ngram:
        return 0.0
    grams = list(zip(*[words[i:] for i in range(ngram)]))
    return (1.0 - len(set(grams)) / len(grams)) * max_penalty


def length_reward(n: int, min_len: int = 100, max_len: int = 400) -> float:
    """ROLL's ramp: -0.5 below ``min_len``, rising linearly to 0 at ``max_len``."""
    if n < min_len:
        return -0.5
    if n > max_len:
        return 0.0
    return -0.5 * (max_len - n) / (max_len - min_len)


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    reward_type: str = "soft",
    response_length_penalty_coef: float = 0.0,
    **kwargs: Any,
) -> dict[str, Any]:
    """``{"score", "acc", "format_ok", "pred", "repetition_penalty"}`` for one response."""
    if reward_type not in _TABLE:
        raise ValueError(
            f"reward_type must be one of {', '.join(REWARD_TYPES)}, got {reward_type!r}"
        )
    truth = str(ground_truth).strip()
    target = option_letter(truth) or truth[:1].upper()
    answer, boxed = extract_answer(solution_str)
    pred = option_letter(answer) if answer is not None else None
    correct = pred is not None and pred == target
    base = _TABLE[reward_type][(correct, boxed)]
    repetition = repetition_penalty(solution_str)
    length = length_reward(len(solution_str.split()))
    return {
        "score": base + repetition + float(response_length_penalty_coef) * length,
        "acc": float(base > 0),
        "format_ok": boxed,
        "pred": pred or "",
        "repetition_penalty": repetition,
    }
