"""Prompt samples to a :class:`Batch`: left-padded ids and mask, plus per-sample objects.

Prompts are **left**-padded so that every row's last prompt token sits in the last
column: generation then appends responses at the same position for all rows, and
``input_ids = prompt_ids ‖ response_ids`` stays a plain concatenation.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from temper.data.batch import Batch

if TYPE_CHECKING:
    from temper.data.video import VideoInput
    from temper.data.vision import ImageInput, VisionProcessor


@dataclasses.dataclass(frozen=True)
class PromptExample:
    """One ready prompt: token ids after templating and truncation, and what rewards need."""

    prompt_ids: tuple[int, ...]
    prompt_text: str
    raw_prompt: list[dict[str, str]]
    data_source: str
    tag: str
    ground_truth: Any
    extra_info: dict[str, Any]
    source: str  # "file:line N" — where the row came from, for reports
    images: tuple[ImageInput, ...] = ()  # vision-language prompts: their images, sized
    videos: tuple[VideoInput, ...] = ()  # and their videos, frames chosen and sized


def left_pad(
    sequences: Sequence[Sequence[int]], pad_token_id: int, length: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) of shape (B, L), sequences right-aligned; L = ``length`` or the longest."""
    longest = max((len(s) for s in sequences), default=0)
    width = longest if length is None else length
    if width < longest:
        raise ValueError(f"pad length {width} is shorter than the longest sequence ({longest})")
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq) :] = torch.as_tensor(list(seq), dtype=torch.long)
            mask[row, width - len(seq) :] = 1
    return ids, mask


def collate_prompts(
    examples: Sequence[PromptExample],
    uids: Sequence[str],
    pad_token_id: int,
    pad_to: int | None = None,
    indices: Sequence[int] | None = None,
    vision: VisionProcessor | None = None,
) -> Batch:
    """A prompt :class:`Batch` of ``examples``.

    Tensors: ``prompt_ids``/``prompt_mask`` (B, P), left-padded with ``pad_token_id``
    to the longest prompt (or ``pad_to``). Objects: ``uid`` (the GRPO group id),
    ``index`` (dataset position, or -1), ``data_source``, ``tag``, ``ground_truth``,
    ``extra_info`` (a copy, so reward code cannot alter the dataset), ``prompt_text``,
    ``raw_prompt`` (the chat messages). With ``vision`` (a vision-language model's
    processor) also ``multi_modal_data`` and ``multi_modal_inputs`` (empty dicts for
    prompts without images or videos; see :mod:`temper.data.vision`).
    """
    if len(uids) != len(examples):
        raise ValueError(f"{len(uids)} uids for {len(examples)} prompts")
    ids, mask = left_pad([e.prompt_ids for e in examples], pad_token_id, pad_to)
    objects: dict[str, list[Any]] = {
        "uid": list(uids),
        "index": list(indices) if indices is not None else [-1] * len(examples),
        "data_source": [e.data_source for e in examples],
        "tag": [e.tag for e in examples],
        "ground_truth": [copy.deepcopy(e.ground_truth) for e in examples],
        "extra_info": [copy.deepcopy(e.extra_info) for e in examples],
        "prompt_text": [e.prompt_text for e in examples],
        "raw_prompt": [copy.deepcopy(e.raw_prompt) for e in examples],
    }
    if vision is not None:
        from temper.data.vision import MULTI_MODAL_DATA, MULTI_MODAL_INPUTS

        pairs = [vision.model_inputs(e.images, e.videos) for e in examples]
        objects[MULTI_MODAL_DATA] = [data for data, _ in pairs]
        objects[MULTI_MODAL_INPUTS] = [inputs for _, inputs in pairs]
    return Batch.from_dict({"prompt_ids": ids, "prompt_mask": mask}, objects)
