"""Preference pairs: rows of a prompt, a chosen and a rejected response → token pairs.

A row holds the prompt (``data.prompt_key``: a string, the user's turn, or a chat list,
templated as an RL or SFT prompt is, ``data.system_prompt`` included) and two responses,
``chosen_key`` (preferred) and ``rejected_key`` of the pipeline's section
(:class:`PairColumns`: ``dpo`` or ``rm``), each a string or a conversation
ending with the assistant's turn (whose earlier turns are then the prompt: TRL's and
UltraFeedback's conversational rows); each response's tokens follow
the templated prompt, closed by the tokenizer's EOS — the SFT layout
(:class:`temper.data.sft_rows.Encoder`), so a pair is two SFT samples with one prompt. Longer
than the section's ``max_length`` (the prompt with either response) follows ``data.truncation``
(``error`` fails the load naming the row, ``left``/``right`` cut that side as SFT does).

Bad rows — no chosen or rejected column, an empty response, the same response twice (a
pair that prefers nothing), nothing left to learn after truncation — are reported by
file and row and skipped (``data.bad_rows=error``: the load fails), as SFT rows are.

A batch of ``P`` pairs is ``2P`` rows, each pair's chosen row then its rejected row
(``chosen`` (2P,) is 1 on chosen rows), so the sequence log-probs of pair ``i`` are rows
``2i`` and ``2i + 1`` whatever engine computes them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from temper.config.schema import TemperConfig
from temper.data.batch import Batch
from temper.data.errors import (
    DataError,
    RowIssue,
    RowProblem,
    SkippedRows,
    empty_files_error,
)
from temper.data.prompts import check_template, get_path
from temper.data.sft import SFTDataset, SFTExample
from temper.data.sft_rows import Encoder, truncate
from temper.data.sources import read_rows


@dataclasses.dataclass(frozen=True)
class PairColumns:
    """Where a pipeline's pairs are configured: its section's name (``dpo``, ``rm``: the
    keys errors name), ``chosen_key``, ``rejected_key`` and ``max_length``."""

    section: str
    chosen_key: str
    rejected_key: str
    max_length: int

    @classmethod
    def of(cls, section: str, settings: Any) -> PairColumns:
        """The columns of config section ``settings`` (named ``section``)."""
        return cls(section, settings.chosen_key, settings.rejected_key, settings.max_length)


@dataclasses.dataclass(frozen=True)
class PairExample:
    """One preference pair: the chosen and the rejected sample, each an SFT sample."""

    chosen: SFTExample
    rejected: SFTExample

    @property
    def truncated(self) -> bool:
        return self.chosen.truncated or self.rejected.truncated


class PairDataset:
    """Ready preference pairs plus the record of what was skipped and cut on load."""

    def __init__(
        self,
        pairs: Sequence[PairExample],
        pad_token_id: int,
        name: str,
        skipped: Sequence[RowIssue],
        rows_read: int,
    ) -> None:
        self.pairs = list(pairs)
        self.pad_token_id = pad_token_id
        self.name = name
        self.skip_reasons = list(skipped)
        self.rows_read = rows_read

    def __len__(self) -> int:
        return len(self.pairs)

    def metrics(self) -> dict[str, float]:
        """Load-time counts: ``data/<count>`` (train) or ``data/<name>/<count>``."""
        prefix = "data" if self.name == "train" else f"data/{self.name}"
        return {
            f"{prefix}/skipped_rows": float(len(self.skip_reasons)),
            f"{prefix}/truncated_pairs": float(sum(p.truncated for p in self.pairs)),
            f"{prefix}/num_pairs": float(len(self)),
        }

    def make_batch(self, indices: Sequence[int], uids: Sequence[str] | None = None) -> Batch:
        """The ``2·len(indices)`` rows of pairs ``indices`` (module docstring), laid out as
        :meth:`SFTDataset.make_batch` lays out samples; objects ``uid`` (the pair's, on
        both rows), ``index``, ``source``, ``truncated``; tensor ``chosen`` (2P,)."""
        uids = list(uids) if uids is not None else [f"{self.name}-{i}" for i in indices]
        flat: list[SFTExample] = []
        for i in indices:
            flat += [self.pairs[i].chosen, self.pairs[i].rejected]
        rows = SFTDataset(flat, self.pad_token_id, self.name, [], 0)
        batch = rows.make_batch(range(len(flat)), [u for u in uids for _ in (0, 1)])
        batch.objects["index"] = [i for i in indices for _ in (0, 1)]
        chosen = torch.tensor([1, 0] * len(indices), dtype=torch.long)
        return batch.union(Batch.from_dict({"chosen": chosen}))

    def eval_batches(self, batch_size: int | None = None) -> Iterator[Batch]:
        """Every pair once, in order, ``batch_size`` pairs a batch (None: one batch)."""
        order = np.arange(len(self))
        size = batch_size or max(len(self), 1)
        for start in range(0, len(self), size):
            yield self.make_batch(order[start : start + size].tolist())


def scored_pairs(data: PairDataset) -> PairDataset:
    """``data`` laid out for a model with a scalar head that scores a whole sequence at
    its last token (a reward model): each row's prompt is the whole sequence (prompt and
    response), its response one slot (``response_mask`` 1) holding the pad token. A
    value model's output at a response slot is its value at the token before it, so the
    slot's value is the one at the sequence's last token — the score a
    ``*ForSequenceClassification`` model reads there — and, attention being causal, the
    slot's own token changes nothing of it."""

    def scored(e: SFTExample) -> SFTExample:
        sequence = e.prompt_ids + e.response_ids
        return SFTExample(sequence, (data.pad_token_id,), (1,), e.source, e.truncated)

    pairs = [PairExample(scored(p.chosen), scored(p.rejected)) for p in data.pairs]
    return PairDataset(pairs, data.pad_token_id, data.name, data.skip_reasons, data.rows_read)


_RESPONSE = "__temper_response__"  # the column a conversational response is encoded from


def _as_text_row(row: dict[str, Any], column: str, prompt_key: str) -> tuple[dict[str, Any], str]:
    """A row whose ``column`` is a conversation (chat messages ending with the assistant's
    turn — TRL's conversational preference rows, UltraFeedback's) as a prompt/response row:
    the response is the last turn's content; the turns before it, when there are any, are
    the prompt (they include the prompt column's question), else the prompt column is.
    A string ``column`` is returned as is."""
    value = get_path(row, column)
    if isinstance(value, str) and value.lstrip()[:1] == "[":
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return row, column  # a response that merely starts with "["
    if not isinstance(value, list):
        return row, column
    if not value or not isinstance(value[-1], dict) or value[-1].get("role") != "assistant":
        raise RowProblem(
            f"column '{column}' is a message list that does not end with an assistant turn"
        )
    content = value[-1].get("content")
    if not isinstance(content, str):
        raise RowProblem(f"column '{column}' last turn has no text content")
    out = {**row, _RESPONSE: content}
    if len(value) > 1:
        out[prompt_key] = [dict(m) for m in value[:-1]]
    return out, _RESPONSE


def _side(
    encoder: Encoder,
    row: dict[str, Any],
    column: str,
    cfg: TemperConfig,
    where: str,
    columns: PairColumns,
) -> SFTExample:
    """One response of a pair as a cut SFT sample (RowProblem when nothing is left)."""
    text_row, response_column = _as_text_row(row, column, cfg.data.prompt_key)
    try:
        prompt, response, mask = encoder.encode(text_row, response_column)
    except RowProblem as err:  # name the user's column, not the internal one
        named = str(err).replace(f"'{_RESPONSE}'", f"'{column}' (its last turn)")
        raise RowProblem(named) from err
    length = len(prompt) + len(response)
    limit = columns.max_length
    mode = cfg.data.truncation
    if length > limit and mode == "error":
        raise DataError(
            f"{columns.section}.max_length",
            f"the sample at {where} has {length} tokens (prompt and '{column}'), more than "
            f"max_length={limit}",
            f"raise {columns.section}.max_length, or set data.truncation to left or right",
        )
    kept = truncate(prompt, response, mask, limit, mode)
    if kept is None:
        raise RowProblem(
            f"nothing of '{column}' left to learn after cutting its {length} tokens to "
            f"max_length={limit} ({mode} truncation)"
        )
    return SFTExample(tuple(kept[0]), tuple(kept[1]), tuple(kept[2]), where, length > limit)


def build_pair_dataset(
    files: Sequence[str],
    cfg: TemperConfig,
    tokenizer: Any,
    name: str,
    key: str,
    limit: int,
    columns: PairColumns | None = None,
) -> PairDataset:
    """Load, template, tokenize and cut the pairs of ``files`` (``key``: the config key
    that named them; ``columns``: the pipeline's pair settings, DPO's by default). Raises :class:`DataError` for unreadable files, a bad row under
    ``bad_rows=error``, an overlong sample under ``truncation=error``, and no usable
    pair; ``limit > 0`` keeps the first that many usable pairs."""
    data = cfg.data
    cols = columns or PairColumns.of("dpo", cfg.dpo)
    check_template(data, tokenizer)
    encoder = Encoder(cfg, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else encoder.eos
    pairs: list[PairExample] = []
    skipped = SkippedRows(key, data.bad_rows)
    rows = 0
    for item in read_rows(files, key):
        if 0 < limit <= len(pairs):
            break
        rows += 1
        where = f"{item.file}:{item.where}"
        try:
            if item.problem is not None:
                raise RowProblem(item.problem)
            assert item.row is not None
            chosen = _side(encoder, item.row, cols.chosen_key, cfg, where, cols)
            rejected = _side(encoder, item.row, cols.rejected_key, cfg, where, cols)
            if chosen.response_ids == rejected.response_ids:
                raise RowProblem(
                    f"'{cols.chosen_key}' and '{cols.rejected_key}' are the same response: "
                    "the pair prefers nothing"
                )
        except RowProblem as err:
            skipped.add(RowIssue(item.file, item.where, str(err)))
            continue
        pairs.append(PairExample(chosen, rejected))
    skipped.summarize(f"{name} data", rows)
    if rows == 0:
        raise empty_files_error(key, files)
    if not pairs:
        raise DataError(
            key,
            f"no usable pair in {list(files)}: {rows} rows read, {len(skipped)} malformed"
            f"{skipped.first()}",
            f"check the files and data.prompt_key / {cols.section}.chosen_key / "
            f"{cols.section}.rejected_key",
        )
    return PairDataset(pairs, int(pad), name, skipped.issues, rows)


def build_pair_datasets(
    cfg: TemperConfig, tokenizer: Any, columns: PairColumns | None = None
) -> tuple[PairDataset | None, PairDataset | None]:
    """The train and validation pairs of a run (None where no files are given; ``columns``:
    the pipeline's pair settings, DPO's by default); ``data.train_max_samples`` /
    ``val_max_samples`` keep the first N usable pairs."""
    data = cfg.data
    cols = columns or PairColumns.of("dpo", cfg.dpo)
    train = val = None
    if data.train_files:
        train = build_pair_dataset(
            data.train_files,
            cfg,
            tokenizer,
            "train",
            "data.train_files",
            data.train_max_samples,
            cols,
        )
    if data.val_files:
        val = build_pair_dataset(
            data.val_files, cfg, tokenizer, "val", "data.val_files", data.val_max_samples, cols
        )
    return train, val
