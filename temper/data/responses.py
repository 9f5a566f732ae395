"""Files of responses to score (``temper eval``; verl ``main_eval``'s input, and what
``temper generate`` writes): each row holds a prompt's responses and what a reward
function reads about it.

A row's responses are the column ``evaluate.response_key`` (a dotted path): a list of
strings, or one string. A row without it, with no responses, or with a response that
is not a string is reported by file and row and skipped (``data.bad_rows=error``: the
load fails), as prompt rows are. The data source, ground truth, extra info and tag are
read with the prompt dataset's keys and fallbacks (:mod:`temper.data.prompts`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from temper.config.schema import TemperConfig
from temper.data.errors import (
    DataError,
    RowIssue,
    RowProblem,
    SkippedRows,
    empty_files_error,
)
from temper.data.prompts import MISSING, data_source_of, get_path, ground_truth_of
from temper.data.sources import read_rows


@dataclasses.dataclass(frozen=True)
class ResponseRow:
    """One prompt's responses and what its reward reads."""

    responses: tuple[str, ...]
    data_source: str
    ground_truth: Any
    extra_info: Any
    tag: str
    prompt: Any  # the prompt column's value (a string or chat messages), None when absent
    source: str  # "file:row N"


def _responses(row: dict[str, Any], column: str) -> tuple[str, ...]:
    value = get_path(row, column)
    if value is MISSING or value is None:
        raise RowProblem(f"no responses: the row has no '{column}' column")
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list | tuple):
        raise RowProblem(
            f"column '{column}' must be a list of strings or a string, got {type(value).__name__}"
        )
    if not value:
        raise RowProblem(f"no responses: column '{column}' is an empty list")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise RowProblem(
                f"response {i} of column '{column}' is a {type(item).__name__}, not a string"
            )
    return tuple(value)


def parse_response_row(row: dict[str, Any], cfg: TemperConfig, source: str) -> ResponseRow:
    """A row's responses and reward inputs; ``RowProblem`` for a bad row."""
    data = cfg.data
    responses = _responses(row, cfg.evaluate.response_key)
    data_source = data_source_of(row, data.data_source_key)
    tag = get_path(row, data.tag_key)
    extra = get_path(row, data.extra_info_key)
    prompt = get_path(row, data.prompt_key)
    return ResponseRow(
        responses=responses,
        data_source=data_source,
        ground_truth=ground_truth_of(row, data.ground_truth_key),
        extra_info=None if extra is MISSING else extra,
        tag=data_source if tag is MISSING or tag is None else str(tag),
        prompt=None if prompt is MISSING else prompt,
        source=source,
    )


def load_response_rows(
    files: str | Path | Sequence[str | Path], cfg: TemperConfig, key: str = "evaluate.files"
) -> tuple[list[ResponseRow], list[RowIssue]]:
    """Every usable row of ``files`` and the issues of the rows skipped; ``DataError``
    for unreadable or empty files, a bad row under ``data.bad_rows=error``, and files
    with no usable row."""
    rows: list[ResponseRow] = []
    skipped = SkippedRows(key, cfg.data.bad_rows)
    read = 0
    for item in read_rows(files, key):
        read += 1
        try:
            if item.problem is not None:
                raise RowProblem(item.problem)
            assert item.row is not None
            rows.append(parse_response_row(item.row, cfg, f"{item.file}:{item.where}"))
        except RowProblem as err:
            skipped.add(RowIssue(item.file, item.where, str(err)))
    if read == 0:
        raise empty_files_error(key, files)
    skipped.summarize(key, read)
    if not rows:
        raise DataError(
            key,
            f"no usable row in {files}: {read} rows read, {len(skipped)} malformed "
            f"(first: {skipped.issues[0]})",
            f"check the files and evaluate.response_key ({cfg.evaluate.response_key})",
        )
    return rows, skipped.issues
