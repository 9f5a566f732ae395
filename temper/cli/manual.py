"""Write the configuration manual (:mod:`temper.config.manual`) with the registries'
names: ``python -m temper.cli.manual docs/config.md`` (stdout without a path)."""

from __future__ import annotations

import sys
from pathlib import Path

from temper.config.manual import render
from temper.pipelines.catalog import CATALOG


def main(argv: list[str]) -> int:
    text = render(CATALOG)
    if argv:
        Path(argv[0]).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
