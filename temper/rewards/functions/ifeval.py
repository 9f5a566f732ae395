"""``ifeval``: instruction-following checks (IFEval), run by the ``if-verifiable`` package.

The 25 IFEval checks are Google's, as packaged by ``if-verifiable``
(``if_verifiable.ifeval.instructions_registry``); this module only finds a row's
instructions and aggregates their verdicts. Two row formats:

- **IFEval / verl** — ``instruction_id_list`` (``"keywords:existence"``, …) and
  ``kwargs`` (one dict per instruction), in ``ground_truth`` (a dict or its JSON string)
  or in ``extra_info``; ``extra_info.prompt`` (if any) serves ``combination:repeat_prompt``.
  ``score_mode``: ``fraction`` (default: the share of instructions followed) or ``all``
  (1 only when every one is). ``loose: true`` uses IFEval's loose variant (a response
  also passes with its first/last line or ``*`` markup removed).
- **ROLL** ``GeneralRuleRewardWorker`` — ``ground_truth`` is ``{"func_name": ...,
  args}`` (open-instruct's IFEval-like functions). Each ``func_name`` is translated to
  the IFEval check(s) with the same meaning: an exact count N becomes "at least N" and
  "less than N+1"; "around N" becomes the range ROLL accepts (±10% for words, ±1 for
  sentences, exactly N for capital words); ``validate_choice`` (no IFEval counterpart)
  is checked here: the response must appear in one of the options. The row scores 1
  when all of them pass, plus ROLL's repetition penalty (``-0.5 · (1 - distinct
  3-grams / 3-grams)``), as ROLL scores it.

The response is read after its last ``</think>``. Unknown instruction ids or
``func_name`` values raise (the sample's failure names them). Two checks,
``length_constraints:number_sentences`` and ``change_case:capital_word_frequency``,
tokenize with NLTK's ``punkt`` data, which must be downloaded once
(``python -m nltk.downloader punkt punkt_tab``); without it those samples are reward
failures whose reason says so.

Returns ``{"score", "acc" (all followed), "followed", "instructions"}``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from typing import Any

from temper.rewards.functions.crossthinkqa import repetition_penalty

SCORE_MODES = ("fraction", "all")
Check = tuple[str, dict[str, Any]]


@functools.cache
def registry() -> dict[str, Any]:
    """IFEval instruction id -> checker class (``if-verifiable``)."""
    from if_verifiable.ifeval import instructions_registry

    return dict(instructions_registry.INSTRUCTION_DICT)


def _count(
    check: str, count_key: str, relation_key: str, n: int, quantifier: str, tol: int
) -> list[Check]:
    """IFEval's relations are "at least" and "less than"; ROLL's quantifiers map onto them."""
    lo, hi = {"at least": (n, None), "at most": (None, n), "around": (n - tol, n + tol)}.get(
        quantifier, (n, n)
    )
    out: list[Check] = []
    if lo is not None:
        out.append((check, {count_key: lo, relation_key: "at least"}))
    if hi is not None:
        out.append((check, {count_key: hi + 1, relation_key: "less than"}))
    return out


def _around_words(n: int) -> int:
    return max(round(n * 0.1), 1)


# ROLL func_name -> the IFEval checks with the same meaning (see the module doc).
ROLL_FUNCTIONS: dict[str, Callable[..., list[Check]]] = {
    "verify_keywords": lambda keyword_list: [("keywords:existence", {"keywords": keyword_list})],
    "verify_keyword_frequency": lambda word, N: [
        ("keywords:frequency", {"keyword": word, **kw})
        for _, kw in _count("", "frequency", "relation", N, "exactly", 0)
    ],
    "validate_forbidden_words": lambda forbidden_words: [
        ("keywords:forbidden_words", {"forbidden_words": forbidden_words})
    ],
    "verify_letter_frequency": lambda letter, N: [
        ("keywords:letter_frequency", {"letter": letter, **kw})
        for _, kw in _count("", "let_frequency", "let_relation", N, "exactly", 0)
    ],
    "validate_response_language": lambda language: [
        ("language:response_language", {"language": language})
    ],
    "verify_paragraph_count": lambda N: [
        ("length_constraints:number_paragraphs", {"num_paragraphs": N})
    ],
    "validate_word_constraint": lambda N, quantifier: _count(
        "length_constraints:number_words", "num_words", "relation", N, quantifier, _around_words(N)
    ),
    "verify_sentence_constraint": lambda N, quantifier: _count(
        "length_constraints:number_sentences", "num_sentences", "relation", N, quantifier, 1
    ),
    "validate_paragraphs": lambda N, first_word, i: [
        (
            "length_constraints:nth_paragraph_first_word",
            {"num_paragraphs": N, "nth_paragraph": i, "first_word": first_word},
        )
    ],
    "verify_postscript": lambda postscript_marker: [
        ("detectable_content:postscript", {"postscript_marker": postscript_marker})
    ],
    "validate_placeholders": lambda N: [
        ("detectable_content:number_placeholders", {"num_placeholders": N})
    ],
    "verify_bullet_points": lambda N: [
        ("detectable_format:number_bullet_lists", {"num_bullets": N})
    ],
    "validate_title": lambda: [("detectable_format:title", {})],
    "validate_choice": lambda options: [("temper:choice", {"options": list(options)})],
    "validate_highlighted_sections": lambda N: [
        ("detectable_format:number_highlighted_sections", {"num_highlights": N})
    ],
    "validate_sections": lambda N, section_splitter: [
        (
            "detectable_format:multiple_sections",
            {"section_spliter": section_splitter, "num_sections": N},
        )
    ],
    "validate_json_format": lambda: [("detectable_format:json_format", {})],
    "validate_repeat_prompt": lambda original_prompt: [
        ("combination:repeat_prompt", {"prompt_to_repeat": original_prompt})
    ],
    "validate_two_responses": lambda: [("combination:two_responses", {})],
    "validate_uppercase": lambda: [("change_case:english_capital", {})],
    "validate_lowercase": lambda: [("change_case:english_lowercase", {})],
    "validate_frequency_capital_words": lambda N, quantifier: _count(
        "change_case:capital_word_frequency",
        "capital_frequency",
        "capital_relation",
        N,
        "exactly" if quantifier == "around" else quantifier,
        0,
    ),
    "validate_end": lambda end_phrase: [("startend:end_checker", {"end_phrase": end_phrase})],
    "validate_quotation": lambda: [("startend:quotation", {})],
    "validate_no_commas": lambda: [("punctuation:no_comma", {})],
}


def roll_checks(constraint: Mapping[str, Any]) -> list[Check]:
    """The IFEval checks of one ROLL ``{"func_name", ...}`` constraint."""
    import inspect

    name = constraint.get("func_name")
    if name not in ROLL_FUNCTIONS:
        known = ", ".join(sorted(ROLL_FUNCTIONS))
        raise ValueError(f"ifeval: unknown func_name {name!r} (known: {known})")
    fn = ROLL_FUNCTIONS[name]
    params = inspect.signature(fn).parameters
    missing = [p for p in params if p not in constraint]
    if missing:
        raise ValueError(f"ifeval: {name} needs {', '.join(missing)}")
    return fn(**{p: constraint[p] for p in params})


def _check_choice(response: str, options: list[str]) -> bool:
    """ROLL's validate_choice: the response is (part of) one of the options."""
    text = response.strip()
    return any(text in str(option) for option in options)


def follows(response: str, check: Check, prompt: str, loose: bool) -> bool:
    """Whether ``response`` passes one IFEval check."""
    from if_verifiable.common import get_loose_transformations

    instruction_id, kwargs = check
    if instruction_id == "temper:choice":
        return _check_choice(response, kwargs["options"])
    checker = registry()[instruction_id](instruction_id)
    checker.build_description(**{k: v for k, v in kwargs.items() if v is not None})
    args = checker.get_instruction_args()
    if args and "prompt" in args:
        checker.build_description(prompt=prompt)
    variants = get_loose_transformations(response) if loose else [response]
    try:
        return any(v.strip() and checker.check_following(v) for v in variants)
    except LookupError as err:  # NLTK data that was never downloaded
        raise RuntimeError(
            f"IFEval check {instruction_id} needs NLTK's punkt data: run "
            "python -m nltk.downloader punkt punkt_tab"
        ) from err


def _loads(value: Any) -> Any:
    if isinstance(value, (str, bytes)):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def checks_of(ground_truth: Any, extra_info: Mapping[str, Any]) -> tuple[list[Check], bool]:
    """``(checks, roll_format)`` of a row."""
    truth = _loads(ground_truth)
    if isinstance(truth, Mapping) and "func_name" in truth:
        return roll_checks(truth), True
    source = truth if isinstance(truth, Mapping) and "instruction_id_list" in truth else extra_info
    ids = _loads(source.get("instruction_id_list"))
    if not isinstance(ids, list) or not ids:
        raise ValueError(
            "ifeval: the row has no instructions: put instruction_id_list and kwargs in "
            "ground_truth or extra_info, or ROLL's {func_name, ...} in ground_truth"
        )
    kwargs = _loads(source.get("kwargs")) or [{} for _ in ids]
    if not isinstance(kwargs, list) or len(kwargs) != len(ids):
        raise ValueError(
            f"ifeval: {len(ids)} instruction ids but kwargs is not a list of {len(ids)}"
        )
    unknown = [i for i in ids if i not in registry()]
    if unknown:
        raise ValueError(f"ifeval: unknown instruction id(s) {', '.join(map(str, unknown))}")
    return [(str(i), dict(k or {})) for i, k in zip(ids, kwargs)], False


def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    score_mode: str = "fraction",
    loose: bool = False,
    **kwargs: Any,
) -> dict[str, Any]:
    """Score one response (see the module doc)."""
    if score_mode not in SCORE_MODES:
        raise ValueError(f"score_mode must be one of {', '.join(SCORE_MODES)}, got {score_mode!r}")
    extra = extra_info if isinstance(extra_info, Mapping) else {}
    checks, roll_format = checks_of(ground_truth, extra)
    response = solution_str.rsplit("</think>", 1)[-1].lstrip("\n")
    prompt = str(extra.get("prompt") or "")
    verdicts = [follows(response, c, prompt, loose) for c in checks]
    followed = sum(verdicts)
    every = float(followed == len(checks))
    if roll_format:
        score = every + repetition_penalty(solution_str)
    else:
        score = followed / len(checks) if score_mode == "fraction" else every
    return {"score": score, "acc": every, "followed": followed, "instructions": len(checks)}
