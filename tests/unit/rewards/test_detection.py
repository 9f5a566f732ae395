"""The detection reward (ROLL's DetectionRewardWorker): box answers, IoU, matchings, COCO
AP, the weighted score, bad rows — every expected value worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from temper.config.schema import RewardConfig, RewardRoute
from temper.data.batch import Batch
from temper.rewards.functions.box_metrics import (
    iou_matrix,
    match_iou_first,
    match_label_first,
    match_score,
    mean_average_precision,
)
from temper.rewards.functions.boxes import (
    Box,
    answer_boxes,
    answer_text,
    format_ok,
    parse_boxes,
    rescale_to_thousand,
)
from temper.rewards.functions.detection import (
    check_iou_threshold,
    compute_score,
    dynamic_threshold,
    reward_ratios,
)
from temper.rewards.manager import RewardScorer
from temper.rewards.registry import get_reward_function, reward_function_needs

DOG = "{'bbox_2d': [0, 0, 10, 10], 'label': 'dog'}"
TRUTH = f"<answer>\n[{DOG}]\n</answer>"
LABEL_FIRST = {"iou_max_label_first": 1.0, "iou_completeness": 0.3}


def boxes(*rows: list[float]) -> np.ndarray:
    return np.array(rows, dtype=np.float64).reshape(-1, 4)


def answer(items: str) -> str:
    return f"<think>\nlook\n</think>\n<answer>\n[{items}]\n</answer>"


def row(ratio: dict[str, float], **more) -> dict:
    return {"reward_model": {"verifier_parm": {"det_reward_ratio": ratio}, **more}}


# ------------------------------------------------------------------------------ IoU


def test_iou_half_overlap_containment_and_no_overlap():
    pred = boxes([0, 0, 10, 10], [0, 0, 1, 1], [0, 0, 1, 1], [0, 0, 0, 10])
    truth = boxes([5, 0, 15, 10], [0, 0, 5, 5], [1, 0, 2, 1])
    iou = iou_matrix(pred, truth)
    assert iou.shape == (4, 3)
    assert iou[0, 0] == pytest.approx(50 / 150)  # 5×10 shared of 100 + 100 - 50
    assert iou[0, 1] == pytest.approx(25 / 100)  # truth inside pred
    assert iou[1, 1] == pytest.approx(1 / 25)
    assert iou[2, 2] == 0.0  # edges touch: no area in common
    assert iou[3].tolist() == [0.0, 0.0, 0.0]  # a zero-width box overlaps nothing
    assert iou_matrix(boxes(), truth).shape == (0, 3)


# ------------------------------------------------------------------------------ matching

# P0 covers the truth exactly but names a cat; P1 is the dog, 90 % of the truth.
PRED = boxes([0, 0, 10, 10], [0, 0, 10, 9])
TRUTH_BOX = boxes([0, 0, 10, 10])
SAME = np.array([[False], [True]])


def test_iou_first_takes_the_best_overlap_whatever_its_label():
    iou = iou_matrix(PRED, TRUTH_BOX)
    (m,) = match_iou_first(iou, SAME, 0.5)
    assert (m.pred, m.truth, m.iou) == (0, 0, 0.0)  # matched, scored 0: wrong label
    assert match_iou_first(iou, SAME, 1.01) == []


def test_label_first_takes_the_best_overlap_of_the_label():
    iou = iou_matrix(PRED, TRUTH_BOX)
    (m,) = match_label_first(iou, SAME, 0.5)
    assert (m.pred, m.truth) == (1, 0) and m.iou == pytest.approx(0.9)
    assert match_label_first(iou, SAME, 0.95) == []


def test_iou_first_matches_pairs_in_order_of_overlap():
    # P0 overlaps T0 by 1/3 and T1 by 1; P1 overlaps T0 by 1: both pairs of IoU 1 match
    pred = boxes([5, 0, 15, 10], [0, 0, 10, 10])
    truth = boxes([0, 0, 10, 10], [5, 0, 15, 10])
    same = np.ones((2, 2), dtype=bool)
    got = match_iou_first(iou_matrix(pred, truth), same, 0.5)
    assert sorted((m.pred, m.truth, m.iou) for m in got) == [(0, 1, 1.0), (1, 0, 1.0)]


def test_match_score_formula():
    iou = iou_matrix(PRED, TRUTH_BOX)
    label = match_score(match_label_first(iou, SAME, 0.5), 2, 1, 0.3)
    # mean IoU 0.9; miss 0, false alarm 1/2 -> completeness 0.75
    assert label.mean_iou == pytest.approx(0.9) and label.completeness == 0.75
    assert (label.precision, label.recall) == (0.5, 1.0)
    assert label.weighted == pytest.approx(0.7 * 0.9 + 0.3 * 0.75)
    by_iou = match_score(match_iou_first(iou, SAME, 0.5), 2, 1, 0.3)
    assert by_iou.weighted == pytest.approx(0.3 * 0.75)  # matched at IoU 1, label wrong
    nothing = match_score([], 0, 2, 0.3)  # no predictions: no false alarm, all missed
    assert nothing.completeness == 0.5 and nothing.weighted == pytest.approx(0.15)


# ------------------------------------------------------------------------------ COCO AP


def test_ap_exact_box_is_one_and_order_matters():
    exact = mean_average_precision(boxes([0, 0, 10, 10]), ["a"], TRUTH_BOX, ["a"])
    assert exact.map == pytest.approx(1.0) and exact.map75 == pytest.approx(1.0)
    # a miss ranked before the hit: precision 1/2 at every recall
    late = mean_average_precision(
        boxes([20, 20, 30, 30], [0, 0, 10, 10]), ["a", "a"], TRUTH_BOX, ["a"]
    )
    assert late == pytest.approx((0.5, 0.5, 0.5))
    # the hit first: precision 1 up to recall 1
    early = mean_average_precision(
        boxes([0, 0, 10, 10], [20, 20, 30, 30]), ["a", "a"], TRUTH_BOX, ["a"]
    )
    assert early == pytest.approx((1.0, 1.0, 1.0))


def test_ap_averages_thresholds_and_labels():
    # IoU 0.8 passes the 7 thresholds 0.5 … 0.8 of 10
    ap = mean_average_precision(boxes([0, 0, 10, 8]), ["a"], TRUTH_BOX, ["a"])
    assert ap == pytest.approx((0.7, 1.0, 1.0))
    # label b has no prediction: AP 0, mAP the mean over the two labels
    two = mean_average_precision(
        boxes([0, 0, 10, 10]), ["a"], boxes([0, 0, 10, 10], [50, 50, 60, 60]), ["a", "b"]
    )
    assert two == pytest.approx((0.5, 0.5, 0.5))
    # no prediction of a true label: all 0 (predictions of other labels are not scored)
    assert mean_average_precision(boxes([0, 0, 10, 10]), ["z"], TRUTH_BOX, ["a"]) == (0, 0, 0)


# ------------------------------------------------------------------------------ answers


@pytest.mark.parametrize(
    "text",
    [
        "[{'bbox_2d': [1, 2, 3, 4], 'label': 'dog'}]",  # Orsta's single quotes
        '[{"bbox_2d": [1, 2, 3, 4], "label": "dog"}]',  # JSON
        "[[{'bbox_2d': [1, 2, 3, 4], 'label': 'dog'}]]",  # wrapped twice
        "[{'bbox_2d': [1, 2, 3, 4], 'label': 'dog'}, {'bbox_2d': [5, 6",  # cut off
        "[{'bbox_2d': [1, 2, 3, 4], 'confidence': 0.9, 'label': 'dog'}]",  # extra field
        '[{\\"bbox_2d\\": [1, 2, 3, 4], \\"label\\": \\"dog\\"}]',  # escaped quotes
        "[{'bbox_2d': [1.0, 2.0, 3.0, 4.0], 'label': 'dog'}, "
        "{'bbox_2d': [1, 2, 3, 4], 'label': 'dog'}]",  # same place twice: kept once
    ],
)
def test_parse_formats(text):
    assert parse_boxes(text) == [Box(1, 2, 3, 4, "dog")]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "no boxes here",
        "[]",
        "{'bbox_2d': [1, 2, 3, 4], 'label': 'dog'}",  # an object, not a list
        "[{'bbox_2d': [3, 2, 1, 4], 'label': 'dog'}]",  # x1 > x2
        "[{'bbox_2d': [1, 2, 3], 'label': 'dog'}]",  # three coordinates
        "[{'bbox_2d': ['1', 2, 3, 4], 'label': 'dog'}]",  # a string coordinate
        "[{'bbox_2d': [1, 2, 3, 4], 'label': 7}]",  # a label that is no string
        "[{'bbox_2d': [1, 2, 3, 1e999], 'label': 'dog'}]",  # infinite
        "[{'box': [1, 2, 3, 4], 'label': 'dog'}]",
    ],
)
def test_parse_rejects(text):
    assert parse_boxes(text) is None


def test_answer_is_the_first_tagged_block_lower_cased():
    text = "x <answer> [{'BBOX_2D': [1, 2, 3, 4], 'label': 'Dog'}] </answer><answer>[]</answer>"
    assert answer_text(text) == "[{'BBOX_2D': [1, 2, 3, 4], 'label': 'Dog'}]"
    assert answer_boxes(text) == [Box(1, 2, 3, 4, "dog")]
    assert answer_text("no tags") == ""


def test_format_rule():
    assert format_ok(answer(DOG))
    assert not format_ok(f"<answer>\n[{DOG}]\n</answer>")  # no newline before <answer>
    assert not format_ok(answer(DOG) + "\n</answer>")  # two closing tags
    assert not format_ok(answer("{'bbox_2d': [3, 0, 1, 1], 'label': 'dog'}"))  # no valid box


def test_rescale_truncates_to_the_grid():
    (b,) = rescale_to_thousand([Box(1, 50, 199, 100, "a")], width=200, height=100)
    assert b == Box(5, 500, 995, 1000, "a")
    (c,) = rescale_to_thousand([Box(1, 1, 2, 2, "a")], width=3, height=3)
    assert c[:4] == (333, 333, 666, 666)


# ------------------------------------------------------------------------------ settings


def test_iou_threshold_settings():
    assert check_iou_threshold("average") == "average"
    assert check_iou_threshold("0.75") == 0.75  # ROLL's environment variable is a string
    assert check_iou_threshold(0.99) == 0.99
    for bad in ("0.42", "mean", None, 1.0):
        with pytest.raises(ValueError, match="is not one of"):
            check_iou_threshold(bad)
    assert [dynamic_threshold(p) for p in (0.0, 0.1, 0.2, 0.25, 0.3, 1.0)] == [
        0.85,
        0.85,
        0.95,
        0.95,
        0.99,
        0.99,
    ]


def test_reward_ratios_defaults_and_out_of_range():
    ratios, problems = reward_ratios({"map": 1.5, "map50": 0.5, "extra": 1})
    assert ratios == {
        "iou_max_iou_first": 0.0,
        "iou_max_label_first": 0.0,
        "map": 0.0,  # outside [0, 1]: counts 0, as in ROLL
        "map50": 0.5,
        "map75": 0.0,
        "iou_completeness": 0.0,
    }
    assert any("map=1.5" in p for p in problems) and any("extra" in p for p in problems)
    _, none = reward_ratios({})
    assert none == ["det_reward_ratio weighs no score term: accuracy is 0"]
    with pytest.raises(ValueError, match="not a number"):
        reward_ratios({"map": "high"})


# ------------------------------------------------------------------------------ the score


def test_exact_answer_scores_one():
    out = compute_score("v3det_train", answer(DOG), TRUTH, row(LABEL_FIRST))
    assert out["score"] == pytest.approx(1.0)
    assert out["format_reward"] == 1.0 and out["accuracy_reward"] == pytest.approx(1.0)
    assert out["detection_problem"] is None and out["truth_has_boxes"] == 1.0


PARTIAL = answer(
    "{'bbox_2d': [0, 0, 10, 8], 'label': 'dog'}, {'bbox_2d': [50, 50, 60, 60], 'label': 'cat'}"
)
# label first, IoU 0.8: matched at 7 of the 11 thresholds with mean IoU 0.8 and
# completeness 0.75 (the cat is a false alarm), unmatched (0) at the other 4
LABEL_AVERAGE = 7 * (0.7 * 0.8 + 0.3 * 0.75) / 11
PENALTY = 0.6  # two boxes for one


def test_partial_answer_label_first_average():
    out = compute_score("v3det_train", PARTIAL, TRUTH, row(LABEL_FIRST))
    assert out["size_penalty"] == pytest.approx(PENALTY)
    assert out["pure_iou_score_max_label"] == pytest.approx(LABEL_AVERAGE)
    assert out["accuracy_reward"] == pytest.approx(PENALTY * LABEL_AVERAGE)
    assert out["score"] == pytest.approx((PENALTY * LABEL_AVERAGE + 0.1) / 1.1)
    assert out["report_iou_50_label_match_precision"] == 0.5
    assert out["report_iou_95_label_match_recall"] == 0.0


def test_partial_answer_with_map_and_fixed_threshold():
    ratio = {**LABEL_FIRST, "map": 1.0}
    out = compute_score("v3det_train", PARTIAL, TRUTH, row(ratio))
    assert out["pure_map_score"] == pytest.approx(0.7)  # the cat is not scored by AP
    assert out["accuracy_reward"] == pytest.approx(PENALTY * (LABEL_AVERAGE + 0.7) / 2)
    at_80 = compute_score("v3det_train", PARTIAL, TRUTH, row(LABEL_FIRST), iou_threshold=0.8)
    assert at_80["pure_iou_score_max_label"] == pytest.approx(0.7 * 0.8 + 0.3 * 0.75)
    late = compute_score(
        "x", PARTIAL, TRUTH, row(LABEL_FIRST), iou_threshold="dynamic", progress=0.5
    )
    assert late["pure_iou_score_max_label"] == 0.0  # 0.99 at the end of training


def test_row_ratios_and_argument_defaults():
    no_format = answer(DOG).replace("\n<answer>", "<answer>")
    out = compute_score(
        "x", no_format, TRUTH, row(LABEL_FIRST, format_ratio=1.0, accuracy_ratio=1.0)
    )
    assert out["format_reward"] == 0.0 and out["score"] == pytest.approx(0.5)
    # a row without reward_model: the arguments' settings
    plain = compute_score("x", answer(DOG), TRUTH, {}, det_reward_ratio=LABEL_FIRST)
    assert plain["score"] == pytest.approx(1.0)


def test_bad_rows_score_as_roll_or_fail_with_the_field():
    no_truth = compute_score("x", answer(DOG), "[]", row(LABEL_FIRST))
    assert no_truth["accuracy_reward"] == 0.0 and no_truth["score"] == pytest.approx(0.1 / 1.1)
    assert "ground truth holds no <answer>" in no_truth["detection_problem"]
    assert no_truth["truth_has_boxes"] == 0.0
    no_boxes = compute_score("x", "<answer>\nnothing\n</answer>", TRUTH, row(LABEL_FIRST))
    assert no_boxes["score"] == 0.0 and no_boxes["report_iou_50_label_match_recall"] == 0.0
    with pytest.raises(ValueError, match="det_reward_ratio"):
        compute_score("x", answer(DOG), TRUTH, {"reward_model": {"ground_truth": TRUTH}})
    with pytest.raises(ValueError, match="is 0"):
        compute_score("x", answer(DOG), TRUTH, row(LABEL_FIRST, format_ratio=0, accuracy_ratio=0))
    with pytest.raises(ValueError, match="does not take"):
        compute_score(
            "x",
            answer(DOG),
            TRUTH,
            {"reward_model": {"verifier_parm": {"det_reward_ratio": LABEL_FIRST, "mode": 1}}},
        )


def test_pixel_boxes_of_qwen2_5_go_on_the_grid():
    parm = {"det_reward_ratio": LABEL_FIRST, "det_verifier_normalized": True}
    info = {"reward_model": {"verifier_parm": parm}}
    truth = "<answer>\n[{'bbox_2d': [0, 0, 500, 500], 'label': 'dog'}]\n</answer>"
    pixels = answer("{'bbox_2d': [0, 0, 100, 50], 'label': 'dog'}")  # a 200×100 image
    qwen25 = compute_score(
        "x", pixels, truth, info, model_type="qwen2_5_vl", image_sizes=[(200, 100)]
    )
    assert qwen25["accuracy_reward"] == pytest.approx(1.0)
    # Qwen3-VL answers on the grid already: the same numbers are not rescaled
    qwen3 = compute_score("x", pixels, truth, info, model_type="qwen3_vl", image_sizes=[(200, 100)])
    assert qwen3["pure_iou_score_max_label"] < 0.1
    missing = compute_score("x", pixels, truth, info, model_type="qwen2_5_vl")
    assert "no image size" in missing["detection_problem"]


# ------------------------------------------------------------------------------ the manager


def test_registry_entry_declares_its_inputs():
    assert get_reward_function("detection") is compute_score
    assert reward_function_needs("detection") == {"model_type", "image_sizes", "progress"}
    assert reward_function_needs("math") == frozenset()


def test_manager_passes_inputs_and_records_a_bad_row():
    truth = "<answer>\n[{'bbox_2d': [0, 0, 500, 500], 'label': 'dog'}]\n</answer>"
    parm = {"det_reward_ratio": LABEL_FIRST, "det_verifier_normalized": True}
    image = {"image": [Image.new("RGB", (200, 100))]}
    batch = Batch.from_dict(
        objects={
            "response_text": [answer("{'bbox_2d': [0, 0, 100, 50], 'label': 'dog'}")] * 2,
            "data_source": ["v3det_train", "v3det_train"],
            "tag": ["v3det_train", "v3det_train"],
            "ground_truth": [truth, truth],
            "extra_info": [
                {"reward_model": {"verifier_parm": parm}},
                {"reward_model": {"ground_truth": truth}},  # no verifier_parm: ROLL raises
            ],
            "multi_modal_data": [image, image],
        },
        meta={"progress": 0.5},
    )
    config = RewardConfig(
        num_workers=0,
        routes={"cv_detection": RewardRoute(function="detection", tags=["v3det_train"])},
    )
    with RewardScorer(config) as scorer:
        scorer.model_type = "qwen2_5_vl"
        scores, extra, failures = scorer.score_texts(batch)
    assert scores[0].item() == pytest.approx(1.0)
    assert extra[0]["accuracy_reward"] == pytest.approx(1.0)
    assert scores[1].item() == config.failure_score
    (failure,) = failures
    assert failure.index == 1 and "verifier_parm" in failure.reason


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"iou_threshold": 0.42}, "is not one of"),
        ({"det_reward_ratio": {"map": "all"}}, "not a number"),
        ({"format_ratio": "0.1"}, "not a number"),
        ({"det_verifier_normalized": "yes"}, "not true or false"),
        ({"image_sizes": [(1, 1)]}, "no setting 'image_sizes'"),  # the manager's to give
        ({"iou": 0.5}, "no setting 'iou'"),
    ],
)
def test_route_settings_are_checked_before_the_run(kwargs, message):
    from temper.config.errors import ConfigError
    from temper.rewards.preflight import check_rewards

    config = RewardConfig(
        num_workers=0,
        routes={"cv": RewardRoute(function="detection", tags=["v3det_train"], kwargs=kwargs)},
    )
    with pytest.raises(ConfigError, match=rf"reward\.routes\.cv\.kwargs: .*{message}"):
        check_rewards(config)  # temper check
    with pytest.raises(ConfigError, match=message):
        RewardScorer(config)  # and the run, should it not have been checked
    fine = {"iou_threshold": "dynamic", "det_reward_ratio": LABEL_FIRST, "format_ratio": 0.2}
    check_rewards(RewardConfig(routes={"cv": RewardRoute(function="detection", kwargs=fine)}))
