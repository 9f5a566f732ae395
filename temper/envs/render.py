"""Episode frames to disk (``render_save_dir``): text frames and PNG images.

PNG files are written with the standard library (``zlib`` + ``struct``), so no
imaging package is needed. Frames are what ``TextEnv.render`` returns: ``str``
(text mode) or a uint8 ``H×W×3`` array (``rgb_array`` mode).
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["render_tiles", "save_episode_render", "write_png"]


def render_tiles(
    grid: np.ndarray, colors: dict[int, tuple[int, int, int]], tile: int = 16
) -> np.ndarray:
    """A uint8 RGB image, one ``tile``×``tile`` square per cell, with a 1-pixel grid line."""
    img = np.zeros((grid.shape[0] * tile, grid.shape[1] * tile, 3), dtype=np.uint8)
    for (r, c), v in np.ndenumerate(grid):
        img[r * tile : (r + 1) * tile - 1, c * tile : (c + 1) * tile - 1] = colors[int(v)]
    return img


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def write_png(path: str | Path, image: np.ndarray) -> Path:
    """Write a uint8 ``H×W×3`` (or ``H×W`` grey) array as an 8-bit PNG."""
    img = np.asarray(image)
    if img.ndim == 2:
        img = np.repeat(img[:, :, None], 3, axis=2)
    if img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"expected an H×W×3 image, got shape {img.shape}")
    img = np.ascontiguousarray(img.astype(np.uint8))
    h, w = img.shape[:2]
    raw = b"".join(b"\x00" + img[r].tobytes() for r in range(h))  # filter 0 per row
    png = (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
        + _chunk(b"IDAT", zlib.compress(raw, 6))
        + _chunk(b"IEND", b"")
    )
    path = Path(path)
    path.write_bytes(png)
    return path


def save_episode_render(
    frames: Sequence[str | np.ndarray], out_dir: str | Path, name: str
) -> list[Path]:
    """Save an episode's frames under ``out_dir``; return the files written.

    Text frames go to ``<name>.txt`` (one block per frame, headed ``--- frame k ---``);
    image frames to ``<name>_<k:03d>.png``; text and images are numbered separately (k-th
    text frame and k-th image show the same moment when both are recorded each time).
    ``name`` is made file-safe.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name) or "episode"
    written: list[Path] = []
    texts = [f for f in frames if isinstance(f, str)]
    images = [f for f in frames if not isinstance(f, str)]
    if texts:
        path = out / f"{safe}.txt"
        path.write_text(
            "".join(f"--- frame {k} ---\n{f}\n" for k, f in enumerate(texts)), encoding="utf-8"
        )
        written.append(path)
    for k, f in enumerate(images):
        written.append(write_png(out / f"{safe}_{k:03d}.png", f))
    return written
