"""YAML composition (Hydra defaults), overrides and interpolation."""

from pathlib import Path

import pytest
from reference_paths import UPSTREAM as REF  # next to this file
from reference_paths import needs

from temper.config.errors import ConfigError
from temper.config.loader import load_yaml, parse_override


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_defaults_here_and_self_order(tmp_path):
    write(tmp_path / "config" / "base.yaml", "a: 1\nb: {x: 1}\nds: {stage: 2}\n")
    main = write(
        tmp_path / "exp" / "main.yaml",
        "defaults:\n  - ../config/base@_here_\n  - _self_\nb: {y: 2}\nuse: ${ds}\n",
    )
    raw = load_yaml(main)
    # the file's own keys merge after its defaults (_self_ last)
    assert raw.data["a"] == 1
    assert raw.data["b"] == {"x": 1, "y": 2}
    assert raw.data["use"] == {"stage": 2}
    assert raw.from_defaults == {"a", "ds"}


def test_self_first_lets_defaults_win(tmp_path):
    write(tmp_path / "base.yaml", "a: 1\n")
    main = write(tmp_path / "main.yaml", "defaults:\n  - _self_\n  - base\na: 2\n")
    assert load_yaml(main).data["a"] == 1


def test_group_option_and_package(tmp_path):
    write(tmp_path / "db" / "mysql.yaml", "port: 3306\n")
    write(tmp_path / "other.yaml", "k: v\n")
    main = write(tmp_path / "main.yaml", "defaults:\n  - db: mysql\n  - other@sub.pkg\n")
    data = load_yaml(main).data
    assert data["db"] == {"port": 3306}
    assert data["sub"] == {"pkg": {"k": "v"}}


def test_missing_default_names_the_entry(tmp_path):
    main = write(tmp_path / "main.yaml", "defaults:\n  - nope@_here_\n")
    with pytest.raises(ConfigError, match=r"defaults: In 'main': Could not load 'nope'.*does not"):
        load_yaml(main)
    # Hydra's `optional` marks a group entry whose option may be missing
    ok = write(tmp_path / "opt.yaml", "defaults:\n  - optional db: nope\nx: 1\n")
    assert load_yaml(ok).data == {"x": 1}


def test_overrides_reach_interpolations(tmp_path):
    main = write(
        tmp_path / "m.yaml", "response_length: 8\ngen:\n  max_new_tokens: ${response_length}\n"
    )
    raw = load_yaml(main, ["response_length=32", "+extra.list=[1,2]", "gen.temperature=0.5"])
    assert raw.data["gen"] == {"max_new_tokens": 32, "temperature": 0.5}
    assert raw.data["extra"] == {"list": [1, 2]}
    raw = load_yaml(main, ["~gen"])
    assert "gen" not in raw.data


def test_override_errors():
    with pytest.raises(ConfigError, match="not an override"):
        parse_override("novalue")
    assert parse_override("a.b=1e-6") == ("", "a.b", 1e-6)
    assert parse_override("++a=null") == ("++", "a", None)


def test_plus_on_existing_key_fails(tmp_path):
    main = write(tmp_path / "m.yaml", "a: 1\n")
    with pytest.raises(ConfigError, match="already set"):
        load_yaml(main, ["+a=2"])


def test_bad_interpolation_names_the_key(tmp_path):
    main = write(tmp_path / "m.yaml", "a: ${nothere}\n")
    with pytest.raises(ConfigError, match="cannot resolve"):
        load_yaml(main)


def test_scientific_notation_is_a_float(tmp_path):
    main = write(tmp_path / "m.yaml", "lr: 1e-6\nother: 5\n")
    assert load_yaml(main).data["lr"] == 1e-6


@needs(REF)
def test_upstream_roll_file_composes():
    raw = load_yaml(REF / "roll-v0" / "qwen2.5-0.5B-agentic_ds" / "agentic_val_sokoban.yaml")
    strategy = raw.data["actor_train"]["strategy_args"]
    assert strategy["strategy_config"]["zero_optimization"]["stage"] == 2
    assert "deepspeed_zero3" in raw.from_defaults


def test_override_values_hydra_grammar():
    # YAML flow syntax rejects '?' inside brackets; Hydra's grammar reads a string list
    assert parse_override("data.train_files=[task:arith?n=5&seed=1,b.jsonl]")[2] == [
        "task:arith?n=5&seed=1",
        "b.jsonl",
    ]
    assert parse_override("x=[1, 2]")[2] == [1, 2]
    assert parse_override("x=task:a?n=1")[2] == "task:a?n=1"


def test_yaml_errors_are_one_line(tmp_path):
    bad = write(tmp_path / "bad.yaml", "a: [1, 2\nb: 3\n")
    with pytest.raises(ConfigError) as err:
        load_yaml(bad)
    assert "\n" not in str(err.value)
