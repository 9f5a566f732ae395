"""How the data layer reports bad input: one error type, one record per skipped row.

A data problem is a configuration problem in disguise (wrong file, wrong column, a
length limit too small), so :class:`DataError` *is* a :class:`ConfigError`: the CLI prints
both the same way, as ``<key>: <reason>. Fix: <fix>``.
"""

from __future__ import annotations

import dataclasses
import logging
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


log = logging.getLogger("temper.data")


class SkippedRows:
    """The malformed rows one load of ``key``'s files skips, as every loader reports them:
    under ``data.bad_rows=error`` the first one fails the load; under ``skip`` each is
    kept (the datasets' ``skipped_rows`` metric), the first :attr:`LOGGED` are logged as
    they come, and :meth:`summarize` logs the count at the end."""

    #: Skipped rows logged one by one; the rest are counted in the summary only.
    LOGGED = 10

    def __init__(self, key: str, bad_rows: str) -> None:
        self.key, self.bad_rows = key, bad_rows
        self.issues: list[RowIssue] = []

    def __len__(self) -> int:
        return len(self.issues)

    def add(self, issue: RowIssue) -> None:
        """Skip one row (or fail the load under ``data.bad_rows=error``)."""
        if self.bad_rows == "error":
            raise DataError(
                self.key,
                f"malformed row {issue}",
                "fix or remove the row, or set data.bad_rows=skip to report and skip such rows",
            )
        if len(self.issues) < self.LOGGED:
            log.warning("skipping malformed row %s", issue)
        self.issues.append(issue)

    def summarize(self, what: str, rows_read: int) -> None:
        """One line at the end of a load that skipped rows (``what``: the data's name)."""
        if self.issues:
            log.warning(
                "%s: skipped %d of %d rows as malformed (first: %s)",
                what,
                len(self.issues),
                rows_read,
                self.issues[0],
            )

    def first(self) -> str:
        """`` (first skipped: <issue>)`` for a load that kept nothing, or ``""``."""
        return f" (first skipped: {self.issues[0]})" if self.issues else ""


def empty_files_error(key: str, files: str | Path | Sequence[str | Path]) -> DataError:
    """The files of ``key`` hold no row at all (empty, or blank lines only): said as such,
    not as a missing prompt column of a file that has no columns."""
    names = [str(files)] if isinstance(files, (str, Path)) else [str(f) for f in files]
    what = f"{names[0]} is empty" if len(names) == 1 else f"{', '.join(names)} are empty"
    return DataError(key, f"{what} (no rows)", f"point {key} at a file that holds prompts")
