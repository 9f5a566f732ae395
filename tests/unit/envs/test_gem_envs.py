"""GEM's envs: Guess-the-Number's rewards, letter counting's items and score, the dataset
envs' answer checks, and the step-concat prompt."""

from __future__ import annotations

import json
import math

import pytest

from temper.envs import StepRecord, make_env
from temper.envs.gem_reasoning import WORDS, letter_counting_item, score_answer
from temper.envs.gem_text import TERMINAL, exact_match, last_tagged_answer, normalize_answer
from temper.envs.steps import render_concat_prompt


def _game(seed: int = 3, **kw: int):
    env = make_env("game:GuessTheNumber-v0", **{"min_number": 1, "max_number": 20, **kw})
    obs, info = env.reset(seed)
    return env, obs, info


def test_guess_the_number_rewards_by_hand() -> None:
    env, obs, info = _game(max_turns=4)
    assert "between 1 and 20" in obs and "you have 4 turns" in obs
    assert info["suffix"] == env.suffix() == "Make your next guess."
    t = env.target
    low = 1 if t != 1 else 2
    # a hint: internal step reward 0, the game goes on
    o, r, term, trunc, _ = env.step(f"I guess \\boxed{{{low}}}")
    assert (r, term, trunc) == (0.0, False, False)  # low != t by its choice
    assert "higher" in o or "lower" in o
    # the same guess again, and one out of range: invalid (0), the game goes on
    assert env.step(f"\\boxed{{{low}}}")[1:4] == (0.0, False, False)
    assert env.step("\\boxed{99}")[1:4] == (0.0, False, False)
    # the last turn without the target: 1 - |guess - target| / (max - min)
    wrong = 20 if t != 20 else 19
    o, r, term, trunc, info = env.step(f"\\boxed{{{wrong}}}")
    assert (term, trunc, info["success"]) == (True, True, False)
    assert r == pytest.approx(1 - abs(wrong - t) / 19)
    assert o == "No turns are left."


def test_guess_the_number_success_and_format_error() -> None:
    env, _, _ = _game()
    o, r, term, trunc, info = env.step(f"the last box counts: \\boxed{{3}} \\boxed{{{env.target}}}")
    assert (r, term, trunc, info["success"]) == (1.0, True, False, True)
    assert o.startswith("Correct!")
    env.reset(3)
    o, r, term, _, info = env.step("no box at all")
    assert (r, term, info["action_is_valid"]) == (-0.1, True, False)
    env.reset(3)
    assert env.step("\\boxed{0}")[1] == -0.1  # GEM reads 0 as no guess


def test_guess_the_number_is_seeded_and_draws_ranges() -> None:
    targets = {_game(seed=s)[0].target for s in range(40)}
    assert targets <= set(range(1, 21)) and len(targets) > 5
    assert _game(seed=7)[0].target == _game(seed=7)[0].target
    env = make_env("game:GuessTheNumber-v0", min_number=None, max_number=None)
    env.reset(11)
    assert 1 <= env.min_number <= 10
    assert env.min_number + 5 <= env.max_number <= env.min_number + 50
    assert env.max_turns == math.ceil(math.sqrt(env.max_number - env.min_number)) + 1


def test_letter_counting_item_counts_the_letter() -> None:
    for i in range(20):
        item = letter_counting_item(i, seed=42)
        text = item["question"].split("text: ")[1].strip('"?')
        words = text.split()
        assert 5 <= len(words) <= 15 and all(w in WORDS for w in words)
        assert item["answer"] == str(text.lower().count(item["letter"]))
    assert letter_counting_item(3, 42) == letter_counting_item(3, 42)
    assert letter_counting_item(3, 42) != letter_counting_item(4, 42)


def test_letter_counting_score_by_hand() -> None:
    assert score_answer("7", "7") == 1.0
    assert score_answer("17", "7") == 0.5  # the truth inside the answer: len 1 / len 2
    assert score_answer("8", "7") == 0.0
    assert score_answer(None, "7") == 0.0
    env = make_env("rg:letter_counting", size=10, seed=1)
    env.reset(5)
    truth = env.item["answer"]
    obs, r, term, trunc, info = env.step(f"so \\boxed{{{truth}}}")
    assert (obs, r, term, trunc, info["success"]) == (TERMINAL, 1.0, True, True, True)
    env.reset(5)
    assert env.step("no box")[4]["action_is_valid"] is False


def test_qa_normalization_and_exact_match() -> None:
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert exact_match("an apple", ["Apple", "pear"])
    assert not exact_match("apples", "apple")
    assert last_tagged_answer("<answer>a</answer> then <answer> b </answer>") == "b"


@pytest.fixture
def math_rows(tmp_path):
    path = tmp_path / "math.jsonl"
    rows = [
        {"prompt": "1/2 + 1/4?", "solution": "\\frac{3}{4}"},
        {"prompt": "2+2?", "solution": "4"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_roll_math_checks_the_boxed_answer(math_rows) -> None:
    env = make_env(
        "roll_math", dataset_name=str(math_rows), question_key="prompt", answer_key="solution"
    )
    assert env.problem() is None
    for seed in range(6):
        obs, _ = env.reset(seed)
        right = "0.75" if obs.startswith("1/2") else "4"
        assert env.step(f"\\boxed{{{right}}}")[1] == 1.0
        env.reset(seed)
        assert env.step("\\boxed{5}")[1] == 0.0
        env.reset(seed)
        _, r, term, _, info = env.step("four")
        assert (r, term, info["action_is_valid"]) == (0.0, True, False)
    missing = make_env("roll_math", dataset_name="open-r1/DAPO-Math-17k-Processed")
    assert "not a local file" in str(missing.problem())


def test_roll_qa_shows_the_prompt_and_matches(tmp_path) -> None:
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"problem": "Capital of France?", "answer": ["Paris"]}))
    env = make_env("roll_qa", dataset_name=str(path), question_key="problem")
    obs, _ = env.reset(0)
    assert obs.endswith("Question: Capital of France?\n") and "<answer>" in obs
    assert env.step("<think>easy</think><answer>paris.</answer>")[1] == 1.0
    env.reset(0)
    assert env.step("<answer>Lyon</answer>")[1] == 0.0


def test_concat_prompt_joins_observations_only() -> None:
    records = [StepRecord(f"o{k}", f"a{k}", 1.0) for k in range(3)]
    template = "Observation:\n{history}\n{current_observation}\nAnswer in \\boxed{{}}; {other}"
    text = render_concat_prompt(
        observation="now",
        suffix="Enter your next guess.",
        records=records,
        history_length=3,
        template=template,
    )
    # the window of history_length 3: the two observations before the current one
    assert text == "Observation:\no1\no2\nnow\nEnter your next guess.\nAnswer in \\boxed{}; {other}"
    assert (
        render_concat_prompt(observation="now", suffix="", records=records, history_length=None)
        == "now\n"
    )
    assert (
        render_concat_prompt(observation="now", suffix="s", records=records, history_length=0)
        == "o0\no1\no2\nnow\ns"
    )


def test_turn_template_braces_follow_str_format(math_rows) -> None:
    """ROLL fills agent_template with str.format: the GEM math files' ``\\boxed{{answer}}``
    reaches the model as ``\\boxed{answer}``."""
    from temper.config.schema import EnvManagerConfig, EnvTagConfig
    from temper.envs import EnvManager

    tag = EnvTagConfig(
        env_type="roll_math",
        env_config={
            "dataset_name": str(math_rows),
            "question_key": "prompt",
            "answer_key": "solution",
        },
        turn_template="{observation}\nEnsure that your response includes '\\boxed{{answer}}'. {x}",
    )
    manager = EnvManager(EnvManagerConfig(num_env_groups=1, group_size=1, tags=["M"]), {"M": tag})
    (slot,) = manager.reset(0)
    text = manager.turn_text(slot.env_id, slot.observation)
    assert text.endswith("\nEnsure that your response includes '\\boxed{answer}'. {x}")
    assert slot.instruction == ""  # the question is the whole first message
