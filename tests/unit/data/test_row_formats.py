"""Row formats: ROLL's Video-R1 rows become temper rows — the prompt ROLL's
video_r1_format_prompt builds (video first, question template, the type's instruction),
the video, the solution as ground truth, the modality as tag, the problem type for the
reward — and malformed ones are reported per row."""

from __future__ import annotations

import pytest

from temper.config.schema import DataConfig
from temper.data.errors import RowProblem
from temper.data.row_formats import ROW_FORMATS, VIDEO_R1_QUESTION, VIDEO_R1_TYPES

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
