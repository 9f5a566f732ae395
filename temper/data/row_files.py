"""The file formats rows of a dataset are kept in, and writing rows to one.

:mod:`temper.data.sources` reads the same formats back (csv cells holding lists or dicts
are JSON-encoded here and parsed there).
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SUFFIXES = (".parquet", ".jsonl", ".json", ".csv")


def write_rows(rows: Iterable[dict[str, Any]], path: str | Path) -> Path:
    """Write rows to ``path`` in the format of its suffix (parquet, jsonl, json, csv).

    csv cells holding lists/dicts are JSON-encoded so :func:`read_rows` gets them back.
    """
    out = Path(os.path.expanduser(str(path)))
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = list(rows)
    if out.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        # from_pylist takes the columns of the first row only; give it all of them.
        columns = list(dict.fromkeys(k for row in rows for k in row))
        table = pa.Table.from_pylist([{k: row.get(k) for k in columns} for row in rows])
        pq.write_table(table, out)
    elif out.suffix == ".jsonl":
        with out.open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    elif out.suffix == ".json":
        out.write_text(json.dumps(rows, ensure_ascii=False, indent=1), encoding="utf-8")
    elif out.suffix == ".csv":
        columns = list(dict.fromkeys(k for row in rows for k in row))
        with out.open("w", encoding="utf-8", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns)
            writer.writeheader()
            for row in rows:
                writer.writerow(
                    {
                        k: json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else v
                        for k, v in row.items()
                    }
                )
    else:
        raise ValueError(f"cannot write '{out.suffix}' files; use one of {', '.join(SUFFIXES)}")
    return out
