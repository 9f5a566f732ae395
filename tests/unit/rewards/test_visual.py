"""Rewards of image tasks: temper's visual_color and verl's geometry3k (geo3k)."""

from __future__ import annotations

import pytest

from temper.rewards.functions.auto import compute_score as auto
from temper.rewards.functions.visual import geo3k_score, visual_color_score


@pytest.mark.parametrize(
    ("response", "score"),
    [
        ("red", 1.0),
        ("Red.", 1.0),
        (" \nred<|im_end|>", 1.0),
        ("red square", 1.0),
        ("\x0cred", 0.0),  # junk before the word is no answer
        ("reddish", 0.0),
        ("blue", 0.0),
        ("", 0.0),
    ],
)
def test_visual_color_scores_the_opening_word(response, score):
    assert visual_color_score("visual_color", response, "red") == score


def test_geo3k_is_verls_accuracy_plus_format_rule():
    assert geo3k_score("", "<think>2x=6</think> so \\boxed{3}", "3") == pytest.approx(1.0)
    assert geo3k_score("", "x is \\boxed{3}", "3") == pytest.approx(0.9)  # no <think>
    assert geo3k_score("", "<think>?</think> \\boxed{4}", "3") == pytest.approx(0.1)
    assert geo3k_score("", "3", "3") == 0.0


def test_auto_routes_the_image_data_sources():
    assert auto("visual_color", "blue", "blue") == 1.0
    assert auto("hiyouga/geometry3k", "<think>a</think>\\boxed{\\frac{1}{2}}", "0.5") == 1.0
