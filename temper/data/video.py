"""Videos in prompt data: which frames a prompt takes, at what size, and their pixels.

The conventions are qwen-vl-utils' ``fetch_video``, which verl (``data.video_key``) and
ROLL (``video_*`` data arguments) both call:

- a row's ``data.video_key`` column (``videos``) holds a list of videos; each is a file
  path, a list of frames (each an image as ``data.image_key`` takes them), or a dict
  ``{"video": path-or-frames, ...}`` whose ``fps`` / ``min_frames`` / ``max_frames`` /
  ``nframes`` / ``min_pixels`` / ``max_pixels`` / ``total_pixels`` / ``sample_fps``
  override the config's for that video. Relative paths start at ``data.video_folder``
  (ROLL ``video_folder``), else at the data file's directory.
- A file is decoded with PyAV (``av``). Of its ``N`` frames at ``r`` frames per second,
  ``n = N / r · fps`` are taken (:func:`num_frames`: at least ``min_frames``, at most
  ``max_frames`` and ``N``, rounded down to an even count because the model embeds two
  frames per temporal patch), spread evenly over the clip (:func:`frame_indices`).
- A list of frames is taken whole, as qwen-vl-utils takes it (an odd count repeats the
  last frame), except that a list longer than ``max_frames`` is thinned evenly to that
  many: a frame list is a video already sampled, and the cap bounds the prompt as it
  does for files.
- Every frame of a video is resized to one size (:func:`frame_pixel_bounds`): the area
  within ``[min_pixels, max_pixels]``, and no more than ``total_pixels / n · 2`` so that
  the whole video stays within ``total_pixels``.

A video becomes ``n / 2 · (h / f) · (w / f)`` placeholder tokens (``f`` = patch ×
merge size) and, for the model, ``pixel_values_videos`` in the layout of transformers'
Qwen2-VL video processor (:func:`video_patches`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from temper.data.errors import RowProblem

#: Frames per temporal patch of the Qwen2-VL family: counts are rounded to it.
FRAME_FACTOR = 2
#: qwen-vl-utils' defaults, which verl's data loader inherits.
DEFAULT_FPS = 2.0
DEFAULT_MIN_FRAMES = 4
DEFAULT_MAX_FRAMES = 768
#: Per-frame token bounds of qwen-vl-utils (tokens = pixels / factor²).
MIN_FRAME_TOKENS = 128
MAX_FRAME_TOKENS = 768
#: qwen-vl-utils bounds a whole video by 90% of a 128k-token context by default.
DEFAULT_TOTAL_TOKENS = 0.9 * 128000

#: Keys of a video dict that set how it is sampled and sized (see the module doc).
VIDEO_DICT_KEYS = (
    "video",
    "type",
    "fps",
    "min_frames",
    "max_frames",
    "nframes",
    "min_pixels",
    "max_pixels",
    "total_pixels",
    "sample_fps",
)


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How one video is sampled and sized (the config's values, or the row's)."""

    fps: float = DEFAULT_FPS
    min_frames: int = DEFAULT_MIN_FRAMES
    max_frames: int = DEFAULT_MAX_FRAMES
    nframes: int | None = None  # a fixed frame count instead of fps
    min_pixels: int | None = None
    max_pixels: int | None = None
    total_pixels: float | None = None
    sample_fps: float | None = None  # frames per second of a frame list


@dataclasses.dataclass(frozen=True)
class VideoInput:
    """One video of a prompt: where its frames come from, which, and their size."""

    source: str | tuple[bytes, ...]  # a video file, or the encoded images of a frame list
    indices: tuple[int, ...]  # frames taken, in order (even count; may repeat the last)
    height: int  # every frame resized to this (a multiple of the model's factor)
    width: int
    fps: float  # frames per second of the taken frames (time between temporal patches)
    tokens: int  # video tokens in the prompt: len(indices) / 2 · (height / f) · (width / f)
    times: tuple[float, ...] = ()  # second of the source at which each taken frame is

    def patch_times(self, temporal_patch_size: int) -> list[float]:
        """The time of each temporal patch: the mean of its first and last frame's (as
        Qwen3-VL's processor writes them before each patch's tokens)."""
        times = list(self.times)
        return [
            (times[i] + times[min(i + temporal_patch_size, len(times)) - 1]) / 2
            for i in range(0, len(times), temporal_patch_size)
        ]


# --------------------------------------------------------------------------- sampling


def _floor_by(x: float, factor: int) -> int:
    return math.floor(x / factor) * factor


def _ceil_by(x: float, factor: int) -> int:
    return math.ceil(x / factor) * factor


def num_frames(total: int, video_fps: float, sampling: Sampling) -> int:
    """Frames taken of a video of ``total`` frames at ``video_fps`` (qwen-vl-utils'
    ``smart_nframes``).

    ``nframes`` given: that, rounded to an even count. Else ``n = total / video_fps · fps``
    clamped to ``[ceil2(min_frames), floor2(min(max_frames, total))]`` and to ``total``,
    then rounded down to an even count. Raises ``ValueError`` when that leaves fewer than
    2 frames or more than the video has.
    """
    if sampling.nframes is not None:
        n = round(sampling.nframes / FRAME_FACTOR) * FRAME_FACTOR
    else:
        if video_fps <= 0:
            raise ValueError("the video has no frame rate")
        low = _ceil_by(sampling.min_frames, FRAME_FACTOR)
        high = _floor_by(min(sampling.max_frames, total), FRAME_FACTOR)
        wanted = total / video_fps * sampling.fps
        n = _floor_by(min(min(max(wanted, low), high), total), FRAME_FACTOR)
    if not FRAME_FACTOR <= n <= total:
        raise ValueError(
            f"{n} frames taken of a video of {total}; a video needs at least {FRAME_FACTOR}"
        )
    return n


def frame_indices(total: int, n: int) -> list[int]:
    """``n`` frame positions spread evenly from the first to the last of ``total``:
    ``round(linspace(0, total - 1, n))`` (torch's rounding, as qwen-vl-utils)."""
    return [int(i) for i in torch.linspace(0, total - 1, n).round().long().tolist()]


def frame_list_indices(count: int, max_frames: int) -> list[int]:
    """Frames taken of a list of ``count`` frames: all, thinned evenly to
    ``floor2(max_frames)`` if longer, and an odd count completed by repeating the last."""
    cap = max(FRAME_FACTOR, _floor_by(max_frames, FRAME_FACTOR))
    indices = frame_indices(count, cap) if count > cap else list(range(count))
    if len(indices) % FRAME_FACTOR:
        indices.append(indices[-1])
    return indices


def frame_pixel_bounds(n: int, factor: int, sampling: Sampling) -> tuple[int, float]:
    """``(min_pixels, max_pixels)`` of each of a video's ``n`` frames (qwen-vl-utils).

    ``min = min_pixels or 128·f²``; ``max = max(min(768·f², total / n · 2), ⌊1.05·min⌋)``
    with ``total = total_pixels or 0.9·128000·f²``, then at most ``max_pixels``.
    """
    low = sampling.min_pixels if sampling.min_pixels is not None else MIN_FRAME_TOKENS * factor**2
    total = (
        sampling.total_pixels
        if sampling.total_pixels is not None
        else DEFAULT_TOTAL_TOKENS * factor**2
    )
    high: float = max(min(MAX_FRAME_TOKENS * factor**2, total / n * FRAME_FACTOR), int(low * 1.05))
    if sampling.max_pixels is not None:
        high = min(sampling.max_pixels, high)
    return low, high


# --------------------------------------------------------------------------- decoding


@dataclasses.dataclass(frozen=True)
class VideoFile:
    """What a video file holds: its frame count, rate and frame size."""

    frames: int
    fps: float
    height: int
    width: int


def probe(path: Path) -> VideoFile:
    """Frame count, rate and size of a video file; its first frame is decoded, so a file
    that cannot be decoded fails here (raises ``RowProblem``)."""
    import av

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise RowProblem(f"{path} has no video stream")
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate
            frames = int(stream.frames or 0)
            first = next(container.decode(stream), None)
            if first is None:
                raise RowProblem(f"{path} has no decodable frame")
            height, width = int(first.height), int(first.width)
            if frames <= 0:  # the container does not record it: count the packets
                container.seek(0)
                frames = 1 + sum(1 for p in container.demux(stream) if p.size)
    except RowProblem:
        raise
    except Exception as err:  # PyAV raises FFmpegError subclasses and OSError
        raise RowProblem(
            f"{path} cannot be decoded ({type(err).__name__}: {' '.join(str(err).split())[:160]})"
        ) from err
    return VideoFile(frames, float(rate) if rate else 0.0, height, width)


def decode_frames(path: str, indices: Sequence[int]) -> list[Any]:
    """The RGB PIL images of frames ``indices`` of a video file, in that order. A frame
    past the last one decoded (a container that overstates its length) is the last."""
    import av

    wanted = set(indices)
    last = max(indices)
    got: dict[int, Any] = {}
    with av.open(path) as container:
        for i, frame in enumerate(container.decode(container.streams.video[0])):
            if i in wanted:
                got[i] = frame.to_image().convert("RGB")
            if i >= last:
                break
    if not got:
        raise RowProblem(f"{path}: no frame could be decoded")
    top = max(got)
    return [got[i] if i in got else got[top] for i in indices]


# --------------------------------------------------------------------------- model inputs


def video_patches(
    frames: Sequence[Any],
    *,
    patch_size: int,
    merge_size: int,
    temporal_patch_size: int,
    rescale_factor: float,
    mean: Sequence[float],
    std: Sequence[float],
) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """``(pixel_values_videos, (t, h, w))`` of one video's frames, all of one size.

    Pixels are rescaled and normalized per channel, ``(x · rescale - mean) / std``, as
    the image processor does; frames are grouped ``temporal_patch_size`` at a time (the
    last repeated to fill a group) and each group cut into ``patch_size``² patches
    ordered merge window by merge window: shape ``(t·h·w, C·T·P·P)`` with
    ``t = frames / T``, ``h = height / P``, ``w = width / P`` — the layout of
    transformers' Qwen2-VL video processor.
    """
    pixels = np.stack([np.asarray(f, dtype=np.float32) for f in frames])  # (N, H, W, C)
    scaled = pixels * np.float32(rescale_factor)
    normed = (scaled - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    video = normed.astype(np.float32).transpose(0, 3, 1, 2)  # (N, C, H, W)
    if pad := -len(video) % temporal_patch_size:
        video = np.concatenate([video, np.repeat(video[-1:], pad, axis=0)])
    n, channels, height, width = video.shape
    t, h, w = n // temporal_patch_size, height // patch_size, width // patch_size
    patches = video.reshape(
        t,
        temporal_patch_size,
        channels,
        h // merge_size,
        merge_size,
        patch_size,
        w // merge_size,
        merge_size,
        patch_size,
    ).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    flat = patches.reshape(t * h * w, channels * temporal_patch_size * patch_size**2)
    return torch.from_numpy(np.ascontiguousarray(flat)), (t, h, w)
