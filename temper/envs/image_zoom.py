"""DeepEyes' image tools: zoom in on (crop) or rotate the episode's image.

The model calls a tool inside ``<tool_call>…</tool_call>`` with a JSON object
``{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [x1, y1, x2, y2], "label": …}}``
(or ``{"name": "image_rotate_tool", "arguments": {"angle": 90}}``); the last such block of
an answer is the call. Both tools work on the episode's *original* image (as ROLL's
``VisualToolBoxV2`` does: a second zoom does not zoom into the first crop), in its pixel
coordinates.

The box (:func:`zoom_box`), for an image of width ``W`` and height ``H``:

1. clamped to the image: ``x1 ← max(0, x1)``, ``y1 ← max(0, y1)``, ``x2 ← min(W, x2)``,
   ``y2 ← min(H, y2)``;
2. refused unless ``x1 < x2`` and ``y1 < y2``, ``max(w, h) / min(w, h) ≤ 100``,
   ``min(w, h) > 30`` and ``max(w, h) ≥ 56`` (``w = x2 - x1``, ``h = y2 - y1``): a crop
   smaller than that says nothing a vision encoder with 14-pixel patches can read. (ROLL
   would also enlarge a box under 28 pixels around its centre; no box reaches that step,
   since one under 31 pixels is refused first.)

``bbox_2d`` is what DeepEyes' prompt asks for (``bbox`` is read too, as its first prompt
named it): four numbers, as JSON numbers, numeric strings or one JSON string holding the
list. A call that cannot be read or run is not an exception: :func:`run_tool_call` returns
the error text the model is shown (``Error: …``).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ROTATE_TOOL",
    "ZOOM_TOOL",
    "ToolCallResult",
    "last_tool_call",
    "parse_bbox",
    "run_tool_call",
    "zoom_box",
]

ZOOM_TOOL = "image_zoom_in_tool"
ROTATE_TOOL = "image_rotate_tool"
MIN_SIDE = 30  # a side must be longer than this (pixels)
MIN_LONG_SIDE = 56  # the longer side at least this
MAX_ASPECT = 100.0
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolCallResult:
    """One tool call on the image: the new image, or the error the model is shown."""

    image: Any | None  # a PIL image (the crop or the rotated image) when the call ran
    error: str = ""  # "Error: …" when it did not
    invalid_json: bool = False  # the call's text is not a JSON object

    @property
    def ok(self) -> bool:
        return self.image is not None


def last_tool_call(text: str) -> str | None:
    """The text inside the last ``<tool_call>…</tool_call>`` of ``text``, or None."""
    found = _TOOL_CALL.findall(text)
    return found[-1] if found else None


def parse_bbox(value: Any) -> tuple[float, float, float, float]:
    """``[x1, y1, x2, y2]`` as four floats; ``ValueError`` naming what is wrong."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"bbox {value!r} is not a list of 4 numbers") from err
    if not isinstance(value, (list, tuple)) or len(value) != 4:
        raise ValueError(f"bbox must be 4 numbers [x1, y1, x2, y2], got {value!r}")
    out = []
    for v in value:
        if isinstance(v, bool):
            raise ValueError(f"bbox value {v!r} is not a number")
        try:
            x = float(v)
        except (TypeError, ValueError) as err:
            raise ValueError(f"bbox value {v!r} is not a number") from err
        if not math.isfinite(x):
            raise ValueError(f"bbox value {v!r} is not finite")
        out.append(x)
    return out[0], out[1], out[2], out[3]


def zoom_box(
    bbox: tuple[float, float, float, float], width: int, height: int
) -> tuple[float, float, float, float] | None:
    """The box clamped to a ``width`` × ``height`` image, or None when it is refused
    (module doc: empty, thinner than 31 pixels, shorter than 56 on its long side, or more
    than 100 times longer than wide)."""
    x1, y1, x2, y2 = bbox
    x1, y1, x2, y2 = max(0.0, x1), max(0.0, y1), min(float(width), x2), min(float(height), y2)
    if not (x1 < x2 and y1 < y2):
        return None
    w, h = x2 - x1, y2 - y1
    short, long_ = min(w, h), max(w, h)
    if long_ / short > MAX_ASPECT or short <= MIN_SIDE or long_ < MIN_LONG_SIDE:
        return None
    return x1, y1, x2, y2


def _crop(image: Any, arguments: dict[str, Any]) -> Any:
    raw = arguments.get("bbox_2d", arguments.get("bbox"))
    if raw is None:
        raise ValueError(f"{ZOOM_TOOL} needs bbox_2d: [x1, y1, x2, y2]")
    box = zoom_box(parse_bbox(raw), image.width, image.height)
    if box is None:
        raise ValueError(
            f"bbox {raw} is outside the {image.width}x{image.height} image or too small "
            f"(each side over {MIN_SIDE} pixels, the longer at least {MIN_LONG_SIDE})"
        )
    return image.crop(tuple(round(v) for v in box))


def _rotate(image: Any, arguments: dict[str, Any]) -> Any:
    angle = arguments.get("angle")
    if isinstance(angle, bool) or not isinstance(angle, (int, float)):
        raise ValueError(f"{ROTATE_TOOL} needs a numeric angle, got {angle!r}")
    return image.rotate(angle)  # counter-clockwise, the canvas kept (PIL's, as ROLL's)


def run_tool_call(call_text: str, image: Any) -> ToolCallResult:
    """Run one tool call (the text inside ``<tool_call>``) on ``image`` (PIL)."""
    try:
        call = json.loads(call_text.strip())
    except json.JSONDecodeError as err:
        return ToolCallResult(
            None, f"Error: invalid tool call {call_text.strip()[:200]!r}: {err}", True
        )
    if not isinstance(call, dict):
        return ToolCallResult(None, "Error: a tool call is a JSON object", True)
    name, arguments = call.get("name"), call.get("arguments")
    if not isinstance(arguments, dict):
        return ToolCallResult(None, f"Error: tool call {name!r} has no arguments object")
    try:
        if name == ZOOM_TOOL:
            return ToolCallResult(_crop(image, arguments))
        if name == ROTATE_TOOL:
            return ToolCallResult(_rotate(image, arguments))
        raise ValueError(f"unknown tool {name!r} (use {ZOOM_TOOL} or {ROTATE_TOOL})")
    except ValueError as err:
        return ToolCallResult(None, f"Error: {err}")
