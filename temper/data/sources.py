"""Reading rows of prompt datasets: parquet, jsonl, json, csv, datasets dirs (writing them:
:mod:`temper.data.row_files`).

Every reader yields :class:`SourceRow` records that carry the file and the position of
the row, so a bad row can be reported as ``file:line 7`` instead of crashing or being
dropped silently. A row that cannot even be parsed (a broken jsonl line) is yielded with
``problem`` set; deciding whether to skip it or fail is the dataset's job, not the reader's.

Formats (chosen by suffix; a directory is a saved ``datasets`` dataset when it holds
``dataset_info.json``/``state.json``/``dataset_dict.json``, else every supported file in it):

- ``.parquet`` (verl's format) — read with pyarrow, nested columns stay Python lists/dicts;
- ``.jsonl`` — one object per line, blank lines ignored;
- ``.json`` — a list of objects or ``{"data": [...]}`` (a file of JSON lines also works);
- ``.csv`` — header row; empty cells are missing values, cells holding a JSON list/object
  (``[...]``/``{...}``) are parsed, since that is how nested columns survive csv.

Text files are read as UTF-8 with an optional byte-order mark (``utf-8-sig``): editors
on Windows and Excel's csv export write one, and read as plain UTF-8 it would make the
first jsonl line unparsable and rename the first csv column.
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from temper.data.errors import DataError
from temper.data.row_files import SUFFIXES
from temper.data.tasks import resolve_task_uri

#: UTF-8 that drops a leading byte-order mark (see the module doc).
TEXT_ENCODING = "utf-8-sig"
_DATASETS_MARKERS = ("dataset_info.json", "state.json", "dataset_dict.json")


@dataclasses.dataclass(frozen=True)
class SourceRow:
    """One row read from a file, or the reason it could not be read (``problem``)."""

    file: str
    where: str
    row: dict[str, Any] | None
    problem: str | None = None


def expand_files(files: str | Path | Sequence[str | Path], key: str) -> list[Path]:
    """Resolve one path or a list of paths (``~``, ``$VARS``, globs, directories) to files.

    ``key`` is the config key the paths came from, named in the error if one is missing.
    """
    items = [files] if isinstance(files, (str, Path)) else list(files)
    out: list[Path] = []
    for item in items:
        if str(item).startswith("task:"):
            out.append(resolve_task_uri(str(item)))
            continue
        text = os.path.expandvars(os.path.expanduser(str(item)))
        path = Path(text)
        if not path.exists() and glob.has_magic(text):
            matches = sorted(Path(p) for p in glob.glob(text))
            if not matches:
                raise DataError(key, f"no file matches '{item}'", "check the pattern")
            out.extend(matches)
            continue
        if not path.exists():
            raise DataError(
                key,
                f"file not found: {item}",
                f"check the path (relative paths start at {Path.cwd()})",
            )
        if path.is_dir() and not is_datasets_dir(path):
            inner = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file())
            if not inner:
                raise DataError(
                    key,
                    f"directory {item} holds no {', '.join(SUFFIXES)} file and is not a "
                    "saved datasets directory",
                    "point at a data file or a datasets.save_to_disk directory",
                )
            out.extend(inner)
            continue
        if path.is_file() and path.suffix not in SUFFIXES:
            raise DataError(
                key,
                f"unsupported file type '{path.suffix}' of {item}",
                f"use one of {', '.join(SUFFIXES)} or a datasets.save_to_disk directory",
            )
        out.append(path)
    return out


def is_datasets_dir(path: Path) -> bool:
    """True for a directory written by ``datasets.Dataset(Dict).save_to_disk``."""
    return path.is_dir() and any((path / m).is_file() for m in _DATASETS_MARKERS)


def read_rows(
    files: str | Path | Sequence[str | Path], key: str = "data.files"
) -> Iterator[SourceRow]:
    """All rows of all ``files`` in order (see the module doc for formats)."""
    for path in expand_files(files, key):
        yield from read_file(path, key)


def read_file(path: Path, key: str = "data.files") -> Iterator[SourceRow]:
    """Rows of one file or datasets directory; file-level failures raise :class:`DataError`."""
    name = str(path)
    try:
        if path.is_dir():
            yield from _read_datasets_dir(path, key)
        elif path.suffix == ".parquet":
            yield from _read_parquet(path)
        elif path.suffix == ".jsonl":
            yield from _read_jsonl(path)
        elif path.suffix == ".json":
            yield from _read_json(path, key)
        else:
            yield from _read_csv(path)
    except DataError:
        raise
    except (OSError, ValueError, UnicodeDecodeError) as err:  # arrow errors are ValueErrors
        raise DataError(key, f"cannot read {name}: {err}", "check the file is not corrupt") from err


def _read_parquet(path: Path) -> Iterator[SourceRow]:
    import pyarrow.parquet as pq

    index = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            yield SourceRow(str(path), f"row {index}", row)
            index += 1


def _json_line(file: str, where: str, line: str) -> SourceRow:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as err:
        return SourceRow(file, where, None, f"unparsable JSON ({err.msg} at column {err.colno})")
    if not isinstance(value, dict):
        return SourceRow(file, where, None, f"expected a JSON object, got {type(value).__name__}")
    return SourceRow(file, where, value)


def _read_jsonl(path: Path) -> Iterator[SourceRow]:
    with path.open(encoding=TEXT_ENCODING) as fh:
        for lineno, line in enumerate(fh, start=1):
            if line.strip():
                yield _json_line(str(path), f"line {lineno}", line)


def _read_json(path: Path, key: str) -> Iterator[SourceRow]:
    text = path.read_text(encoding=TEXT_ENCODING)
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        # Many ".json" datasets are really JSON lines; read them line by line.
        for lineno, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                yield _json_line(str(path), f"line {lineno}", line)
        return
    if isinstance(value, dict) and isinstance(value.get("data"), list):
        value = value["data"]
    if not isinstance(value, list):
        raise DataError(
            key,
            f"{path} holds a JSON {type(value).__name__}, not a list of rows",
            'write a list of objects, {"data": [...]}, or one object per line (jsonl)',
        )
    for index, item in enumerate(value):
        if isinstance(item, dict):
            yield SourceRow(str(path), f"row {index}", item)
        else:
            problem = f"expected a JSON object, got {type(item).__name__}"
            yield SourceRow(str(path), f"row {index}", None, problem)


def _csv_cell(cell: str | None) -> Any:
    if cell is None or cell == "":
        return None
    stripped = cell.strip()
    if stripped[:1] in "[{" and stripped[-1:] in "]}":
        try:
            return json.loads(stripped)
        except json.JSONDecodeError:
            return cell
    return cell


def _read_csv(path: Path) -> Iterator[SourceRow]:
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # long prompts exceed the 128 KiB default
    with path.open(encoding=TEXT_ENCODING, newline="") as fh:
        reader = csv.DictReader(fh)
        start = reader.line_num + 1
        for raw in reader:
            where = f"line {start}"
            start = reader.line_num + 1
            if None in raw:  # more fields than the header names
                extra = len(raw[None])
                yield SourceRow(str(path), where, None, f"{extra} more field(s) than the header")
                continue
            yield SourceRow(str(path), where, {k: _csv_cell(v) for k, v in raw.items()})


def _read_datasets_dir(path: Path, key: str) -> Iterator[SourceRow]:
    try:
        import datasets
    except ImportError as err:
        raise DataError(
            key,
            f"{path} is a saved Hugging Face datasets directory but the 'datasets' package "
            "is not installed",
            "pip install 'temper-rl[dev]' (or pip install datasets), or export the data "
            "to parquet/jsonl",
        ) from err
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if len(loaded) != 1:
            splits = ", ".join(sorted(loaded))
            raise DataError(
                key,
                f"{path} holds several splits ({splits})",
                f"point at one split's directory, e.g. {path / sorted(loaded)[0]}",
            )
        loaded = next(iter(loaded.values()))
    for index, row in enumerate(loaded):
        yield SourceRow(str(path), f"row {index}", dict(row))
