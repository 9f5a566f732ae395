"""How the data layer reports bad input: one error type, one record per skipped row.

A data problem is a configuration problem in disguise (wrong file, wrong column, a
length limit too small), so :class:`DataError` *is* a :class:`ConfigError`: the CLI prints
both the same way, as ``<key>: <reason>. Fix: <fix>``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from temper.config.errors import ConfigError


class DataError(ConfigError):
    """A dataset that cannot be used as configured (missing file, bad row, overlong prompt)."""


@dataclasses.dataclass(frozen=True)
class RowIssue:
    """Why one input row was not used, and where it is: ``file:line 7: prompt is empty``.

    ``where`` is ``line N`` (1-based) for line-oriented files (jsonl, csv) and ``row N``
    (0-based, as pandas/datasets count) for the others.
    """

    file: str
    where: str
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.where}: {self.reason}"


class RowProblem(ValueError):
    """Raised while parsing one row; turned into a :class:`RowIssue` by the loader."""


def empty_files_error(key: str, files: str | Path | Sequence[str | Path]) -> DataError:
    """The files of ``key`` hold no row at all (empty, or blank lines only): said as such,
    not as a missing prompt column of a file that has no columns."""
    names = [str(files)] if isinstance(files, (str, Path)) else [str(f) for f in files]
    what = f"{names[0]} is empty" if len(names) == 1 else f"{', '.join(names)} are empty"
    return DataError(key, f"{what} (no rows)", f"point {key} at a file that holds prompts")
