"""Prompt datasets: files → parsed, templated, tokenized, length-checked prompts.

Everything is done once at load, so a bad row or an overlong prompt is found before the
first rollout, not hours into a run. Malformed rows are reported (``file:line N: reason``)
and skipped and counted — or fail the load with ``data.bad_rows=error``; they are never
dropped silently. The counts are exposed as metrics (``data/skipped_rows``, …).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from temper.config.schema import DataConfig, TemperConfig
from temper.data.batch import Batch
from temper.data.collate import PromptExample, collate_prompts
from temper.data.errors import (
    DataError,
    RowIssue,
    RowProblem,
    SkippedRows,
    empty_files_error,
)
from temper.data.prompts import (
    check_template,
    parse_row,
    render,
    tokenize,
    truncate_ids,
    with_system,
)
from temper.data.row_formats import ROW_FORMATS
from temper.data.sources import read_rows
from temper.data.video import VideoInput
from temper.data.vision import ImageInput, VisionProcessor, load_vision_processor, row_media

log = logging.getLogger("temper.data")

_TOKENIZE_CHUNK = 1024


#: A prompt's images and videos, read and sized.
Media = tuple[tuple[ImageInput, ...], tuple[VideoInput, ...]]


class PromptDataset:
    """Ready prompts plus the record of what was skipped, filtered and truncated on load."""

    def __init__(
        self,
        examples: Sequence[PromptExample],
        pad_token_id: int,
        name: str = "train",
        skipped: Sequence[RowIssue] = (),
        filtered_overlong: int = 0,
        truncated: int = 0,
        rows_read: int | None = None,
        vision: VisionProcessor | None = None,
    ) -> None:
        self.examples = list(examples)
        self.vision = vision  # builds multi_modal_inputs of image prompts at collation
        self.pad_token_id = pad_token_id
        self.name = name
        self.skip_reasons: list[RowIssue] = list(skipped)
        self.filtered_overlong = filtered_overlong
        self.truncated = truncated
        self.rows_read = len(self.examples) + len(self.skip_reasons) + filtered_overlong
        if rows_read is not None:
            self.rows_read = rows_read

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> PromptExample:
        return self.examples[index]

    @property
    def skipped_rows(self) -> int:
        """Malformed rows reported and skipped at load (the ``data/skipped_rows`` metric)."""
        return len(self.skip_reasons)

    @property
    def tags(self) -> list[str]:
        """The tag of every prompt, in dataset order (for weighted sampling)."""
        return [e.tag for e in self.examples]

    def metrics(self) -> dict[str, float]:
        """Load-time counts for the trackers: ``data/<count>`` (train) or ``data/<name>/<count>``."""
        prefix = "data" if self.name == "train" else f"data/{self.name}"
        return {
            f"{prefix}/skipped_rows": float(self.skipped_rows),
            f"{prefix}/filtered_overlong_prompts": float(self.filtered_overlong),
            f"{prefix}/truncated_prompts": float(self.truncated),
            f"{prefix}/num_prompts": float(len(self)),
        }

    def make_batch(
        self, indices: Sequence[int], uids: Sequence[str] | None = None, pad_to: int | None = None
    ) -> Batch:
        """The prompt :class:`Batch` of rows ``indices``; uids default to ``f"{name}-{index}"``."""
        if uids is None:
            uids = [f"{self.name}-{i}" for i in indices]
        return collate_prompts(
            [self.examples[i] for i in indices],
            uids,
            self.pad_token_id,
            pad_to,
            indices,
            vision=self.vision,
        )

    def eval_batches(
        self, batch_size: int | None = None, shuffle: bool = False, seed: int = 0
    ) -> Iterator[Batch]:
        """Every prompt once (validation), in batches of ``batch_size`` (None: one batch)."""
        order = np.arange(len(self))
        if shuffle:
            order = np.random.default_rng((seed, 0x5EED)).permutation(len(self))
        size = batch_size or max(len(self), 1)
        for start in range(0, len(self), size):
            yield self.make_batch(order[start : start + size].tolist())


def _overlong(where: str, length: int, cfg: DataConfig) -> DataError:
    return DataError(
        "data.max_prompt_length",
        f"prompt at {where} has {length} tokens after templating, more than "
        f"max_prompt_length={cfg.max_prompt_length}",
        "raise data.max_prompt_length, set data.truncation to left/right/middle, or set "
        "data.filter_overlong_prompts=true",
    )


def build_dataset(
    files: str | Path | Sequence[str | Path],
    cfg: DataConfig,
    tokenizer: Any,
    name: str = "train",
    key: str = "data.train_files",
    max_samples: int = -1,
    vision: VisionProcessor | None = None,
) -> PromptDataset:
    """Load, template, tokenize and length-check the prompts of ``files``.

    ``key`` is the config key the files came from (named in errors). Raises
    :class:`DataError` for unreadable files, for a malformed row when ``bad_rows=error``,
    for an overlong prompt when ``truncation=error`` (unless filtered), and when no
    usable prompt is left. ``max_samples > 0`` keeps the first that many usable prompts
    and stops reading there (quick runs on big files). ``vision`` (the model's, for a
    vision-language model) reads rows' images and videos (``data.image_key``,
    ``data.video_key``; see ``data.vision``).
    """
    check_template(cfg, tokenizer)
    raw = cfg.chat_template == "raw"
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = tokenizer.eos_token_id
    if pad_id is None:
        raise DataError(
            "model.tokenizer_path",
            "the tokenizer has no pad and no eos token",
            "use a tokenizer that defines pad_token or eos_token",
        )

    skipped = SkippedRows(key, cfg.bad_rows)
    examples: list[PromptExample] = []
    filtered = truncated = rows_read = 0
    pending: list[tuple[str, str, str, list[dict[str, str]], Any, Media]] = []

    def flush() -> None:
        nonlocal filtered, truncated
        all_ids = tokenize(tokenizer, [p[2] for p in pending], raw)
        for (file, where, text, messages, fields, (images, videos)), ids in zip(pending, all_ids):
            if not ids:
                issue = RowIssue(file, where, "prompt is empty after templating")
                skipped.add(issue)
                continue
            location = f"{file}:{where}"
            if len(ids) > cfg.max_prompt_length:
                if cfg.filter_overlong_prompts:
                    filtered += 1
                    continue
                if cfg.truncation == "error":
                    raise _overlong(location, len(ids), cfg)
                if images or videos:  # cutting would drop tokens the pixels still need
                    what = "images" if images else "videos"
                    issue = RowIssue(
                        file,
                        where,
                        f"prompt with {what} has {len(ids)} tokens, more than "
                        f"max_prompt_length={cfg.max_prompt_length}, and truncating it would "
                        f"cut {what[:-1]} tokens",
                    )
                    skipped.add(issue)
                    continue
                ids = truncate_ids(ids, cfg.max_prompt_length, cfg.truncation)
                text = tokenizer.decode(ids, skip_special_tokens=False)
                truncated += 1
            examples.append(
                PromptExample(
                    prompt_ids=tuple(ids),
                    prompt_text=text,
                    raw_prompt=messages,
                    data_source=fields.data_source,
                    tag=fields.tag,
                    ground_truth=fields.ground_truth,
                    extra_info=fields.extra_info,
                    source=location,
                    images=images,
                    videos=videos,
                )
            )
        pending.clear()

    for item in read_rows(files, key):
        if 0 < max_samples <= len(examples) + len(pending):
            flush()
            if len(examples) >= max_samples:
                break
        rows_read += 1
        try:
            if item.problem is not None:
                raise RowProblem(item.problem)
            assert item.row is not None
            row = ROW_FORMATS.get(cfg.row_format)(item.row, cfg)
            fields = parse_row(row, cfg)
            images, videos = row_media(row, cfg, vision, item.file, item.where)
            if images or videos:
                assert vision is not None  # row_media raises without one
                messages = with_system(fields.messages, cfg.system_prompt)
                text = vision.render(messages, images, cfg, videos)
            else:
                text, messages = render(fields, cfg, tokenizer)
        except RowProblem as err:
            issue = RowIssue(item.file, item.where, str(err))
            skipped.add(issue)
            continue
        pending.append((item.file, item.where, text, messages, fields, (images, videos)))
        if len(pending) >= _TOKENIZE_CHUNK:
            flush()
    flush()
    if max_samples > 0:
        del examples[max_samples:]

    skipped.summarize(f"{name} data", rows_read)
    if filtered:
        log.info(
            "%s data: dropped %d prompts longer than %d tokens",
            name,
            filtered,
            cfg.max_prompt_length,
        )
    if rows_read == 0:
        raise empty_files_error(key, files)
    if not examples:
        raise DataError(
            key,
            f"no usable prompt in {files}: {rows_read} rows read, {len(skipped)} malformed, "
            f"{filtered} overlong{skipped.first()}",
            "check the files and data.prompt_key/messages_key",
        )
    return PromptDataset(
        examples, pad_id, name, skipped.issues, filtered, truncated, rows_read, vision=vision
    )


def build_datasets(
    cfg: TemperConfig, tokenizer: Any
) -> tuple[PromptDataset | None, PromptDataset | None]:
    """The train and validation datasets of a run (None where no files are configured).

    Honors ``data.train_max_samples``/``val_max_samples`` (first N usable prompts). For
    a vision-language model the model's processor is loaded with the tokenizer
    (:func:`temper.data.vision.load_vision_processor`) and rows' images are read.
    """
    data = cfg.data
    train = val = None
    vision = None
    if data.train_files or data.val_files:
        vision = load_vision_processor(
            cfg.model.path, tokenizer, data, trust_remote_code=cfg.model.trust_remote_code
        )
    if data.train_files:
        limit = data.train_max_samples
        train = build_dataset(
            data.train_files, data, tokenizer, "train", "data.train_files", limit, vision
        )
    if data.val_files:
        limit = data.val_max_samples
        val = build_dataset(data.val_files, data, tokenizer, "val", "data.val_files", limit, vision)
    return train, val
