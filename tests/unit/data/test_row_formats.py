"""Row formats: ROLL's Video-R1 rows become temper rows — the prompt ROLL's
video_r1_format_prompt builds (video first, question template, the type's instruction),
the video, the solution as ground truth, the modality as tag, the problem type for the
reward — and malformed ones are reported per row."""

from __future__ import annotations

import pytest

from temper.config.schema import DataConfig
from temper.data.errors import RowProblem
from temper.data.row_formats import (
    DISTILL_VL_QUESTION,
    ROW_FORMATS,
    VIDEO_R1_QUESTION,
    VIDEO_R1_TYPES,
)

ROW = {
    "modality_type": "video",
    "problem": "Why does the video end on a red screen?\nOptions:\nA. a promo\nB. a warning\n",
    "solution": "<answer>A</answer>",
    "video": "videos/ytb_HBxn56l9WcU.mp4",
    "problem_type": "multiple choice",
}


def test_a_video_r1_row_becomes_a_temper_row():
    cfg = DataConfig(messages_key="prompt", ground_truth_key="solution", tag_key="tag")
    out = ROW_FORMATS.get("video_r1")(dict(ROW), cfg)
    text = out["prompt"][0]["content"]
    assert out["prompt"][0]["role"] == "user" and len(out["prompt"]) == 1
    assert text.startswith("<video>Why does the video end on a red screen?\nOptions:")
    assert text.endswith(
        "tags. Please provide only the single option letter (e.g., A, B, C, D, etc.) within "
        "the <answer> </answer> tags."
    )
    assert (
        text
        == "<video>"
        + VIDEO_R1_QUESTION.format(Question=ROW["problem"])
        + VIDEO_R1_TYPES["multiple choice"]
    )
    assert out["videos"] == ["videos/ytb_HBxn56l9WcU.mp4"]
    assert (out["solution"], out["tag"]) == ("<answer>A</answer>", "video")
    assert out["extra_info"] == {"problem_type": "multiple choice"}


def test_rows_as_they_are_and_bad_video_r1_rows():
    cfg = DataConfig()
    assert ROW_FORMATS.get("none")(dict(ROW), cfg) == ROW
    with pytest.raises(RowProblem, match="needs 'solution'"):
        ROW_FORMATS.get("video_r1")({**ROW, "solution": None}, cfg)
    with pytest.raises(RowProblem, match="problem_type 'essay' is not one of"):
        ROW_FORMATS.get("video_r1")({**ROW, "problem_type": "essay"}, cfg)
    with pytest.raises(RowProblem, match="needs 'video'"):
        ROW_FORMATS.get("video_r1")({**ROW, "video": ""}, cfg)


def test_a_roll_vl_distill_row_becomes_a_prompt_with_its_images_first():
    """ROLL's VL distillation rows: the images, then the question in its answer-tag
    template; a null image is a text row; a bad column is the row's problem."""
    cfg = DataConfig(prompt_key="problem")
    fmt = ROW_FORMATS.get("roll_distill_vl")
    row = {"problem": "What is x?", "solution": "3", "image": {"bytes": b"png", "path": None}}
    out = fmt(dict(row), cfg)
    text = "<image>" + DISTILL_VL_QUESTION.format(Question="What is x?")
    assert out["problem"] == [{"role": "user", "content": text}]
    assert out["images"] == [row["image"]] and out["solution"] == "3"
    two = fmt({"problem": "x?", "solution": "3", "image": ["a.png", "b.png"]}, cfg)
    assert two["problem"][0]["content"].startswith("<image><image>x?")
    assert two["images"] == ["a.png", "b.png"]
    text_row = fmt({"problem": "x?", "solution": "3", "image": None}, cfg)
    assert text_row["images"] == [] and "<image>" not in text_row["problem"][0]["content"]
    for bad, reason in [
        ({"solution": "3"}, "needs 'problem'"),
        ({"problem": 4, "solution": "3"}, "must be a string or a chat list"),
        ({"problem": "x", "solution": "3", "image": ["a.png", None]}, "null entry"),
    ]:
        with pytest.raises(RowProblem, match=reason):
            fmt(bad, cfg)
