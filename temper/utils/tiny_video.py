"""Small synthetic video files, written with PyAV: the video counterpart of the tiny
models, for tests and demos that need a real file to decode (no network, no samples).

    python -m temper.utils.tiny_video OUT.mp4 --frames 8 --fps 4
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def write_video(
    path: str | Path,
    colors: Sequence[tuple[int, int, int]],
    *,
    fps: int = 4,
    size: tuple[int, int] = (32, 32),
    codec: str = "mpeg4",
) -> Path:
    """An MPEG-4 file with one frame per entry of ``colors``, each filled with that RGB
    colour, at ``fps`` frames per second; ``size`` is ``(height, width)`` (even: the
    codec stores 4:2:0 chroma)."""
    import av

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    height, width = size
    with av.open(str(out), "w") as container:
        stream = container.add_stream(codec, rate=fps)
        assert isinstance(stream, av.VideoStream)  # a video codec makes a video stream
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for rgb in colors:
            pixels = np.empty((height, width, 3), np.uint8)
            pixels[...] = np.asarray(rgb, np.uint8)
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():  # flush the encoder's delayed frames
            container.mux(packet)
    return out


def ramp(frames: int) -> list[tuple[int, int, int]]:
    """``frames`` grey levels from black towards white: frame ``i`` is easy to identify
    after decoding (its level is ``i · 255 // frames``)."""
    return [(i * 255 // frames,) * 3 for i in range(frames)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--fps", type=int, default=4)
    args = parser.parse_args()
    print(write_video(args.out, ramp(args.frames), fps=args.fps))


if __name__ == "__main__":
    main()
