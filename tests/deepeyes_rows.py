"""A small hand-made DeepEyes parquet file: rows in the dataset's format (chat prompt with
``<image>``, ``images`` as ``{"bytes"}``, ``reward_model.ground_truth``,
``extra_info.question``), each image a coloured square on a grey canvas, plus two broken
rows (no image, no ground truth) that the env must skip and report."""

from __future__ import annotations

import io
from pathlib import Path

SYSTEM = (
    "You answer questions about an image. You may look closer with one tool:\n"
    '{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [x1, y1, x2, y2], "label": '
    '"what is there"}} crops the image to the box (pixels of the original image).\n'
    "Call it as <tool_call>{json}</tool_call>."
)
SUFFIX = (
    "\nThink first, zoom in if needed, then answer. Format: <think>...</think> "
    "<tool_call>...</tool_call> (if needed) <answer>...</answer>"
)
COLOURS = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 180, 30)}


def square_png(colour: tuple[int, int, int], size: tuple[int, int] = (112, 84)) -> bytes:
    """A grey ``size`` (width, height) canvas with a coloured square in its top-left
    quarter, PNG-encoded."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", size, (128, 128, 128))
    ImageDraw.Draw(img).rectangle([8, 8, 48, 48], fill=colour)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def row(i: int, name: str, *, image: bool = True, truth: bool = True) -> dict:
    question = "What colour is the square?"
    return {
        "data_source": "toy_squares",
        "prompt": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"<image>\n{question}{SUFFIX}"},
        ],
        "images": [{"bytes": square_png(COLOURS[name]), "path": None}] if image else [],
        "reward_model": {"ground_truth": name if truth else None, "style": "model"},
        "extra_info": {"question": question, "answer": name, "index": i, "split": "train"},
        "env_name": "visual_toolbox_v2",
    }


def write_rows(path: Path, n: int = 6, broken: bool = True) -> Path:
    """``n`` good rows (colours in turn) and, with ``broken``, a row without an image
    (row ``n``) and one without a ground truth (row ``n + 1``)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = list(COLOURS)
    rows = [row(i, names[i % len(names)]) for i in range(n)]
    if broken:
        rows += [row(n, "red", image=False), row(n + 1, "blue", truth=False)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
