"""The first-release upstream files (roll-v0, verl 0.8's flat config) in detail: their
translation, rejections and ``temper convert`` round trips. Every upstream file of every
snapshot is classified by ``test_upstream_replay``.

The roll-v0 files train with Megatron-Core and DeepSpeed on 16 and 8 devices.
"""

from __future__ import annotations

import pytest
import yaml
from reference_paths import UPSTREAM, needs  # next to this file

from temper.cli.main import main
from temper.config.errors import ConfigError
from temper.pipelines.catalog import load_config

RLVR = "roll-v0/qwen2.5-7B-rlvr_megatron/rlvr_config.yaml"
AGENTIC = "roll-v0/qwen2.5-0.5B-agentic_ds/agentic_val_sokoban.yaml"
FLAT = "verl-0.8/ppo_trainer_flat.yaml"
# Pipeline configs: None = passes `temper check`; a string = the exact rejection.
PIPELINES: dict[str, str | None] = {FLAT: None, AGENTIC: None, RLVR: None}
# Hydra `defaults:` fragments (definitions such as `deepspeed_zero2: {...}` that a
# pipeline file composes with `- ../config/deepspeed_zero2@_here_`): not configs on
# their own, so a standalone check names their top-level key as unknown.
FRAGMENTS = {
    f"roll-v0/config/{name}.yaml": name
    for name in (
        "deepspeed_zero",
        "deepspeed_zero2",
        "deepspeed_zero2_cpuoffload",
        "deepspeed_zero3",
        "deepspeed_zero3_cpuoffload",
    )
}
FRAGMENTS["roll-v0/config/envs.yaml"] = "custom_env"


def _load(rel: str, overrides: list[str] | None = None):
    """What ``temper check`` runs: load, translate, build, validate with registry names."""
    return load_config(UPSTREAM / rel, overrides)


def _one_line(err: ConfigError) -> str:
    text = str(err)
    assert "\n" not in text, text
    return text


@needs(UPSTREAM)
@pytest.mark.parametrize("rel", sorted(PIPELINES))
def test_pipeline_config_passes_or_is_rejected_as_documented(rel):
    expected = PIPELINES[rel]
    if expected is None:
        loaded = _load(rel)
        assert loaded.dialect == ("verl" if rel.startswith("verl") else "roll")
        return
    with pytest.raises(ConfigError) as err:
        _load(rel)
    assert _one_line(err.value) == expected


@needs(UPSTREAM)
@pytest.mark.parametrize("rel", sorted(FRAGMENTS))
def test_defaults_fragment_alone_names_its_key(rel):
    with pytest.raises(ConfigError) as err:
        _load(rel)
    assert _one_line(err.value).startswith(f"{FRAGMENTS[rel]}: unknown key")


@needs(UPSTREAM)
def test_rlvr_routes_all_five_reward_domains():
    """Every reward domain of ROLL's RLVR file scores with its temper counterpart;
    actor_infer on devices 0-11 of actor_train's 0-15 is ROLL's partial colocation, one
    pool of Ray bundles."""
    loaded = _load(RLVR)
    assert loaded.config.resources.actor_infer == list(range(12))
    routes = loaded.config.reward.routes
    assert {n: r.function for n, r in routes.items()} == {
        "crossthinkqa": "crossthinkqa",
        "ifeval": "ifeval",
        "math_rule": "math",
        "code_sandbox": "code",
        "llm_judge": "llm_judge",
    }


@needs(UPSTREAM)
@pytest.mark.parametrize("rel", [FLAT, AGENTIC])
def test_convert_round_trips(rel, tmp_path, capsys):
    """`temper convert` output, converted again, changes nothing (notes aside), and
    loads to the same config as the original file."""
    assert main(["convert", str(UPSTREAM / rel)]) == 0
    first = capsys.readouterr().out
    native = tmp_path / "native.yaml"
    native.write_text(first)
    assert main(["convert", str(native)]) == 0
    second = capsys.readouterr().out
    body = lambda text: [ln for ln in text.splitlines() if not ln.startswith("# note")]  # noqa: E731
    assert body(second) == body(first)
    assert load_config(native).config == load_config(UPSTREAM / rel).config


@needs(UPSTREAM / FLAT)
def test_flat_critic_optimizer_survives_convert(tmp_path, capsys):
    """verl's critic lr is 1e-5 (the native critic default); convert writes only the
    keys that differ (critic.optim: {warmup_steps: -1}), and reading that back must
    start from the critic's optimizer default, not OptimConfig's lr 1e-6."""
    assert main(["convert", str(UPSTREAM / FLAT)]) == 0
    text = capsys.readouterr().out
    data = yaml.safe_load(text)
    assert "lr" not in data["critic"]["optim"]
    native = tmp_path / "native.yaml"
    native.write_text(text)
    assert load_config(native).config.critic.optim.lr == 1e-5
