"""CrossThinkQA (ROLL's multiple-choice rule reward) on hand-made responses."""

from __future__ import annotations

import pytest

from temper.rewards.functions import crossthinkqa as ctq
from temper.rewards.registry import get_reward_function

# 20 distinct words: no repeated 3-gram, so the repetition penalty is 0 and score = base.
PAD = " ".join(f"w{i}" for i in range(20))


@pytest.mark.parametrize(
    ("response", "truth", "reward_type", "base", "pred", "boxed"),
    [
        # boxed letter: format ok; the table's first column / third column
        (f"{PAD} so \\boxed{{B}}", "B", "soft", 1.0, "B", True),
        (f"{PAD} so \\boxed{{C}}", "B", "soft", -0.5, "C", True),
        (f"{PAD} so \\boxed{{C}}", "B", "loose", -1.0, "C", True),
        # answer phrase without a box: correct 0.5 (soft), 1.0 (loose), -1.0 (strict)
        (f"{PAD} The answer is (B).", "B", "soft", 0.5, "B", False),
        (f"{PAD} The answer is (B).", "B", "loose", 1.0, "B", False),
        (f"{PAD} The answer is (B).", "B", "strict", -1.0, "B", False),
        # 'Answer: B' reads B (ROLL would read the 'A' of 'Answer')
        (f"{PAD} Answer: B", "B", "soft", 0.5, "B", False),
        # the last box wins; text before </think> is ignored
        (f"<think>maybe \\boxed{{A}}</think>\n{PAD} \\boxed{{D. 42}}", "D", "soft", 1.0, "D", True),
        # no answer at all: wrong (ROLL would take the first capital of the reply)
        (f"A {PAD}", "A", "soft", -1.0, "", False),
        # ground truth written as '(C)' or 'C. text'
        (f"{PAD} \\boxed{{C}}", "(C)", "soft", 1.0, "C", True),
        (f"{PAD} \\boxed{{C}}", "C. Paris", "strict", 1.0, "C", True),
        # a box without a standalone letter: format ok, answer wrong
        (f"{PAD} \\boxed{{Paris}}", "C", "soft", -0.5, "", True),
    ],
)
def test_base_reward_table(response, truth, reward_type, base, pred, boxed):
    out = ctq.compute_score("crossthinkqa", response, truth, reward_type=reward_type)
    assert out["repetition_penalty"] == 0.0
    assert out["score"] == base
    assert out["pred"] == pred and out["format_ok"] is boxed
    assert out["acc"] == float(base > 0)


def test_repetition_penalty_by_hand():
    # words: a b c a b c -> 3-grams abc bca cab abc: 4 grams, 3 distinct
    # penalty = -0.5 * (1 - 3/4) = -0.125
    assert ctq.repetition_penalty("a b c a b c") == pytest.approx(-0.125)
    assert ctq.repetition_penalty("a b") == 0.0
    out = ctq.compute_score("x", "a b c a b c \\boxed{A}", "A", reward_type="soft")
    # '\\boxed{A}' is a 7th word: grams abc bca cab abc bc\\boxed = 5, distinct 4 -> -0.1
    assert out["score"] == pytest.approx(1.0 - 0.5 * (1 - 4 / 5))


def test_length_term_uses_the_coefficient():
    # 21 words: n < 100 -> length reward -0.5; coef 0.2 -> -0.1 on top of the base 1.0
    out = ctq.compute_score(
        "x", f"{PAD} \\boxed{{A}}", "A", reward_type="soft", response_length_penalty_coef=0.2
    )
    assert out["score"] == pytest.approx(1.0 - 0.1)
    assert ctq.length_reward(250) == pytest.approx(-0.25)  # -0.5 * (400-250)/300
    assert ctq.length_reward(401) == 0.0


def test_unknown_reward_type_raises():
    with pytest.raises(ValueError, match="loose, soft, strict"):
        ctq.compute_score("x", "\\boxed{A}", "A", reward_type="fuzzy")


def test_registered():
    assert get_reward_function("crossthinkqa") is ctq.compute_score


def test_scorer_routes_a_roll_crossthinkqa_domain(tokenizer):
    """The route the ROLL dialect writes for rewards.crossthinkqa (tag, reward_type)."""
    from temper.config.schema import RewardConfig, RewardRoute
    from temper.rewards.manager import RewardScorer

    from .conftest import make_batch

    batch = make_batch(
        tokenizer,
        ["q1", "q2", "q3"],
        ["so \\boxed{B}", "The answer is (B).", "\\boxed{C}"],
        data_source=["x", "x", "x"],
        ground_truth=["B", "B", "B"],
        tag=["crossthinkqa"] * 3,
    )
    route = RewardRoute(
        function="crossthinkqa", tags=["crossthinkqa"], kwargs={"reward_type": "soft"}
    )
    with RewardScorer(RewardConfig(num_workers=0, routes={"crossthinkqa": route})) as scorer:
        scores, _, metrics, failures = scorer.score_batch(batch, tokenizer)
    assert failures == []
    # soft: boxed+correct 1.0, correct unboxed 0.5, boxed+wrong -0.5 (under 3 words: no
    # repetition penalty)
    assert scores.tolist() == [1.0, 0.5, -0.5]
    assert metrics["reward_extra/acc"] == pytest.approx(2 / 3)
