"""Rule reward functions on hand-made cases (called in process)."""

from __future__ import annotations

import json

import pytest

from temper.config.errors import ConfigError
from temper.rewards.functions import arithmetic, auto, countdown, format_regex, gsm8k, math_boxed
from temper.rewards.registry import get_reward_function, reward_function_names


def score(result: float | dict) -> float:
    return result["score"] if isinstance(result, dict) else float(result)


# ------------------------------------------------------------------ gsm8k


@pytest.mark.parametrize(
    ("response", "truth", "method", "expected"),
    [
        ("So she has 72 apples.\n#### 72", "72", "strict", 1.0),
        ("#### $1,200", "1200", "strict", 1.0),
        ("#### 1,200.00", "1200", "strict", 1.0),
        ("#### 5 then #### 7", "7", "strict", 1.0),
        ("The answer is 72", "72", "strict", 0.0),  # strict needs ####
        ("The answer is 72.", "72", "flexible", 1.0),
        ("I think 3, no wait, -4", "-4", "flexible", 1.0),
        ("#### 71", "72", "strict", 0.0),
        ("#### 71", "Natalia sold 48/2 = 24 clips.\n#### 71", "strict", 1.0),  # full solution
    ],
)
def test_gsm8k(response: str, truth: str, method: str, expected: float) -> None:
    assert score(gsm8k.compute_score("openai/gsm8k", response, truth, method=method)) == expected


def test_gsm8k_format_score_only_when_a_number_was_found() -> None:
    wrong = gsm8k.compute_score("openai/gsm8k", "#### 3", "4", format_score=0.1)
    assert wrong["score"] == 0.1 and wrong["format_ok"] is True
    missing = gsm8k.compute_score("openai/gsm8k", "no idea", "4", format_score=0.1)
    assert missing["score"] == 0.0 and missing["format_ok"] is False


# ------------------------------------------------------------------ math


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("so the answer is \\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("hence $\\boxed{\\dfrac{1}{2}}$", "0.5", 1.0),
        ("\\boxed{\\frac{\\sqrt{4}}{4}}", "\\frac{1}{2}", 1.0),  # nested braces
        ("first \\boxed{7}, finally \\boxed{x^2+1}", "1+x^2", 1.0),  # last box wins
        ("\\boxed{3}", "\\frac{1}{2}", 0.0),
        ("the answer is 0.5", "\\frac{1}{2}", 0.0),  # nothing boxed
        ("\\boxed{\\frac{1}{2}", "\\frac{1}{2}", 0.0),  # unclosed
        ("\\boxed{12}", "$\\boxed{12}$", 1.0),  # boxed ground truth
    ],
)
def test_math(response: str, truth: str, expected: float) -> None:
    assert score(math_boxed.compute_score("lighteval/MATH", response, truth)) == expected


def test_last_boxed_handles_nesting() -> None:
    assert math_boxed.last_boxed("\\boxed{a{b{c}}d} x") == "a{b{c}}d"
    assert math_boxed.last_boxed("\\fbox{4}") == "4"
    assert math_boxed.last_boxed("nothing") is None


# ------------------------------------------------------------------ arithmetic


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("3+9 = 12\n#### 12", "12", 1.0),
        ("the result is 12", 12, 1.0),
        ("#### 13", "12", 0.0),
        ("#### -5", "-5", 1.0),
        ("no digits", "12", 0.0),
    ],
)
def test_arithmetic(response: str, truth: object, expected: float) -> None:
    assert score(arithmetic.compute_score("arithmetic", response, truth)) == expected


# ------------------------------------------------------------------ countdown

GT = {"target": 24, "numbers": [3, 5, 3]}


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("<think>…</think><answer>(3 + 5) * 3</answer>", 1.0),
        ("<answer>(3+5)*3 = 24</answer>", 1.0),
        ("let me see\n(5 + 3) * 3", 1.0),  # last equation line, no tags
        ("<answer>3 * 5 + 3</answer>", 0.1),  # well formed, wrong value
        ("<answer>(3 + 5) * 3 * 1</answer>", 0.1),  # extra number
        ("<answer>(5 + 5) * 3 - 6</answer>", 0.1),  # reused number / not given
        ("<answer>(3 + 5) * 3 / 0</answer>", 0.1),  # division by zero
        ("<answer>__import__('os').system('echo hi')</answer>", 0.0),  # malicious
        ("<answer>(3).__class__</answer>", 0.0),
        ("<answer>3 ** 5</answer>", 0.0),  # power not allowed
        ("<answer>3.0 * 8</answer>", 0.0),  # float literal
        ("I give up", 0.0),
    ],
)
def test_countdown(response: str, expected: float) -> None:
    got = countdown.compute_score("countdown", response, json.dumps(GT))
    assert score(got) == pytest.approx(expected)
    assert score(countdown.compute_score("countdown", response, GT)) == pytest.approx(expected)


def test_countdown_exact_fractions_and_format_score() -> None:
    gt = {"target": 3, "numbers": [7, 3, 7]}
    assert score(countdown.compute_score("countdown", "<answer>7 / 7 * 3</answer>", gt)) == 1.0
    wrong = countdown.compute_score(
        "countdown", "<answer>7 - 7 + 3 + 1</answer>", gt, format_score=0.2
    )
    assert score(wrong) == 0.2


# ------------------------------------------------------------------ format


def test_format() -> None:
    good = "<think>hmm</think>\n<answer>4</answer>"
    assert score(format_regex.compute_score("x", good)) == 1.0
    assert score(format_regex.compute_score("x", "<answer>4</answer>")) == 0.0
    assert score(format_regex.compute_score("x", "so: 4", pattern=r"\d", full=False)) == 1.0
    assert score(format_regex.compute_score("x", "no", match_score=2.0, miss_score=-1.0)) == -1.0


# ------------------------------------------------------------------ auto + registry


def test_auto_picks_by_data_source() -> None:
    assert score(auto.compute_score("openai/gsm8k", "#### 4", "4")) == 1.0
    assert score(auto.compute_score("DigitalLearningGmbH/MATH-lighteval", "\\boxed{4}", "4")) == 1.0
    assert score(auto.compute_score("math_algebra", "\\boxed{4}", "4")) == 1.0
    assert score(auto.compute_score("arithmetic", "#### 4", "4")) == 1.0
    assert (
        score(
            auto.compute_score(
                "countdown", "<answer>2+2</answer>", GT | {"target": 4, "numbers": [2, 2]}
            )
        )
        == 1.0
    )
    with pytest.raises(auto.UnknownDataSourceError, match="openai/gsm8k"):
        auto.compute_score("my/dataset", "x", "y")


def test_registry_names_and_did_you_mean() -> None:
    assert reward_function_names() == [
        "arithmetic",
        "auto",
        "code",
        "countdown",
        "crossthinkqa",
        "custom",
        "detection",
        "format",
        "geo3k",
        "gsm8k",
        "ifeval",
        "llm_judge",
        "math",
        "video_r1",
        "visual_color",
    ]
    with pytest.raises(
        ConfigError,
        match=r"reward.function: unknown value 'gsm8' \(did you mean 'gsm8k'\?\).*custom, detection, format",
    ):
        get_reward_function("gsm8")
