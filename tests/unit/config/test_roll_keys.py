"""The ROLL dialect, key by key: the rows of ``roll_keys.py`` (the row language of the
verl key table, ``key_rows.py``) on ROLL's RLVR example config."""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

import pytest
from key_rows import apply_row, get_native, noted, parse_rows, parse_value  # next to this file
from reference_paths import UPSTREAM, needs  # next to this file
from roll_keys import ROWS  # the table next to this file

from temper.config.dialects.roll.translate import translate_roll
from temper.config.errors import ConfigError
from temper.config.loader import RawConfig, load_yaml
from temper.config.schema import TemperConfig
from temper.config.typed import from_dict

RLVR = UPSTREAM / "roll-v0/qwen2.5-7B-rlvr_megatron/rlvr_config.yaml"
ROW_LIST = parse_rows(ROWS)


@cache
def _rlvr() -> RawConfig:
    return load_yaml(RLVR)


def build(data: dict[str, Any]) -> tuple[TemperConfig, list[str]]:
    raw = _rlvr()
    tr = translate_roll(
        RawConfig(
            data=data,
            source="<test>",
            from_defaults=raw.from_defaults,
            referenced=raw.referenced,
        ),
        None,
    )
    return from_dict(TemperConfig, tr.native), tr.notes


@needs(RLVR)
@pytest.mark.parametrize(
    ("key", "value", "extras", "expect"), ROW_LIST, ids=[f"{r[0]}={r[1]}" for r in ROW_LIST]
)
def test_key(key, value, extras, expect):
    data = apply_row(copy.deepcopy(_rlvr().data), key, value, extras)
    if expect.startswith("!!"):
        with pytest.raises(ConfigError) as err:
            build(data)
        assert key in str(err.value)
        assert expect[2:].strip().lower() in str(err.value).lower()
        return
    cfg, notes = build(data)
    if expect == "noted":
        assert noted(notes, key), notes
        return
    target, _, wanted = expect[2:].strip().partition(" = ")
    want = parse_value(wanted) if wanted else parse_value(value)
    got = get_native(cfg, target)
    assert got == (pytest.approx(want) if isinstance(want, float) else want)
