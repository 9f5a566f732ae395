"""Supervised data: rows → templated token sequences with the tokens to learn marked.

Two row shapes (:class:`~temper.config.schema.SFTConfig` names the columns):

- **prompt and response** (``data.prompt_key``, ``sft.response_key``; verl's
  ``fsdp_sft_trainer``, ROLL's SFT pipeline): the prompt is templated as an RL prompt is
  (a string is the user's turn — ROLL's ``query_key`` column appended after a newline,
  its ``system_key`` column or ``data.system_prompt`` as the system turn — or a chat
  list; ``add_generation_prompt``), and the response's tokens follow it, closed by the
  tokenizer's EOS — verl's layout, and exactly the shape of an RL sample, so a model
  fine-tuned here is prompted the same way in a later RL run;
- **a conversation** (``data.messages_key``; verl's multi-turn SFT): the whole list
  templated at once (``tools`` from ``sft.tools_key``), every assistant turn learnt. A
  turn's tokens are found by templating the conversation up to it: ``messages[:k]`` with
  the generation prompt ends where assistant turn ``k`` starts, ``messages[:k+1]`` where
  it ends; a template that renders earlier turns differently once later ones follow
  (one that drops past reasoning) cannot be cut so, and such a row is reported.

A sample is ``prompt_ids`` (context before the first learnt token, never learnt) and
``response_ids`` with ``target_mask`` (1 on learnt tokens; in a conversation the user
and tool turns between assistant turns are context). Longer than ``sft.max_length``
(prompt and response together) follows ``data.truncation`` as verl's SFT datasets do:
``error`` fails the load naming the row, ``left`` keeps the last ``max_length`` tokens,
``right`` the first. Bad rows — no response column, an empty response, a conversation
whose turns do not alternate, nothing left to learn after truncation — are reported by
file and row and skipped (``data.bad_rows=error``: the load fails), as prompt rows are.

Rows are first rewritten by ``data.row_format``. For a vision-language model a prompt
and response row may hold images (``data.image_key``, ``<image>`` marks in the prompt):
the prompt is rendered and its image placeholders expanded as an RL prompt's are
(:mod:`temper.data.vision`), and a batch carries each sample's ``multi_modal_inputs``
(pixels and grids) for the trainer's forward (:mod:`temper.training.vision`). A missing
or undecodable image is a bad row; cutting a sample with images anywhere but in its
response would drop image tokens, so such a sample is reported too.

``sft.learn_prompt`` (ROLL's ``distill_on_prompt``) learns every token after a sample's
first — the prompt's too — except image and video placeholder tokens, which stand for
the pixels and stay context.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from temper.config.schema import TemperConfig
from temper.data.batch import Batch
from temper.data.collate import left_pad
from temper.data.errors import (
    DataError,
    RowIssue,
    RowProblem,
    SkippedRows,
    empty_files_error,
)
from temper.data.prompts import check_template
from temper.data.sft_rows import Encoder, learn_prompt, truncate
from temper.data.sources import read_rows
from temper.data.vision import (
    MULTI_MODAL_INPUTS,
    ImageInput,
    VisionProcessor,
    load_vision_processor,
)


@dataclasses.dataclass(frozen=True)
class SFTExample:
    """One supervised sample: context tokens, then tokens with the ones to learn marked."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    target_mask: tuple[int, ...]  # 1 on the response tokens to learn
    source: str  # "file:row N", for reports
    truncated: bool = False
    images: tuple[ImageInput, ...] = ()  # of the prompt, in the order of its placeholders

    @property
    def targets(self) -> int:
        return sum(self.target_mask)


# --------------------------------------------------------------------------- dataset


class SFTDataset:
    """Ready supervised samples plus the record of what was skipped and cut on load."""

    def __init__(
        self,
        examples: Sequence[SFTExample],
        pad_token_id: int,
        name: str,
        skipped: Sequence[RowIssue],
        rows_read: int,
        vision: VisionProcessor | None = None,
    ) -> None:
        self.examples = list(examples)
        self.vision = vision
        self.pad_token_id = pad_token_id
        self.name = name
        self.skip_reasons = list(skipped)
        self.rows_read = rows_read

    def __len__(self) -> int:
        return len(self.examples)

    @property
    def truncated(self) -> int:
        return sum(e.truncated for e in self.examples)

    def metrics(self) -> dict[str, float]:
        """Load-time counts: ``data/<count>`` (train) or ``data/<name>/<count>``."""
        prefix = "data" if self.name == "train" else f"data/{self.name}"
        return {
            f"{prefix}/skipped_rows": float(len(self.skip_reasons)),
            f"{prefix}/truncated_samples": float(self.truncated),
            f"{prefix}/num_samples": float(len(self)),
        }

    def make_batch(self, indices: Sequence[int], uids: Sequence[str] | None = None) -> Batch:
        """The :class:`Batch` of samples ``indices``: ``prompt_ids``/``prompt_mask``
        left-padded, ``response_ids`` right-padded with ``response_mask`` (the tokens to
        learn) and ``attention_mask`` (every real token: context turns inside a response
        are attended to, not learnt); objects ``uid``, ``index``, ``source``,
        ``truncated`` (and, for a vision-language model, ``multi_modal_inputs``: empty for
        samples without images); meta ``temperature`` 1 (log-probs of the model itself)."""
        chosen = [self.examples[i] for i in indices]
        uids = list(uids) if uids is not None else [f"{self.name}-{i}" for i in indices]
        prompt_ids, prompt_mask = left_pad([e.prompt_ids for e in chosen], self.pad_token_id)
        width = max((len(e.response_ids) for e in chosen), default=0)
        response_ids = torch.full((len(chosen), width), self.pad_token_id, dtype=torch.long)
        response_mask = torch.zeros((len(chosen), width), dtype=torch.long)
        present = torch.zeros((len(chosen), width), dtype=torch.long)
        for row, e in enumerate(chosen):
            n = len(e.response_ids)
            response_ids[row, :n] = torch.as_tensor(e.response_ids, dtype=torch.long)
            response_mask[row, :n] = torch.as_tensor(e.target_mask, dtype=torch.long)
            present[row, :n] = 1
        tensors = {
            "prompt_ids": prompt_ids,
            "prompt_mask": prompt_mask,
            "response_ids": response_ids,
            "response_mask": response_mask,
            "attention_mask": torch.cat([prompt_mask, present], dim=1),
        }
        objects: dict[str, list[Any]] = {
            "uid": uids,
            "index": list(indices),
            "source": [e.source for e in chosen],
            "truncated": [e.truncated for e in chosen],
        }
        if self.vision is not None:
            vision = self.vision
            objects[MULTI_MODAL_INPUTS] = [vision.model_inputs(e.images)[1] for e in chosen]
        return Batch.from_dict(tensors, objects, {"temperature": 1.0})

    def eval_batches(self, batch_size: int | None = None) -> Iterator[Batch]:
        """Every sample once, in order, in batches of ``batch_size`` (None: one batch)."""
        order = np.arange(len(self))
        size = batch_size or max(len(self), 1)
        for start in range(0, len(self), size):
            yield self.make_batch(order[start : start + size].tolist())


def build_sft_dataset(
    files: Sequence[str],
    cfg: TemperConfig,
    tokenizer: Any,
    name: str,
    key: str,
    limit: int,
    vision: VisionProcessor | None = None,
) -> SFTDataset:
    """Load, template, tokenize and cut the samples of ``files`` (``key``: the config key
    that named them; ``vision``: a vision-language model's processor). Raises
    :class:`DataError` for unreadable files, a bad row under ``bad_rows=error``, an
    overlong sample under ``truncation=error``, and no usable sample; ``limit > 0`` keeps
    the first that many usable samples."""
    data = cfg.data
    check_template(data, tokenizer)
    encoder = Encoder(cfg, tokenizer, vision)
    context = frozenset(_placeholder_ids(vision))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else encoder.eos
    examples: list[SFTExample] = []
    skipped = SkippedRows(key, data.bad_rows)
    skip = skipped.add
    rows = 0

    for item in read_rows(files, key):
        if 0 < limit <= len(examples):
            break
        rows += 1
        try:
            if item.problem is not None:
                raise RowProblem(item.problem)
            assert item.row is not None
            prompt, response, mask, images = encoder.encode_row(item.row, item.file, item.where)
        except RowProblem as err:
            skip(RowIssue(item.file, item.where, str(err)))
            continue
        length = len(prompt) + len(response)
        cut = length > cfg.sft.max_length
        if cut and data.truncation == "error":
            raise DataError(
                "sft.max_length",
                f"the sample at {item.file}:{item.where} has {length} tokens (prompt and "
                f"response), more than max_length={cfg.sft.max_length}",
                "raise sft.max_length, or set data.truncation to left or right",
            )
        # a right cut inside the response keeps every image token; any other cut does not
        if cut and images and (data.truncation != "right" or len(prompt) >= cfg.sft.max_length):
            reason = (
                f"sample with images has {length} tokens, more than max_length="
                f"{cfg.sft.max_length}, and {data.truncation} truncation would cut image tokens"
            )
            skip(RowIssue(item.file, item.where, reason))
            continue
        kept = truncate(prompt, response, mask, cfg.sft.max_length, data.truncation)
        if kept is not None and cfg.sft.learn_prompt:
            kept = learn_prompt(kept[0], kept[1], context)
        if kept is None:
            reason = (
                f"nothing left to learn after cutting its {length} tokens to "
                f"max_length={cfg.sft.max_length} ({data.truncation} truncation)"
            )
            skip(RowIssue(item.file, item.where, reason))
            continue
        where = f"{item.file}:{item.where}"
        examples.append(
            SFTExample(tuple(kept[0]), tuple(kept[1]), tuple(kept[2]), where, cut, images)
        )
    skipped.summarize(f"{name} data", rows)
    if rows == 0:
        raise empty_files_error(key, files)
    if not examples:
        raise DataError(
            key,
            f"no usable sample in {list(files)}: {rows} rows read, {len(skipped)} malformed"
            f"{skipped.first()}",
            "check the files and data.prompt_key / sft.response_key / data.messages_key",
        )
    return SFTDataset(examples, int(pad), name, skipped.issues, rows, vision)


def _placeholder_ids(vision: VisionProcessor | None) -> list[int]:
    """The image and video placeholder ids of a vision-language tokenizer (none for text)."""
    if vision is None:
        return []
    ids = [vision.image_token_id]
    if vision.has_video_token:
        ids.append(int(vision.tokenizer.convert_tokens_to_ids(vision.video_token)))
    return ids


def build_sft_datasets(
    cfg: TemperConfig, tokenizer: Any
) -> tuple[SFTDataset | None, SFTDataset | None]:
    """The train and validation samples of an SFT run (None where no files are given);
    ``data.train_max_samples`` / ``val_max_samples`` keep the first N usable samples. For
    a vision-language model its processor reads the rows' images."""
    data = cfg.data
    train = val = None
    vision = None
    if data.train_files or data.val_files:  # None for a text model
        vision = load_vision_processor(
            cfg.model.path, tokenizer, data, trust_remote_code=cfg.model.trust_remote_code
        )
    if data.train_files:
        limit = data.train_max_samples
        train = build_sft_dataset(
            data.train_files, cfg, tokenizer, "train", "data.train_files", limit, vision
        )
    if data.val_files:
        limit = data.val_max_samples
        val = build_sft_dataset(
            data.val_files, cfg, tokenizer, "val", "data.val_files", limit, vision
        )
    return train, val
