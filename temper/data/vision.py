"""Images and videos in prompt data, and the inputs a vision-language model takes for them.

The data convention is verl's (geometry3k's preprocessing writes it; ROLL's VL pipeline
reads the same columns):

- ``data.image_key`` (``images``) holds a list of images per row: encoded bytes, a path,
  or a dict ``{"bytes": ..., "path": ...}`` / ``{"image": ...}`` (a dict may also carry
  ``min_pixels`` / ``max_pixels`` for that image, as ``qwen_vl_utils`` reads them).
  Relative paths start at ``data.image_folder`` (ROLL ``image_folder``), else at the
  directory of the data file.
- Each ``<image>`` in the prompt's messages marks where the next image goes: the message
  becomes a content list (``[{"type": "image"}, {"type": "text", "text": ...}]``) that the
  model's chat template renders as its image placeholder (Qwen2-VL:
  ``<|vision_start|><|image_pad|><|vision_end|>``). The number of ``<image>`` marks must
  equal the number of images.
- Every image is resized once, here, to the model's grid: both sides multiples of
  ``patch_size × merge_size`` and the area within ``[image_min_pixels, image_max_pixels]``
  (:func:`smart_resize`); then each image placeholder is expanded to that image's number
  of tokens, ``(h / factor) · (w / factor)``, so prompt lengths (and the length limit)
  count the tokens the model really sees.
- Videos (``data.video_key``, ``videos``) go where the prompt says ``<video>``, the same
  way: the content part ``{"type": "video"}`` renders as the video placeholder
  (``<|vision_start|><|video_pad|><|vision_end|>``), expanded to the video's tokens.
  Which frames, and at what size, is :mod:`temper.data.video`'s.
- A row whose image or video is missing or undecodable, whose placeholders do not match
  its images and videos, or that has audio (``data.audio_key``; not supported) is
  reported like any malformed row (``file:row N: reason``) and skipped, or fails the
  load with ``data.bad_rows=error``.

Model inputs are built from the processor's parts — the image processor, the tokenizer
and the chat template — exactly as the model's ``AutoProcessor`` builds them (it replaces
each image token by that many copies and runs the image processor). The parts are used
even where the full processor can be built: it cannot be here, because transformers'
Qwen2-VL processor requires its video processor, which requires torchvision, and PyPI's
torchvision does not work with the CPU build of torch. The equivalence of the two is a
test (``tests/unit/data/test_vision_processor.py``) that runs where torchvision exists.

Per prompt, collation adds two object columns (verl's names), shared by reference by the
``n`` responses of the prompt:

- ``multi_modal_data``: ``{"image": [PIL images, resized]}`` (and ``"video"``: per video
  its list of frames, resized) — what vLLM takes;
- ``multi_modal_inputs``: ``{"pixel_values": (patches, C·T·P·P), "image_grid_thw": (k, 3)}``
  and, for videos, ``pixel_values_videos`` / ``video_grid_thw`` (plus
  ``second_per_grid_ts``, the seconds per temporal patch, for models whose M-RoPE
  advances with time: Qwen2.5-VL) — what the model's forward takes (HF generate, the
  trainer's forwards).
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from temper.config.schema import DataConfig
from temper.data.errors import DataError, RowProblem
from temper.data.prompts import MISSING, get_path
from temper.data.video import (
    VIDEO_DICT_KEYS,
    Sampling,
    VideoInput,
    decode_frames,
    frame_indices,
    frame_list_indices,
    frame_pixel_bounds,
    num_frames,
    probe,
    video_patches,
)

log = logging.getLogger("temper.data")

IMAGE_PLACEHOLDER = "<image>"
VIDEO_PLACEHOLDER = "<video>"
MULTI_MODAL_DATA = "multi_modal_data"
MULTI_MODAL_INPUTS = "multi_modal_inputs"
MAX_ASPECT_RATIO = 200

_PLACEHOLDERS = re.compile(f"({re.escape(IMAGE_PLACEHOLDER)}|{re.escape(VIDEO_PLACEHOLDER)})")
#: The content part each placeholder becomes.
_PART = {IMAGE_PLACEHOLDER: "image", VIDEO_PLACEHOLDER: "video"}


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """Qwen2-VL's resize rule: the size closest to ``(height, width)`` on the model's grid.

    ``h' = round(h / f)·f`` and ``w' = round(w / f)·f``; if ``h'·w' > max_pixels`` both sides
    shrink by ``β = sqrt(h·w / max_pixels)`` (``h' = max(f, ⌊h / β / f⌋·f)``), if it is below
    ``min_pixels`` they grow by ``β = sqrt(min_pixels / (h·w))`` (``h' = ⌈h·β / f⌉·f``).
    The aspect ratio is kept as well as the grid allows. Raises ``ValueError`` for an
    aspect ratio above 200 (the model's processors refuse those too).
    """
    if min(height, width) < 1:
        raise ValueError(f"image of size {width}×{height} has no pixels")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(
            f"aspect ratio {max(height, width) / min(height, width):.0f} is above "
            f"{MAX_ASPECT_RATIO}, which the model's image processor refuses"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


@dataclasses.dataclass(frozen=True)
class ImageInput:
    """One image of a prompt: its encoded file and the size it is resized to."""

    data: bytes
    height: int  # after resizing (a multiple of the model's factor)
    width: int
    tokens: int  # image tokens in the prompt: (height / factor) · (width / factor)


# --------------------------------------------------------------------------- reading images


def _encode(image: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def image_bytes(value: Any, base_dir: Path, where: str) -> bytes:
    """The encoded image file of one entry of the image column."""
    from PIL import Image

    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, Image.Image):  # a datasets directory decodes Image features
        return _encode(value)
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            return image_bytes(value["bytes"], base_dir, where)
        inner = value.get("image", value.get("path"))
        if inner is None:
            raise RowProblem(f"{where} has neither bytes, path nor image")
        return image_bytes(inner, base_dir, where)
    if isinstance(value, str):
        text = value.removeprefix("file://")
        if text.startswith(("http://", "https://")):
            raise RowProblem(f"{where} is a URL ({text[:60]}); images must be local files")
        path = Path(os.path.expanduser(text))
        if not path.is_absolute():
            path = base_dir / path
        try:
            return path.read_bytes()
        except OSError as err:
            raise RowProblem(f"{where}: cannot read {path}: {err.strerror or err}") from err
    raise RowProblem(f"{where} must be bytes, a path or a dict, got {type(value).__name__}")


def _pixel_limit(value: Any, key: str, default: int, where: str) -> int:
    if not isinstance(value, dict) or value.get(key) is None:
        return default
    try:
        return int(value[key])
    except (TypeError, ValueError) as err:
        raise RowProblem(f"{where}: {key} must be an integer, got {value[key]!r}") from err


def decode(data: bytes) -> Any:
    """The RGB PIL image of an encoded image file (raises on broken data)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        img.load()
        return img.convert("RGB")


# --------------------------------------------------------------------------- the processor


def is_vision_config(config: Any) -> bool:
    """True for a Hugging Face config of a vision-language model (it has a vision tower)."""
    return getattr(config, "vision_config", None) is not None


def vision_token_ids(config: Any) -> tuple[int | None, int | None]:
    """``(image_token_id, video_token_id)`` of a vision-language model's config."""
    image = getattr(config, "image_token_id", None)
    video = getattr(config, "video_token_id", None)
    return (None if image is None else int(image), None if video is None else int(video))


def _template_from_files(path: str) -> str | None:
    """A processor's chat template saved beside the model (chat_template.json / .jinja)."""
    root = Path(path)
    if (root / "chat_template.jinja").is_file():
        return (root / "chat_template.jinja").read_text(encoding="utf-8")
    if (root / "chat_template.json").is_file():
        data = json.loads((root / "chat_template.json").read_text(encoding="utf-8"))
        template = data.get("chat_template") if isinstance(data, dict) else None
        return template if isinstance(template, str) else None
    return None


class VisionProcessor:
    """Turns prompts with images and videos into a vision-language model's inputs
    (module doc)."""

    def __init__(
        self,
        tokenizer: Any,
        image_processor: Any,
        *,
        min_pixels: int | None = None,
        max_pixels: int | None = None,
        image_folder: str | None = None,
        timed_video: bool = False,
        timestamped_video: bool = False,
    ) -> None:
        for attr in ("patch_size", "merge_size", "temporal_patch_size"):
            if getattr(image_processor, attr, None) is None:
                raise DataError(
                    "model.path",
                    f"the model's image processor ({type(image_processor).__name__}) has no "
                    f"{attr}: temper's vision-language support covers the Qwen2-VL family "
                    "(Qwen2-VL, Qwen2.5-VL, Qwen3-VL image processors)",
                    "use a Qwen2-VL-family model",
                )
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.patch_size = int(image_processor.patch_size)
        self.merge_size = int(image_processor.merge_size)
        self.temporal_patch_size = int(image_processor.temporal_patch_size)
        self.factor = self.patch_size * self.merge_size
        # Qwen2.5-VL's M-RoPE advances video tokens by seconds (second_per_grid_ts)
        self.timed_video = timed_video
        # Qwen3-VL writes a timestamp before each frame pair of a video (its processor)
        self.timestamped_video = timestamped_video
        size = dict(image_processor.size or {})
        self.min_pixels = int(min_pixels or size.get("shortest_edge") or 4 * self.factor**2)
        self.max_pixels = int(max_pixels or size.get("longest_edge") or 16384 * self.factor**2)
        if self.min_pixels > self.max_pixels:
            raise DataError(
                "data.image_min_pixels",
                f"{self.min_pixels} is above the maximum of {self.max_pixels} pixels",
                "set data.image_min_pixels ≤ data.image_max_pixels",
            )
        # The processor's own resize sees images already on the grid and within these
        # limits, so it leaves them as they are (same pixels in HF and vLLM).
        image_processor.size = {"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels}
        self.image_folder = image_folder
        self.image_token = getattr(tokenizer, "image_token", None) or "<|image_pad|>"
        self.image_token_id = int(tokenizer.convert_tokens_to_ids(self.image_token))
        self.video_token = getattr(tokenizer, "video_token", None) or "<|video_pad|>"
        vocab = tokenizer.get_vocab()
        self.vision_start = "<|vision_start|>" if "<|vision_start|>" in vocab else ""
        self.vision_end = "<|vision_end|>" if "<|vision_end|>" in vocab else ""
        if self.image_token not in vocab:
            raise DataError(
                "model.tokenizer_path",
                f"the tokenizer has no image token {self.image_token!r}",
                "use the vision-language model's own tokenizer",
            )
        self.has_video_token = self.video_token in vocab

    # ----------------------------------------------------------------- images of a row

    def read_images(
        self, row: dict[str, Any], cfg: DataConfig, data_file: str
    ) -> tuple[ImageInput, ...]:
        """The images of ``row`` (column ``data.image_key``), decoded and sized."""
        value = get_path(row, cfg.image_key)
        if value is None or value is MISSING:
            return ()
        if not isinstance(value, (list, tuple)):
            value = [value]
        base_dir = _base_dir(self.image_folder, data_file)
        images = []
        for i, item in enumerate(value):
            where = f"image {i} of column '{cfg.image_key}'"
            data = image_bytes(item, base_dir, where)
            img = _decoded(data, where)
            low = _pixel_limit(item, "min_pixels", self.min_pixels, where)
            high = _pixel_limit(item, "max_pixels", self.max_pixels, where)
            try:
                h, w = smart_resize(img.height, img.width, self.factor, low, high)
            except ValueError as err:
                raise RowProblem(f"{where}: {err}") from err
            tokens = (h // self.factor) * (w // self.factor)
            images.append(ImageInput(data, h, w, tokens))
        return tuple(images)

    # ----------------------------------------------------------------- videos of a row

    def read_videos(
        self, row: dict[str, Any], cfg: DataConfig, data_file: str
    ) -> tuple[VideoInput, ...]:
        """The videos of ``row`` (column ``data.video_key``): frames chosen and sized
        (:mod:`temper.data.video`); a file's first frame is decoded here, so a missing
        or undecodable video is this row's problem, not a later step's."""
        value = get_path(row, cfg.video_key)
        if value is None or value is MISSING:
            return ()
        if not isinstance(value, (list, tuple)):
            value = [value]
        if value and not self.has_video_token:
            raise RowProblem(
                f"column '{cfg.video_key}' holds videos, but the tokenizer has no video token "
                f"{self.video_token!r}"
            )
        base_dir = _base_dir(cfg.video_folder, data_file)
        return tuple(
            self._read_video(item, _sampling(item, cfg, f"video {i}"), base_dir, f"video {i}")
            for i, item in enumerate(value)
        )

    def _read_video(self, item: Any, sampling: Sampling, base_dir: Path, where: str) -> VideoInput:
        inner = item.get("video") if isinstance(item, dict) else item
        if isinstance(inner, (list, tuple)):  # a list of frames
            if not inner:
                raise RowProblem(f"{where} is an empty list of frames")
            indices = frame_list_indices(len(inner), sampling.max_frames)
            used = sorted(set(indices))
            data = {j: image_bytes(inner[j], base_dir, f"frame {j} of {where}") for j in used}
            first = _decoded(data[used[0]], f"frame {used[0]} of {where}")
            for j in used[1:]:
                _decoded(data[j], f"frame {j} of {where}")
            # the list's own positions become 0..k-1 of the kept frames
            position = {j: k for k, j in enumerate(used)}
            source: str | tuple[bytes, ...] = tuple(data[j] for j in used)
            taken = tuple(position[j] for j in indices)
            fps = sampling.sample_fps or sampling.fps
            times = tuple(j / fps for j in indices)
            height, width = first.height, first.width
        elif isinstance(inner, str):
            path = _local_path(inner, base_dir, where)
            if not path.is_file():
                raise RowProblem(f"{where}: no video file at {path}")
            try:
                info = probe(path)
            except RowProblem as err:
                raise RowProblem(f"{where}: {err}") from err
            try:
                n = num_frames(info.frames, info.fps, sampling)
            except ValueError as err:
                raise RowProblem(f"{where} ({path.name}): {err}") from err
            taken = tuple(frame_indices(info.frames, n))
            fps = n / info.frames * info.fps if info.fps > 0 else sampling.fps
            rate = info.fps if info.fps > 0 else fps
            times = tuple(i / rate for i in taken)
            source, height, width = str(path), info.height, info.width
        else:
            raise RowProblem(
                f"{where} must be a path, a list of frames or a dict with 'video', "
                f"got {type(inner).__name__}"
            )
        low, high = frame_pixel_bounds(len(taken), self.factor, sampling)
        try:
            h, w = smart_resize(height, width, self.factor, low, int(high))
        except ValueError as err:
            raise RowProblem(f"{where}: {err}") from err
        tokens = len(taken) // self.temporal_patch_size * (h // self.factor) * (w // self.factor)
        return VideoInput(source, taken, h, w, fps, tokens, times)

    # ----------------------------------------------------------------- prompt text

    def split_messages(
        self, messages: list[dict[str, Any]], num_images: int, num_videos: int = 0
    ) -> list[dict[str, Any]]:
        """``<image>`` / ``<video>`` marks → content parts; their counts must equal
        ``num_images`` and ``num_videos``."""
        out: list[dict[str, Any]] = []
        seen = {IMAGE_PLACEHOLDER: 0, VIDEO_PLACEHOLDER: 0}
        for msg in messages:
            content = msg["content"]
            if not _PLACEHOLDERS.search(content):
                out.append(dict(msg))
                continue
            parts: list[dict[str, Any]] = []
            for piece in _PLACEHOLDERS.split(content):
                if piece in _PART:
                    parts.append({"type": _PART[piece]})
                    seen[piece] += 1
                elif piece:
                    parts.append({"type": "text", "text": piece})
            out.append({**msg, "content": parts})
        for mark, count, what in (
            (IMAGE_PLACEHOLDER, num_images, "image"),
            (VIDEO_PLACEHOLDER, num_videos, "video"),
        ):
            if seen[mark] != count:
                raise RowProblem(
                    f"the prompt has {seen[mark]} {mark} mark(s) for {count} {what}(s); "
                    f"put one {mark} where each {what} goes"
                )
        return out

    def render(
        self,
        messages: list[dict[str, Any]],
        images: Sequence[ImageInput],
        cfg: DataConfig,
        videos: Sequence[VideoInput] = (),
    ) -> str:
        """The prompt text with every image and video placeholder expanded to its tokens.

        ``messages`` hold ``<image>`` / ``<video>`` marks (system prompt already added).
        Chat templates (native or a Jinja string) render content parts; ``raw`` puts the
        placeholder sequence where the mark is.
        """
        if cfg.chat_template == "raw":
            text = "\n\n".join(m["content"] for m in messages)
            for mark, token, count in (
                (IMAGE_PLACEHOLDER, self.image_token, len(images)),
                (VIDEO_PLACEHOLDER, self.video_token, len(videos)),
            ):
                text = text.replace(mark, f"{self.vision_start}{token}{self.vision_end}")
                if text.count(token) != count:
                    raise RowProblem(
                        f"the prompt has {text.count(token)} {mark} marks for {count} "
                        f"{mark.strip('<>')}(s)"
                    )
        else:
            kwargs: dict[str, Any] = dict(cfg.apply_chat_template_kwargs or {})
            kwargs.update(tokenize=False, add_generation_prompt=True)
            if cfg.chat_template != "native":
                kwargs["chat_template"] = cfg.chat_template
            parts = self.split_messages(messages, len(images), len(videos))
            text = self.tokenizer.apply_chat_template(parts, **kwargs)
        text = self.expand(text, [img.tokens for img in images])
        videos_text = [self.video_text(v) for v in videos]
        return _replace_each(text, self.video_token, videos_text, "video")

    def expand(self, text: str, counts: Sequence[int]) -> str:
        """Each image token of ``text`` repeated as many times as its image has tokens."""
        return _replace_each(
            text, self.image_token, [self.image_token * n for n in counts], "image"
        )

    def video_text(self, video: VideoInput) -> str:
        """What a video's placeholder token becomes: its tokens; for a timestamped model
        (Qwen3-VL), per temporal patch ``<t seconds>`` and that patch's tokens between
        vision start and end marks (its processor's ``replace_video_token``)."""
        if not self.timestamped_video:
            return self.video_token * video.tokens
        groups = len(video.indices) // self.temporal_patch_size
        per_group = video.tokens // groups
        return "".join(
            f"<{t:.1f} seconds>{self.vision_start}{self.video_token * per_group}{self.vision_end}"
            for t in video.patch_times(self.temporal_patch_size)
        )

    # ----------------------------------------------------------------- model inputs

    def model_inputs(
        self, images: Sequence[ImageInput], videos: Sequence[VideoInput] = ()
    ) -> tuple[dict[str, list[Any]], dict[str, torch.Tensor]]:
        """``(multi_modal_data, multi_modal_inputs)`` of one prompt's images and videos
        (module doc)."""
        data: dict[str, list[Any]] = {}
        inputs: dict[str, torch.Tensor] = {}
        if images:
            pil = [decode(img.data).resize((img.width, img.height), resample=3) for img in images]
            out = self.image_processor(images=pil, return_tensors="pt")
            inputs["pixel_values"] = out["pixel_values"]
            inputs["image_grid_thw"] = out["image_grid_thw"].to(torch.long)
            tokens = (inputs["image_grid_thw"].prod(dim=1) // self.merge_size**2).tolist()
            if tokens != [img.tokens for img in images]:  # the processor resized again
                raise RuntimeError(
                    f"image processor made {tokens} tokens of images sized for "
                    f"{[img.tokens for img in images]}; its resize rule differs from temper's"
                )
            data["image"] = pil
        if videos:
            frames = [self.video_frames(v) for v in videos]
            patches, grids = [], []
            for video in frames:
                values, grid = video_patches(
                    video,
                    patch_size=self.patch_size,
                    merge_size=self.merge_size,
                    temporal_patch_size=self.temporal_patch_size,
                    rescale_factor=float(self.image_processor.rescale_factor),
                    mean=self.image_processor.image_mean,
                    std=self.image_processor.image_std,
                )
                patches.append(values)
                grids.append(grid)
            inputs["pixel_values_videos"] = torch.cat(patches)
            inputs["video_grid_thw"] = torch.tensor(grids, dtype=torch.long)
            if self.timed_video:
                inputs["second_per_grid_ts"] = torch.tensor(
                    [self.temporal_patch_size / v.fps for v in videos], dtype=torch.float32
                )
            data["video"] = frames
        return data, inputs

    def video_frames(self, video: VideoInput) -> list[Any]:
        """The taken frames of ``video`` as RGB PIL images of its size."""
        if isinstance(video.source, str):
            frames = decode_frames(video.source, video.indices)
        else:
            frames = [decode(video.source[i]) for i in video.indices]
        return [f.resize((video.width, video.height), resample=3) for f in frames]


def load_vision_processor(
    model_path: str,
    tokenizer: Any,
    cfg: DataConfig,
    *,
    trust_remote_code: bool = False,
) -> VisionProcessor | None:
    """The model's :class:`VisionProcessor`, or None for a text-only model.

    The image processor comes from the model directory (``AutoImageProcessor``); if the
    tokenizer has no chat template, the processor's (``chat_template.json``/``.jinja``)
    is given to it.
    """
    from transformers import AutoConfig, AutoImageProcessor

    from temper.utils.model_path import resolve_model_path

    path = resolve_model_path(model_path)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return None  # not a loadable model directory: the model loader reports it
    if not is_vision_config(config):
        return None
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        raise DataError(
            "model.path",
            f"vision-language models need transformers >= 5 (token types for M-RoPE, the "
            f"PIL image processors); {transformers.__version__} is installed",
            "pip install 'transformers>=5'",
        )
    # The PIL backend: the same pixels with or without torchvision (images arrive resized).
    try:
        image_processor = AutoImageProcessor.from_pretrained(
            path, trust_remote_code=trust_remote_code, backend="pil"
        )
    except OSError as err:
        raise DataError(
            "model.path",
            f"{model_path} is a vision-language model without an image processor "
            f"(preprocessor_config.json): {' '.join(str(err).split())[:160]}",
            "copy the processor files of the base model into the directory",
        ) from err
    if not getattr(tokenizer, "chat_template", None):
        template = _template_from_files(path)
        if template:
            tokenizer.chat_template = template
    return VisionProcessor(
        tokenizer,
        image_processor,
        min_pixels=cfg.image_min_pixels,
        max_pixels=cfg.image_max_pixels,
        image_folder=cfg.image_folder,
        timed_video=getattr(config.vision_config, "tokens_per_second", None) is not None,
        timestamped_video=_processor_name(config) in TIMESTAMPED_VIDEO_PROCESSORS,
    )


#: Processors that put a timestamp (``<1.5 seconds>``) before each temporal patch of a
#: video (:meth:`VisionProcessor.video_text` writes them the same way).
TIMESTAMPED_VIDEO_PROCESSORS = frozenset({"Qwen3VLProcessor"})


def _processor_name(config: Any) -> str | None:
    """The class name of the processor transformers pairs with this model type."""
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    return PROCESSOR_MAPPING_NAMES.get(getattr(config, "model_type", ""))


def _replace_each(text: str, token: str, replacements: Sequence[str], what: str) -> str:
    """``text`` with its i-th ``token`` replaced by ``replacements[i]``; their counts
    must agree (the chat template wrote one placeholder per image or video)."""
    pieces = text.split(token)
    if len(pieces) - 1 != len(replacements):
        raise RowProblem(
            f"the chat template wrote {len(pieces) - 1} {what} placeholders for "
            f"{len(replacements)} {what}(s); does it render {what} content parts?"
        )
    out = [pieces[0]]
    for replacement, piece in zip(replacements, pieces[1:]):
        out.append(replacement)
        out.append(piece)
    return "".join(out)


def _base_dir(folder: str | None, data_file: str) -> Path:
    """Where relative paths start: the configured folder, else the data file's directory."""
    return Path(os.path.expanduser(folder)) if folder else Path(data_file).parent


def _local_path(text: str, base_dir: Path, where: str) -> Path:
    text = text.removeprefix("file://")
    if text.startswith(("http://", "https://")):
        raise RowProblem(f"{where} is a URL ({text[:60]}); videos must be local files")
    path = Path(os.path.expanduser(text))
    return path if path.is_absolute() else base_dir / path


def _decoded(data: bytes, where: str) -> Any:
    try:
        return decode(data)
    except Exception as err:  # PIL raises many types for broken files
        reason = re.sub(r" <[^>]* at 0x[0-9a-f]+>", "", str(err))  # no addresses
        raise RowProblem(f"{where} cannot be decoded ({type(err).__name__}: {reason})") from err


def _sampling(item: Any, cfg: DataConfig, where: str) -> Sampling:
    """The config's video sampling, with a video dict's own keys over it (module doc of
    :mod:`temper.data.video`)."""
    base = Sampling(
        fps=cfg.video_fps,
        max_frames=cfg.video_max_frames,
        min_pixels=cfg.video_min_pixels,
        max_pixels=cfg.video_max_pixels,
        total_pixels=cfg.video_total_pixels,
    )
    if not isinstance(item, dict):
        return base
    unknown = sorted(set(item) - set(VIDEO_DICT_KEYS))
    if unknown:
        raise RowProblem(
            f"{where} has keys temper does not read ({', '.join(unknown)}); it reads "
            f"{', '.join(VIDEO_DICT_KEYS)} (clip ranges such as video_start are not supported)"
        )
    if "fps" in item and "nframes" in item:
        raise RowProblem(f"{where} sets both fps and nframes; give one")
    changes: dict[str, Any] = {}
    for field in dataclasses.fields(Sampling):
        if item.get(field.name) is not None:
            try:
                changes[field.name] = float(item[field.name])
            except (TypeError, ValueError) as err:
                raise RowProblem(
                    f"{where}: {field.name} must be a number, got {item[field.name]!r}"
                ) from err
            if field.name in ("min_frames", "max_frames", "nframes", "min_pixels", "max_pixels"):
                changes[field.name] = int(changes[field.name])
    return dataclasses.replace(base, **changes)


def check_no_audio(row: dict[str, Any], cfg: DataConfig) -> None:
    """Rows with audio are reported: audio inputs are not supported (images and videos are)."""
    value = get_path(row, cfg.audio_key)
    if isinstance(value, (list, tuple, str, bytes, dict)) and value:
        raise RowProblem(
            f"column '{cfg.audio_key}' holds audio: audio inputs are not supported (the "
            "Qwen-Omni audio encoder is not in temper's vision-language family; images and "
            "videos are); drop the row's audio or the row"
        )


# --------------------------------------------------------------------------- model kwargs


def token_type_ids(
    input_ids: torch.Tensor, prompt_len: int, image_id: int | None, video_id: int | None
) -> torch.Tensor:
    """``mm_token_type_ids`` (B, L): 1 on image and 2 on video placeholder tokens of the
    first ``prompt_len`` columns, 0 elsewhere (a response never holds image features)."""
    out = torch.zeros_like(input_ids, dtype=torch.int32)
    prompt = input_ids[:, :prompt_len]
    if image_id is not None:
        out[:, :prompt_len][prompt == image_id] = 1
    if video_id is not None:
        out[:, :prompt_len][prompt == video_id] = 2
    return out


def stack_inputs(rows: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The ``multi_modal_inputs`` of several rows as one forward's kwargs (row order)."""
    keys: list[str] = []
    for row in rows:
        keys.extend(k for k in row if k not in keys)
    return {k: torch.cat([row[k] for row in rows if k in row], dim=0) for k in keys}


def has_pixels(rows: Sequence[dict[str, Any]] | None) -> bool:
    """Whether any of these ``multi_modal_inputs`` carries pixel values (of images or
    videos)."""
    return bool(rows) and any("pixel_values" in r or "pixel_values_videos" in r for r in rows or ())


def _present(value: Any) -> bool:
    return not (
        value is None or value is MISSING or (isinstance(value, (list, tuple)) and not value)
    )


def row_media(
    row: dict[str, Any],
    cfg: DataConfig,
    vision: VisionProcessor | None,
    data_file: str,
    where: str,
) -> tuple[tuple[ImageInput, ...], tuple[VideoInput, ...]]:
    """The images and videos of one dataset row (empty for a text row); see the module doc.

    Raises :class:`RowProblem` for a bad image or video or a row with audio, and
    :class:`DataError` when the row has images or videos but the model has no vision tower.
    """
    check_no_audio(row, cfg)
    wanted = [
        (key, what)
        for key, what in ((cfg.image_key, "images"), (cfg.video_key, "videos"))
        if _present(get_path(row, key))
    ]
    if not wanted:
        return (), ()
    if vision is None:
        key, what = wanted[0]
        ckey = "data.image_key" if what == "images" else "data.video_key"
        raise DataError(
            ckey,
            f"{data_file}:{where} has {what} in column '{key}', but model.path is "
            "not a vision-language model (its config has no vision_config)",
            f"use a vision-language model (e.g. Qwen2.5-VL), or drop the {what} column",
        )
    return vision.read_images(row, cfg, data_file), vision.read_videos(row, cfg, data_file)


def collapse_image_tokens(ids: Sequence[int], image_id: int, counts: Sequence[int]) -> list[int]:
    """Prompt ids with each image's run of ``counts[i]`` image tokens back to one token
    (the form engines that expand placeholders themselves, like vLLM, take)."""
    out: list[int] = []
    pending = list(counts)
    i = 0
    while i < len(ids):
        if ids[i] == image_id and pending:
            n = pending.pop(0)
            if list(ids[i : i + n]) != [image_id] * n:
                raise ValueError(f"prompt has fewer than {n} image tokens at position {i}")
            out.append(image_id)
            i += n
            continue
        out.append(int(ids[i]))
        i += 1
    if pending:
        raise ValueError(f"prompt has no image tokens left for {len(pending)} image(s)")
    return out


def image_token_counts(inputs: dict[str, torch.Tensor], merge_size: int) -> list[int]:
    """Tokens of each image of a prompt's ``multi_modal_inputs``: ``t·h·w / merge²``."""
    grid = inputs.get("image_grid_thw")
    if grid is None:
        return []
    return (grid.prod(dim=1) // merge_size**2).tolist()
