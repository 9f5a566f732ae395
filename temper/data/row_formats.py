"""Row formats: named layouts of upstream prompt data, rewritten into temper's row
conventions (``data.prompt_key`` / ``messages_key`` messages with ``<image>`` / ``<video>``
marks, ``data.video_key`` videos, ``ground_truth_key``, ``tag_key``, ``extra_info_key``)
before a row is read. ``data.row_format`` names one; ``none`` reads rows as they are.

- ``video_r1``: the rows of ROLL's Video-R1 example (its ``custom_data_kwargs_func``
  ``video_r1_get_data_kwargs``): ``problem``, ``problem_type``, ``modality_type``,
  ``video`` (a path), ``solution``. The prompt is one user turn, the video first, then
  Video-R1's question template and the instruction of the problem type (ROLL's
  ``video_r1_format_prompt``); the tag is the modality (ROLL routes rewards by it), the
  ground truth the solution, and ``extra_info["problem_type"]`` tells the ``video_r1``
  reward how to compare answers.
- ``roll_distill_vl``: the rows of ROLL's VL distillation pipeline
  (``distill_vlm_pipeline``): ``problem`` (the question, or a chat list used as it is),
  ``solution`` (the response to learn, left in its column: ``sft.response_key``) and
  ``image`` (an image, a list of them, or null for a text row). The prompt is one user
  turn, the images first, then the question in ROLL's answer-tag template.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from temper.config.schema import DataConfig
from temper.data.errors import RowProblem
from temper.registry import Registry


@dataclasses.dataclass(frozen=True)
class RowFormat:
    """A row rewrite and the columns it reads (a pre-flight that reads only some columns
    of a file, as it does parquet's, reads these too)."""

    rewrite: Callable[[dict[str, Any], DataConfig], dict[str, Any]]
    reads: tuple[str, ...] = ()

    def __call__(self, row: dict[str, Any], cfg: DataConfig) -> dict[str, Any]:
        return self.rewrite(row, cfg)


#: The value of ``data.row_format`` that reads rows as they are.
NONE = "none"

# Video-R1's prompt (ROLL roll/datasets/vlm_dataset_utils.py, after Video-R1's grpo.py).
VIDEO_R1_QUESTION = (
    "{Question}\n"
    "Please think about this question as if you were a human pondering deeply. "
    "Engage in an internal dialogue using expressions such as 'let me think', 'wait', "
    "'Hmm', 'oh, I see', 'let's break it down', etc, or other natural language thought "
    "expressions "
    "It's encouraged to include self-reflection or verification in the reasoning process. "
    "Provide your detailed reasoning between the <think> </think> tags, and then give your "
    "final answer between the <answer> </answer> tags."
)
VIDEO_R1_TYPES = {
    "multiple choice": " Please provide only the single option letter (e.g., A, B, C, D, "
    "etc.) within the <answer> </answer> tags.",
    "numerical": " Please provide the numerical value (e.g., 42 or 3.14) within the "
    "<answer> </answer> tags.",
    "OCR": " Please transcribe text from the image/video clearly and provide your text "
    "answer within the <answer> </answer> tags.",
    "free-form": " Please provide your text answer within the <answer> </answer> tags.",
    "regression": " Please provide the numerical value (e.g., 42 or 3.14) within the "
    "<answer> </answer> tags.",
}


def video_r1(row: dict[str, Any], cfg: DataConfig) -> dict[str, Any]:
    """A Video-R1 row in temper's conventions (module doc)."""
    for column in ("problem", "problem_type", "solution"):
        if row.get(column) is None:
            raise RowProblem(f"a Video-R1 row needs '{column}'")
    kind = row["problem_type"]
    if kind not in VIDEO_R1_TYPES:
        raise RowProblem(
            f"problem_type '{kind}' is not one of Video-R1's: {', '.join(VIDEO_R1_TYPES)}"
        )
    modality = row.get("modality_type")
    if modality not in (None, "", "video"):
        raise RowProblem(f"modality_type '{modality}': Video-R1 rows here are video or text")
    text = VIDEO_R1_QUESTION.format(Question=row["problem"]) + VIDEO_R1_TYPES[kind]
    out = dict(row)
    if modality == "video":
        if not row.get("video"):
            raise RowProblem("a video row of Video-R1 needs 'video'")
        text = "<video>" + text
        out[cfg.video_key] = [row["video"]]
    out[cfg.messages_key or cfg.prompt_key] = [{"role": "user", "content": text}]
    out[cfg.ground_truth_key] = row["solution"]
    out[cfg.tag_key] = modality or "text"
    info = row.get(cfg.extra_info_key)
    out[cfg.extra_info_key] = {**(info if isinstance(info, dict) else {}), "problem_type": kind}
    return out


# ROLL's VL distillation prompt (roll/pipeline/distill/distill_vlm_pipeline.py).
DISTILL_VL_QUESTION = "{Question}  Output final answer (number) in <answer> </answer> tags."


def roll_distill_vl(row: dict[str, Any], cfg: DataConfig) -> dict[str, Any]:
    """A row of ROLL's VL distillation in temper's conventions (module doc)."""
    problem = row.get("problem")
    if problem is None:
        raise RowProblem("a VL distillation row needs 'problem' (the question)")
    image = row.get("image")
    images = [] if image is None else list(image) if isinstance(image, (list, tuple)) else [image]
    if any(item is None for item in images):
        raise RowProblem("column 'image' holds a null entry in its list of images")
    out = dict(row)
    if isinstance(problem, str):
        text = "<image>" * len(images) + DISTILL_VL_QUESTION.format(Question=problem)
        out[cfg.prompt_key] = [{"role": "user", "content": text}]
    elif isinstance(problem, list):  # a conversation: its <image> marks place the images
        out[cfg.prompt_key] = problem
    else:
        raise RowProblem(
            f"column 'problem' must be a string or a chat list, got {type(problem).__name__}"
        )
    out[cfg.image_key] = images
    return out


def _as_is(row: dict[str, Any], cfg: DataConfig) -> dict[str, Any]:
    return row


ROW_FORMATS: Registry[RowFormat] = Registry("row format")
ROW_FORMATS.add(NONE, RowFormat(_as_is))
ROW_FORMATS.add(
    "video_r1",
    RowFormat(
        video_r1, ("problem", "problem_type", "modality_type", "video", "solution", "extra_info")
    ),
)
ROW_FORMATS.add("roll_distill_vl", RowFormat(roll_distill_vl, ("problem", "solution", "image")))
