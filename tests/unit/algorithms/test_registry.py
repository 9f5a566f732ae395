"""The Registry class (temper.registry, used by every layer) and the listing the config
validator uses."""

from __future__ import annotations

import ast
import pathlib

import pytest

import temper.algorithms as A
from temper.algorithms import Registry, UnknownNameError, check_name, registry_names


def test_register_get_aliases() -> None:
    reg: Registry[int] = Registry("thing")
    reg.add("one", 1, "uno")

    @reg.register("two")
    def two() -> int:
        return 2

    assert reg.get("one") == reg.get("uno") == 1
    assert reg.get("two") is two
    assert reg.names() == ["one", "two", "uno"]
    assert reg.primary_names() == ["one", "two"]
    assert reg.aliases() == {"uno": "one"}
    assert reg.canonical("uno") == "one"
    assert "one" in reg and "three" not in reg and 3 not in reg
    with pytest.raises(ValueError, match="already registered"):
        reg.add("one", 11)


def test_unknown_name_message_and_suggestion() -> None:
    reg: Registry[int] = Registry("adv_estimator")
    reg.add("grpo", 1)
    reg.add("gae", 2)
    with pytest.raises(UnknownNameError) as exc:
        reg.get("grpoo")
    e = exc.value
    assert isinstance(e, KeyError)
    assert e.suggestion == "grpo" and e.valid == ["gae", "grpo"]
    assert str(e) == "unknown adv_estimator 'grpoo', did you mean 'grpo'? Valid names: gae, grpo"
    with pytest.raises(UnknownNameError) as exc:
        reg.get("zzzzzz")
    assert exc.value.suggestion is None
    assert "did you mean" not in str(exc.value)


def test_registry_names_for_config_validator() -> None:
    names = registry_names()
    assert set(names) >= {
        "adv_estimator",
        "policy_loss",
        "kl_penalty",
        "kl_loss_type",
        "loss_agg_mode",
        "kl_ctrl.type",
        "reward_norm",
    }
    assert set(names["adv_estimator"]) == {
        "gae", "grpo", "rloo", "reinforce", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
        "remax", "opo", "gpg", "grpo_passk", "gdpo", "optimal_token_baseline",
        "tir_optimal_token_baseline", "gigpo", "sppo",
    }  # fmt: skip
    assert set(names["policy_loss"]) == {
        "vanilla", "gspo", "cispo", "gpg", "clip_cov", "kl_cov", "geo_mean", "sapo", "topr",
        "topr_score", "dppo_tv", "dppo_kl", "dro", "reinforce_is", "sppo",
    }  # fmt: skip
    assert {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full", "k3+", "k1+"} <= set(
        names["kl_penalty"]
    )
    assert names["loss_agg_mode"] == [
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
        "token-mean",
        "token-sum",
    ]
    assert names["kl_ctrl.type"] == ["adaptive", "fixed"]
    assert names["reward_norm"] == ["batch", "group", "running"]


def test_check_name() -> None:
    assert check_name("kl_penalty", "k3") == "low_var_kl"
    assert check_name("adv_estimator", "grpo") == "grpo"
    with pytest.raises(
        UnknownNameError, match="unknown adv_estimator 'grpoo', did you mean 'grpo'"
    ):
        check_name("adv_estimator", "grpoo")
    with pytest.raises(UnknownNameError, match="unknown kl_loss_type 'low_var'"):
        check_name("kl_loss_type", "low_var")
    with pytest.raises(UnknownNameError, match="algorithm config key"):
        check_name("adv_estimatr", "grpo")


def test_layer_rule_algorithms_import_only_torch_and_stdlib() -> None:
    """temper.algorithms may import torch, the standard library and itself — nothing else."""
    allowed_top = {"torch", "temper", "__future__", "collections", "dataclasses", "difflib",
                   "typing", "math"}  # fmt: skip
    pkg = pathlib.Path(A.__file__).parent
    for path in pkg.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""]
            else:
                continue
            for mod in mods:
                top = mod.split(".")[0]
                assert top in allowed_top, f"{path.name} imports {mod}"
                if top == "temper":  # itself, and the bottom-layer registry
                    ok = mod.startswith("temper.algorithms") or mod == "temper.registry"
                    assert ok, f"{path.name} imports {mod}"
