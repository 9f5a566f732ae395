"""Video-R1 reward (ROLL's VideoR1RewardWorker): accuracy by problem type plus the
think/answer format, against hand-computed values; ROLL's reward section maps to it."""

from __future__ import annotations

import pytest

from temper.rewards.functions.video_r1 import compute_score, word_error_rate

THINK = "<think>let me see</think> "


def score(response: str, truth: str, problem_type: str) -> dict:
    return compute_score("video", response, truth, {"problem_type": problem_type})


def test_multiple_choice_compares_first_letters_and_format_adds_one():
    assert score(f"{THINK}<answer>B. a dog</answer>", "<answer>B</answer>", "multiple choice") == {
        "score": 2.0,
        "acc_reward": 1.0,
        "fmt_reward": 1.0,
    }
    # no think block: right answer, no format point; a \boxed{} answer is unwrapped
    assert score("<answer>\\boxed{C}</answer>", "<answer>C</answer>", "multiple choice")[
        "score"
    ] == pytest.approx(1.0)
    assert score(f"{THINK}<answer>A</answer>", "<answer>C</answer>", "multiple choice")[
        "score"
    ] == pytest.approx(1.0)  # format only


def test_numerical_needs_the_same_decimal_style_and_two_decimals():
    assert (
        score("<answer>3.14159</answer>", "<answer>3.14</answer>", "numerical")["acc_reward"] == 1
    )
    assert score("<answer>3</answer>", "<answer>3.0</answer>", "numerical")["acc_reward"] == 0
    assert (
        score("<answer>1,000</answer>", "<answer>1000.0</answer>", "numerical")["acc_reward"] == 1
    )
    assert score("<answer>many</answer>", "<answer>4</answer>", "numerical")["acc_reward"] == 0


def test_ocr_is_one_minus_word_error_rate():
    # "the quick brown fox" vs "the quack brown": 1 substitution + 1 deletion = 2 / 4
    assert word_error_rate("the quick brown fox", "the quack brown") == 0.5
    got = score("<answer>the quack brown</answer>", "<answer>the quick brown fox</answer>", "OCR")
    assert got["acc_reward"] == 0.5
    assert score("<answer>a b c d e f</answer>", "<answer>x</answer>", "OCR")["acc_reward"] == 0


def test_regression_is_one_minus_relative_error():
    got = score("<answer>90</answer>", "<answer>100</answer>", "regression")
    assert got["acc_reward"] == pytest.approx(0.9)
    assert score("<answer>300</answer>", "<answer>100</answer>", "regression")["acc_reward"] == 0


def test_free_form_is_the_mean_rouge_f_measure():
    pytest.importorskip("rouge_score")
    # 6 words each. ROUGE-1: cat, sat, on, mat shared -> F 4/6; ROUGE-2: "cat sat" and
    # "sat on" of 5 bigrams each -> 2/5; ROUGE-L: LCS "cat sat on mat" -> 4/6
    got = score(
        "<answer>a cat sat on a mat</answer>",
        "<answer>the cat sat on the mat</answer>",
        "free-form",
    )
    assert got["acc_reward"] == pytest.approx((4 / 6 + 2 / 5 + 4 / 6) / 3)


def test_problem_type_from_rolls_reward_model_column_and_unknown_types():
    roll_row = {"reward_model": "multiple choice"}
    got = compute_score("video", "<answer>A</answer>", "<answer>A</answer>", roll_row)
    assert got["acc_reward"] == 1
    assert compute_score("video", "<answer>A</answer>", "<answer>A</answer>", {})["score"] == 0


def test_rolls_video_r1_worker_routes_to_it():
    from temper.config.dialects.roll.transforms import REWARD_WORKERS
    from temper.rewards.registry import get_reward_function

    assert REWARD_WORKERS["VideoR1RewardWorker"] == "video_r1"
    assert get_reward_function("video_r1") is compute_score
