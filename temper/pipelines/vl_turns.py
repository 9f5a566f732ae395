"""A VL turn's user content and its image tokens: the pure helpers of the VL trajectory
env manager (:mod:`temper.pipelines.agentic_vision`).

- :func:`vl_turn_content`: ``[pre_step_template, image, next_step_template]`` of an env
  whose state is drawn (``rgb_array``);
- :func:`observation_content`: an env's own observation text cut at its ``<image>`` marks;
- :func:`expand_image_ids` / :func:`image_starts`: one placeholder token per image → the
  image's token count, and where each run starts;
- :func:`frame_image` / :func:`pil_image`: a frame or an env's image, sized to the model's
  grid.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np

from temper.data.vision import ImageInput, VisionProcessor, smart_resize
from temper.envs.registry import EnvSpec
from temper.envs.steps import fill_template

__all__ = [
    "IMAGE_MARK",
    "expand_image_ids",
    "frame_image",
    "image_starts",
    "observation_content",
    "pil_image",
    "vl_turn_content",
]

IMAGE_MARK = "<image>"  # where an env's observation text places one of its images


def vl_turn_content(
    spec: EnvSpec, turn_idx: int, actions_left: int, instruction: str = ""
) -> list[dict[str, Any]]:
    """One turn's user message content (ROLL ``VLTrajEnvManager.format_messages``):
    ``[{"type": "text", "text": instruction + pre_step_template.format(turn_idx)},
    {"type": "image"}, {"type": "text", "text": next_step_template.format(actions_left,
    max_response_length)}]``; ``instruction`` is given on the first turn only and
    ``max_response_length`` is the tag's per-turn token budget."""
    pre = instruction + fill_template(spec.pre_step_template, {"turn_idx": turn_idx})
    after = fill_template(
        spec.next_step_template,
        {"actions_left": actions_left, "max_response_length": spec.max_tokens_per_turn},
    )
    return [{"type": "text", "text": pre}, {"type": "image"}, {"type": "text", "text": after}]


def observation_content(
    spec: EnvSpec, text: str, turn_idx: int, actions_left: int, instruction: str = ""
) -> list[dict[str, Any]]:
    """One turn's user message content for an env whose observations hold images
    (``TextEnv.image_observations``): ``instruction + pre_step_template + text +
    next_step_template`` (ROLL joins an env's text observation so), cut at each
    ``<image>`` of ``text`` into text parts and image parts, empty text parts dropped."""
    pre = instruction + fill_template(spec.pre_step_template, {"turn_idx": turn_idx})
    after = fill_template(
        spec.next_step_template,
        {"actions_left": actions_left, "max_response_length": spec.max_tokens_per_turn},
    )
    pieces = text.split(IMAGE_MARK)
    pieces[0], pieces[-1] = pre + pieces[0], pieces[-1] + after
    content: list[dict[str, Any]] = []
    for k, piece in enumerate(pieces):
        if k:
            content.append({"type": "image"})
        if piece:
            content.append({"type": "text", "text": piece})
    return content


def image_starts(ids: Sequence[int], image_id: int, counts: Sequence[int]) -> list[int]:
    """Where each image's run of ``counts[k]`` placeholder tokens starts in expanded
    ``ids`` (:func:`expand_image_ids`' output)."""
    starts, pos = [], 0
    for count in counts:
        pos = list(ids).index(image_id, pos)
        starts.append(pos)
        pos += count
    return starts


def expand_image_ids(ids: Sequence[int], image_id: int, counts: Sequence[int]) -> list[int]:
    """``ids`` with the k-th ``image_id`` repeated ``counts[k]`` times (one placeholder
    token per image, as the chat template writes it, → one token per image patch group).
    Raises ``ValueError`` when the placeholders and ``counts`` differ in number."""
    out: list[int] = []
    pending = list(counts)
    for i in ids:
        if i == image_id:
            if not pending:
                raise ValueError(f"more image placeholders than the {len(counts)} image(s)")
            out.extend([image_id] * pending.pop(0))
        else:
            out.append(int(i))
    if pending:
        raise ValueError(f"{len(pending)} image(s) without a placeholder")
    return out


def pil_image(image: Any, vision: VisionProcessor) -> ImageInput:
    """An env's observation image (PIL) as a prompt image (:func:`frame_image`)."""
    return frame_image(np.asarray(image.convert("RGB"), dtype=np.uint8), vision)


def frame_image(frame: np.ndarray, vision: VisionProcessor) -> ImageInput:
    """An env's ``rgb_array`` frame as a prompt image: PNG-encoded, sized to the model's
    grid within its pixel limits (``smart_resize``), tokens = ``(h / f) · (w / f)``."""
    from PIL import Image

    arr = np.ascontiguousarray(np.asarray(frame, dtype=np.uint8))
    if arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError(f"an rgb_array frame is H×W×3, got shape {arr.shape}")
    buf = io.BytesIO()
    Image.fromarray(arr, mode="RGB").save(buf, format="PNG")
    h, w = smart_resize(
        arr.shape[0], arr.shape[1], vision.factor, vision.min_pixels, vision.max_pixels
    )
    return ImageInput(buf.getvalue(), h, w, (h // vision.factor) * (w // vision.factor))
