"""Bounding-box answers of detection tasks, as ROLL's ``DetectionRewardWorker`` reads them.

An answer is the text between the first ``<answer>`` and the next ``</answer>``
(stripped; none: ``""``), lower-cased, holding a list of boxes in the Qwen-VL grounding
style, single or double quoted::

    <answer>
    [{'bbox_2d': [x1, y1, x2, y2], 'label': 'shiba dog'}, ...]
    </answer>

Before it is read as JSON, as in ROLL: ``[[``/``]]`` become ``[``/``]`` (a list wrapped
twice), a list cut off mid-way (no closing ``]``) keeps the boxes before its last
``},``, single quotes become double quotes and backslashes are dropped. A box counts when
it is an object with a ``bbox_2d`` of four numbers with ``x1 ≤ x2`` and ``y1 ≤ y2`` and a
string ``label`` (other fields, e.g. ``confidence``, are ignored); a box at the same
coordinates as an earlier one is dropped. An answer with no such box is no answer
(``None``). Coordinates that are not finite (``1e999`` reads as infinity) are dropped
too: ROLL would score such a box NaN, which fails the sample.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, NamedTuple

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class Box(NamedTuple):
    """One box: corners ``(x1, y1, x2, y2)`` and its (lower-cased) label."""

    x1: float
    y1: float
    x2: float
    y2: float
    label: str


def answer_text(text: str) -> str:
    """The stripped content of the first ``<answer>…</answer>`` of ``text``, or ``""``."""
    found = _ANSWER.search(text)
    return found.group(1).strip() if found else ""


def _box(item: Any) -> Box | None:
    if not isinstance(item, dict) or not isinstance(item.get("label"), str):
        return None
    coords = item.get("bbox_2d")
    if not isinstance(coords, list) or len(coords) != 4:
        return None
    # bool is an int in Python, and ROLL's isinstance check accepts it the same way
    if not all(isinstance(c, (int, float)) and math.isfinite(c) for c in coords):
        return None
    x1, y1, x2, y2 = coords
    if x1 > x2 or y1 > y2:
        return None
    return Box(x1, y1, x2, y2, item["label"])


def parse_boxes(text: str) -> list[Box] | None:
    """The boxes of an answer's content (module doc), or ``None`` when it holds none."""
    if not text or not text.strip():
        return None
    text = text.replace("[[", "[").replace("]]", "]")
    if not text.endswith("]"):  # a generation cut off by the length limit
        text = text.rsplit("},", 1)[0] + "}]"
    text = text.replace("'", '"').replace("\\", "")
    try:
        items = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return None
    if not isinstance(items, list):
        return None
    boxes: list[Box] = []
    seen: set[tuple[float, ...]] = set()
    for item in items:
        box = _box(item)
        if box is not None and box[:4] not in seen:
            seen.add(box[:4])
            boxes.append(box)
    return boxes or None


def answer_boxes(text: str) -> list[Box] | None:
    """The boxes of the ``<answer>`` of a response or ground truth (lower-cased)."""
    return parse_boxes(answer_text(text.strip()).lower())


def format_ok(response: str) -> bool:
    """ROLL's format rule: the response has ``"\\n<answer>\\n"``, exactly one
    ``"\\n</answer>"``, and its answer holds at least one box."""
    if not response.count("\n<answer>\n") or response.count("\n</answer>") != 1:
        return False
    return answer_boxes(response) is not None


def rescale_to_thousand(boxes: list[Box], width: float, height: float) -> list[Box]:
    """Pixel boxes of a ``width × height`` image on the 0–1000 grid:
    ``x' = int(x / width · 1000)``, ``y' = int(y / height · 1000)`` (truncated, as ROLL)."""
    return [
        Box(
            int(b.x1 / width * 1000.0),
            int(b.y1 / height * 1000.0),
            int(b.x2 / width * 1000.0),
            int(b.y2 / height * 1000.0),
            b.label,
        )
        for b in boxes
    ]
