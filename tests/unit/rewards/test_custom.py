"""Loading user reward functions from a file."""

from __future__ import annotations

from pathlib import Path

import pytest

from temper.config.errors import ConfigError
from temper.rewards.custom import load_custom_function


def test_loads_and_calls(user_reward_file: Path) -> None:
    fn = load_custom_function(str(user_reward_file), "compute_score")
    assert fn("x", "4", "4", None, bonus=0.5) == {"score": 1.5, "length": 1}


def test_missing_file_names_the_path_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^reward.custom_function.path: file .* does not exist"):
        load_custom_function(str(tmp_path / "nope.py"), "compute_score")


def test_unset_path() -> None:
    with pytest.raises(ConfigError, match=r"^reward.custom_function.path: is not set"):
        load_custom_function(None, "compute_score")


def test_missing_name_lists_functions(user_reward_file: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"^reward.custom_function.name: 'nope' is not defined.*raises"
    ):
        load_custom_function(str(user_reward_file), "nope")


def test_not_callable(user_reward_file: Path) -> None:
    with pytest.raises(ConfigError, match="is a int, not a function"):
        load_custom_function(str(user_reward_file), "NOT_CALLABLE")


def test_import_error_is_reported(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import not_a_module_xyz\n")
    with pytest.raises(ConfigError, match="importing .* raised ModuleNotFoundError"):
        load_custom_function(str(bad), "compute_score")
