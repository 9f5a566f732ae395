"""An SFT config: its plan builds only the actor, and what it would read nothing of is
refused in one line naming the key."""

from __future__ import annotations

from typing import Any

import pytest

from temper.config.derive import explain
from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.config.typed import from_dict
from temper.config.validate import validate
from temper.pipelines.catalog import CATALOG, build_config

SFT: dict[str, Any] = {
    "pipeline": "sft",
    "model": {"path": "m"},
    "data": {"train_files": ["t.jsonl"], "train_batch_size": 4},
}


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def test_the_plan_builds_the_actor_alone():
    """No rollout engine, reference or critic — not even for keys that would turn them
    on in an RL run (validation alone, before the SFT check refuses those keys)."""
    cfg = from_dict(
        TemperConfig,
        merged(SFT, {"algorithm": {"adv_estimator": "gae"}, "actor": {"use_kl_loss": True}}),
    )
    plan = validate(cfg, CATALOG)
    assert plan.roles == ("actor",) and not plan.use_rollout
    assert plan.samples_per_step == 4
    rows = {name: value for name, value, _how in explain(cfg, plan)}
    assert rows["samples per step"] == "4"
    assert "critic" not in rows and "reference" not in rows
    assert "placement actor_infer" not in rows


REFUSED = [
    ({"rollout": {"n": 4}}, "rollout.n", "generates nothing"),
    ({"algorithm": {"adv_estimator": "gae"}}, "algorithm.adv_estimator", "no advantages"),
    ({"critic": {"enable": True}}, "critic.enable", "no critic"),
    ({"reward": {"function": "gsm8k"}}, "reward.function", "scores nothing"),
    ({"actor": {"use_kl_loss": True}}, "actor.use_kl_loss", "no reference"),
    ({"actor": {"entropy_coeff": 0.01}}, "actor.entropy_coeff", "NLL alone"),
    ({"data": {"max_prompt_length": 64}}, "data.max_prompt_length", "sft.max_length"),
    ({"data": {"truncation": "middle"}}, "data.truncation", "cut at one end"),
    (
        {"data": {"messages_key": "messages", "chat_template": "raw"}},
        "data.chat_template",
        "raw text has no turns",
    ),
    ({"experiment": {"rollout_data_dir": "d"}}, "experiment.rollout_data_dir", "generates"),
    ({"sft": {"max_length": 0}}, "sft.max_length", "must be > 0"),
    (
        {"actor": {"use_dynamic_bsz": True, "max_token_len_per_device": 100}},
        "actor.max_token_len_per_device",
        "cannot hold a prompt and its response of up to 1024 tokens (max_length)",
    ),
]


@pytest.mark.parametrize(("over", "key", "reason"), REFUSED, ids=[r[1] for r in REFUSED])
def test_keys_an_sft_run_would_not_read_are_refused(over, key, reason):
    with pytest.raises(ConfigError) as err:
        build_config(merged(SFT, over))
    assert err.value.key == key and reason in err.value.reason, err.value


def test_the_sft_section_is_refused_under_rl():
    cfg = {"model": {"path": "m"}, "data": {"train_files": ["t"]}, "sft": {"max_length": 64}}
    with pytest.raises(ConfigError, match="configures the sft or distill pipeline") as err:
        build_config(cfg)
    assert err.value.key == "sft"


def test_an_sft_config_builds():
    cfg = build_config(merged(SFT, {"sft": {"max_length": 256}, "model": {"lora": {"rank": 8}}}))
    assert cfg.pipeline == "sft" and cfg.sft.max_length == 256
