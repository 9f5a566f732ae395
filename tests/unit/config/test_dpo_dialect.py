"""ROLL's DPO config as ``pipeline: dpo``: every key of its files is read (mapped, noted
or used by a derivation), each DPO key lands where it should, and what ROLL requires or
temper cannot honour is refused naming the key."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from reference_paths import UPSTREAM  # next to this file

from temper.config.dialects.roll.dpo import DPO_TABLE
from temper.config.dialects.roll.translate import translate_roll
from temper.config.errors import ConfigError
from temper.config.loader import RawConfig, load_yaml
from temper.config.schema import TemperConfig
from temper.config.typed import from_dict
from temper.config.validate import check_names
from temper.pipelines.catalog import CATALOG

DPO_DIR = UPSTREAM / "roll-2026-08-8eb27cc/examples/dpo_examples"
FILES = sorted(DPO_DIR.glob("*.yaml"))


@cache
def _base(path: Path) -> dict[str, Any]:
    return load_yaml(path, []).data


def build(data: dict[str, Any]) -> tuple[TemperConfig, list[str]]:
    tr = translate_roll(RawConfig(data=data, source="<test>"))
    cfg = from_dict(TemperConfig, tr.native)
    check_names(cfg, CATALOG)
    return cfg, tr.notes


def _leaves(data: Any, prefix: str = "") -> list[str]:
    if isinstance(data, dict) and data:
        return [k for key, v in data.items() for k in _leaves(v, f"{prefix}{key}.")]
    return [prefix[:-1]]


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_every_key_of_the_files_has_a_rule(path):
    """No key of ROLL's DPO files falls through: each is a row of the DPO table (a map,
    a note, a derivation's input) or under one (strategy configs, tracker kwargs)."""
    for key in _leaves(_base(path)):
        parts = key.split(".")
        assert any(DPO_TABLE.lookup(tuple(parts[:n])) for n in range(len(parts), 0, -1)), key


def test_dpo_keys_land_on_the_dpo_section():
    data = copy.deepcopy(_base(FILES[0]))
    data |= {"ipo": True, "beta": 0.25, "chosen_key": "good", "rejected_key": "bad"}
    cfg, notes = build(data)
    assert cfg.pipeline == "dpo" and cfg.dpo.loss_type == "ipo" and cfg.dpo.beta == 0.25
    assert (cfg.dpo.chosen_key, cfg.dpo.rejected_key) == ("good", "bad")
    assert cfg.data.prompt_key == "instruction" and any("instruction" in n for n in notes)
    assert cfg.data.val_files and cfg.data.val_files[0].endswith("comparison_gpt4_data_zh.json")
    data["label_smoothing"] = 0.1
    data["ipo"] = False
    cfg, _ = build(data)
    assert cfg.dpo.loss_type == "sigmoid" and cfg.dpo.label_smoothing == 0.1


def test_roll_requires_max_steps():
    data = copy.deepcopy(_base(FILES[0]))
    data["max_steps"] = 0
    with pytest.raises(ConfigError, match="max_steps"):
        build(data)


def test_unknown_key_is_refused_with_a_suggestion():
    data = copy.deepcopy(_base(FILES[0]))
    data["bta"] = 0.3
    with pytest.raises(ConfigError, match="bta"):
        build(data)


def test_sampling_keys_under_dpo_are_refused_with_why():
    """A DPO file that sets a key an RL run reads (here the rollout's sampling) is told
    the DPO pipeline generates nothing — by the pipeline's check, in ROLL's key."""
    from temper.pipelines.dpo import check

    cfg = TemperConfig(pipeline="dpo")
    cfg.data.train_files = ["x.jsonl"]
    cfg.rollout.n = 4
    with pytest.raises(ConfigError, match="generates nothing"):
        check(cfg)
    cfg.rollout.n = 1
    cfg.dpo.loss_type = "ipo"
    cfg.dpo.label_smoothing = 0.1
    with pytest.raises(ConfigError, match="dpo.label_smoothing"):
        check(cfg)
    cfg.dpo.label_smoothing = 0.0
    cfg.dpo.loss_type = "hinge_typo"
    with pytest.raises(ConfigError, match="dpo.loss_type"):
        check(cfg)
    cfg.dpo.loss_type = "sigmoid"
    cfg.actor.mini_batch_size = 3
    with pytest.raises(ConfigError, match="even"):
        check(cfg)
