"""verl's recipe trainers that temper runs in its RLVR loop: their recipe files translate
to the recipe's own estimator, loss and parameters, and keys the recipe's trainer does
not read are noted as such."""

from __future__ import annotations

from typing import Any

import pytest
from reference_paths import UPSTREAM  # next to this file
from upstream_replay import Row, check  # next to this file
from upstream_scripts import script_commands  # next to this file

from temper.config.dialects.verl.translate import translate_verl
from temper.config.loader import RawConfig, load_yaml
from temper.config.schema import TemperConfig
from temper.config.typed import from_dict
from temper.pipelines.catalog import CATALOG

RECIPES = UPSTREAM / "verl-2025-06-38d9a88" / "recipe"
SPPO = RECIPES / "sppo" / "config" / "sppo_trainer.yaml"


def translate(path: Any, *overrides: str) -> tuple[TemperConfig, list[str]]:
    data = load_yaml(path, list(overrides)).data
    tr = translate_verl(RawConfig(data=data, source=str(path)), CATALOG)
    return from_dict(TemperConfig, tr.native), tr.notes


def noted_as(notes: list[str], key: str) -> str:
    return next(n for n in notes if key in n.split(": ", 1)[0].split(", "))


# ------------------------------------------------------------------ SPPO


def test_sppo_file_runs_the_sppo_estimator_and_loss_with_its_etas():
    cfg, notes = translate(SPPO, "algorithm.sppo_eta=0.5", "actor_rollout_ref.actor.sppo_eta=2.0")
    assert cfg.algorithm.adv_estimator == "sppo"
    assert cfg.algorithm.sppo_beta == 0.5  # the soft-mean baseline's temperature
    assert cfg.actor.policy_loss == "sppo"
    assert cfg.actor.policy_loss_kwargs == {"sppo_eta": 2.0}
    # the recipe's null estimator is SPPO's, not "the temper default"
    assert not any("algorithm.adv_estimator" in n for n in notes), notes


@pytest.mark.parametrize(
    "key", ["algorithm.adv_estimator", "actor_rollout_ref.actor.policy_loss.loss_mode"]
)
def test_sppo_trainer_reads_no_estimator_or_loss_mode(key):
    cfg, notes = translate(SPPO, f"{key}=gspo" if "loss" in key else f"{key}=grpo")
    assert cfg.algorithm.adv_estimator == "sppo" and cfg.actor.policy_loss == "sppo"
    assert "SPPO trainer computes its own" in noted_as(notes, key)


def test_sppo_recipe_passes_temper_check_on_an_engine_temper_has():
    """The file names sglang, for which temper has no adapter; with vLLM it passes."""
    row = Row("sppo", SPPO, ("actor_rollout_ref.rollout.name=vllm",))
    assert check(row) == "passes"


def test_sppo_script_passes_temper_check_on_an_engine_temper_has():
    script = RECIPES / "sppo" / "run_qwen2.5-7b_rm.sh"
    (cmd,) = script_commands(script, UPSTREAM / "verl-2025-06-38d9a88")
    row = Row("sppo.sh", cmd.config, (*cmd.overrides, "actor_rollout_ref.rollout.name=vllm"))
    assert check(row) == "passes"
