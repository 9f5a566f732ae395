"""docs/config.md is the schema and the dialect tables, rendered: complete and current."""

from __future__ import annotations

from pathlib import Path

from temper.config.manual import ROLL_TABLES, VERL_TABLES, native_keys, render
from temper.pipelines.catalog import CATALOG

PAGE = Path(__file__).resolve().parents[3] / "docs" / "config.md"


def test_the_checked_in_page_is_current():
    assert PAGE.read_text(encoding="utf-8") == render(CATALOG), (
        "docs/config.md is stale: run `python -m temper.cli.manual docs/config.md`"
    )


def test_every_native_key_has_its_row_with_type_default_and_doc():
    native_part = render(CATALOG).split("## verl keys read another way")[0]
    rows = {
        line.split(" | ")[0][3:-1]: line
        for line in native_part.splitlines()
        if line.startswith("| `")
    }
    for key, is_section in native_keys():
        if not is_section:
            row = rows[key]
            cells = row.split(" | ")
            assert cells[1] and cells[2].startswith("`") and cells[3], row


def test_every_upstream_key_is_on_the_page():
    text = render(CATALOG)
    for table in VERL_TABLES:
        missing = [k for k in table if f"`{k}`" not in text]
        assert not missing, missing[:5]
    for roll in ROLL_TABLES:
        missing = [k for k in roll.rules if f"`{k}`" not in text]
        assert not missing, missing[:5]


def test_a_verl_key_and_its_native_key_share_a_row():
    row = next(
        line
        for line in render(CATALOG).splitlines()
        if line.startswith("| `actor.clip_ratio_high`")
    )
    assert "`actor_rollout_ref.actor.clip_ratio_high`" in row
