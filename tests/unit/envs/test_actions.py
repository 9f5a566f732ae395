"""Action parsing edge cases (rules in temper/envs/actions.py)."""

from __future__ import annotations

from temper.envs.actions import parse_action

MOVES = ["Up", "Down", "Left", "Right"]


def test_case_and_whitespace():
    p = parse_action("I go <ANSWER>\n  up \n</Answer>", valid_actions=MOVES)
    assert p.valid and p.action == "Up" and p.actions == ["Up"]
    assert parse_action("<answer>1</answer>", valid_actions=MOVES).action == "Up"
    assert parse_action("<answer>move   left</answer>", valid_actions=["Move Left"]).action == (
        "Move Left"
    )


def test_no_tag_empty_and_unknown():
    p = parse_action("Up", valid_actions=MOVES)
    assert not p.valid and p.action is None and p.reason == "no answer tag"
    p = parse_action("<answer>  </answer>", valid_actions=MOVES)
    assert not p.valid and p.reason == "empty answer"
    p = parse_action("<answer>Jump</answer>", valid_actions=MOVES)
    assert not p.valid and p.unknown == ["Jump"] and p.action is None
    assert parse_action("<answer>5</answer>", valid_actions=MOVES).unknown == ["5"]


def test_multiple_tags_first_by_default_last_on_request():
    text = "<answer>Up</answer> on second thought <answer>Down</answer>"
    assert parse_action(text, valid_actions=MOVES).action == "Up"  # ROLL: re.search
    assert parse_action(text, valid_actions=MOVES, take="last").action == "Down"


def test_think_required():
    ok = parse_action("<think>box is left</think> <answer>Left</answer>", require_think=True)
    assert ok.valid and ok.think == "box is left" and ok.action == "Left"
    assert not parse_action("<answer>Left</answer>", require_think=True).valid
    late = parse_action("<answer>Left</answer><think>x</think>", require_think=True)
    assert not late.valid and "think" in late.reason
    assert not parse_action("<think> </think><answer>Left</answer>", require_think=True).valid
    assert parse_action("<answer>Left</answer>").valid  # not required: fine without


def test_action_sep_and_cap():
    p = parse_action(
        "<answer>Right || right||  UP ||</answer>",
        "<answer>(.*?)</answer>",
        valid_actions=MOVES,
        action_sep="||",
    )
    assert p.valid and p.actions == ["Right", "Right", "Up"]
    p = parse_action("<answer>Up || Fly || Down</answer>", valid_actions=MOVES, action_sep="||")
    assert not p.valid and p.actions == ["Up", "Down"] and p.unknown == ["Fly"]
    p = parse_action(
        "<answer>Up||Up||Up</answer>", valid_actions=MOVES, action_sep="||", max_actions=2
    )
    assert p.valid and p.actions == ["Up", "Up"] and "kept the first 2" in p.reason
    # without action_sep the whole answer is one action
    assert not parse_action("<answer>Up||Up</answer>", valid_actions=MOVES).valid


def test_free_form_special_tokens_and_custom_pattern():
    p = parse_action("<answer>(5 - 3) * 2<|im_end|></answer>")
    assert p.valid and p.action == "(5 - 3) * 2"
    p = parse_action("Action: [down]", pattern=r"\[(\w+)\]", valid_actions=MOVES)
    assert p.action == "Down"
