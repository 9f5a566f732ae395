"""ROLL's GEM files through the ROLL dialect: StepConcatEnvManager, step_reinforce and the
env tool wrappers, and the upstream files as `temper check` reads them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from temper.config.dialects.roll.gigpo import CONCAT
from temper.config.dialects.roll.translate import translate_roll
from temper.config.errors import ConfigError
from temper.config.loader import RawConfig
from temper.config.schema import TemperConfig
from temper.config.typed import from_dict
from temper.pipelines.catalog import load_config

GEM = (
    Path(__file__).resolve().parents[2]
    / "data/upstream/roll-2026-08-8eb27cc/examples/qwen3_agentic_gem"
)
PYTHON = {
    "wrapper_args": {"tool_reward": 0, "tool_success_reward": 0.1, "max_tool_uses": 1},
    "tool_configs": [
        {
            "tool_id": "python_code",
            "tool_args": {"timeout": 5, "sandbox_type": "none", "keep_error_last_line": False},
        }
    ],
}


def gem(tag: dict[str, Any], **top: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "adv_estimator": "reinforce",
        "rollout_batch_size": 4,
        "sequence_length": 1024,
        "actor_infer": {"generating_args": {"max_new_tokens": 128}},
        "actor_train": {"training_args": {"learning_rate": 1e-6}},  # a training file
        "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["A"]},
        "val_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["A"]},
        "custom_envs": {"A": tag},
    }
    base.update(top)
    return base


def run(data: dict[str, Any]) -> tuple[TemperConfig, list[str]]:
    t = translate_roll(RawConfig(data=data, source="<test>", from_defaults=set()))
    return from_dict(TemperConfig, t.native), t.notes


def test_step_concat_and_step_reinforce() -> None:
    tag = {"env_type": "game:GuessTheNumber-v0", "env_manager_cls": CONCAT, "history_length": 5}
    cfg, _ = run(gem(tag, adv_estimator="step_reinforce", step_reward_gamma=0.9))
    assert cfg.agentic.env_manager == "step_concat"
    assert cfg.agentic.custom_envs["A"].history_length == 5
    assert cfg.algorithm.adv_estimator == "reinforce"
    assert (cfg.agentic.step_score, cfg.agentic.step_score_gamma) == ("return_to_go", 0.9)
    assert cfg.data.max_prompt_length == 1024 - 128  # one step's prompt and answer


def test_tool_wrapper_translates() -> None:
    tag = {"env_type": "roll_math", "env_config": {"dataset_name": "x"}, "tool_wrapper": PYTHON}
    cfg, notes = run(gem(tag))
    w = cfg.agentic.custom_envs["A"].tool_wrapper
    assert w.tools == {
        "python_code": {"timeout": 5, "sandbox": "bwrap", "keep_error_last_line": False}
    }
    assert (w.tool_reward, w.tool_success_reward, w.max_tool_uses) == (0, 0.1, 1)
    assert any("sandbox_type: none" in n and "bubblewrap" in n for n in notes)


@pytest.mark.parametrize(
    ("wrapper", "key"),
    [
        ({**PYTHON, "extra": 1}, "tool_wrapper.extra"),
        ({"wrapper_args": {"max_uses": 1}}, "tool_wrapper.wrapper_args.max_uses"),
        (
            {"tool_configs": [{"tool_id": "python_code", "tool_args": {"sandbox_type": "docker"}}]},
            "tool_configs[0].tool_args.sandbox_type",
        ),
    ],
)
def test_tool_wrapper_refusals_name_the_key(wrapper: dict[str, Any], key: str) -> None:
    tag = {"env_type": "roll_math", "env_config": {"dataset_name": "x"}, "tool_wrapper": wrapper}
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        run(gem(tag))


def test_an_mcp_tool_is_refused_only_on_a_played_tag() -> None:
    mcp = {"tool_configs": [{"tool_id": "mcp", "tool_args": {"server_url": "x"}}]}
    qa = {"env_type": "roll_qa", "env_config": {"dataset_name": "x"}}
    data = gem(qa)
    data["custom_envs"]["M"] = {**qa, "tool_wrapper": mcp}
    path = GEM / "gem_math_hotpotqa_search.yaml"  # defines an MCP tag it does not play
    assert load_config(path).config.agentic.custom_envs["HotpotQA_with_mcp"].tool_wrapper.tools
    data["train_env_manager"]["tags"] = ["M"]
    cfg, _ = run(data)
    from temper.pipelines.agentic import check

    with pytest.raises(ConfigError, match="tools.mcp: the mcp tool cannot run here"):
        check(cfg)


@pytest.mark.parametrize("name", sorted(p.name for p in GEM.glob("*.yaml")))
def test_upstream_gem_files_load(name: str) -> None:
    cfg = load_config(GEM / name).config
    manager = cfg.agentic.env_manager
    if name.startswith(("gem_game", "gem_rg")):
        assert manager == "step_concat" and cfg.agentic.step_score == "return_to_go"
    else:
        assert manager == "trajectory" and cfg.algorithm.adv_estimator == "reinforce"


def test_check_says_when_a_dataset_or_retriever_is_not_here(tmp_path) -> None:
    from temper.pipelines.preflight import preflight

    path = GEM / "gem_math_dapo_python_code.yaml"
    loaded = load_config(path)
    with pytest.raises(ConfigError) as err:
        try:
            preflight(loaded.config, loaded.plan, checks=("pipeline",))
        except ConfigError as e:
            raise loaded.in_dialect(e) from e
    assert "dapo_17k_with_python_code.env_config" in str(err.value)
    assert "open-r1/DAPO-Math-17k-Processed is not a local file" in str(err.value)
    data = tmp_path / "dapo.jsonl"
    data.write_text('{"prompt": "1+1?", "solution": "2"}\n')
    key = "gem_math.dapo_17k_with_python_code.env_config.dataset_name"
    loaded = load_config(path, [f"{key}={data}"])
    preflight(loaded.config, loaded.plan, checks=("pipeline",))  # data here, bwrap runs
    search = load_config(GEM / "gem_math_hotpotqa_search.yaml")
    tag = search.config.agentic.custom_envs["HotpotQA_with_search"]
    tag.env_config["dataset_name"] = str(data)
    tag.tool_wrapper.tools["search"]["search_url"] = "http://127.0.0.1:9/retrieve"  # closed
    with pytest.raises(ConfigError, match=r"tools\.search: the retriever at http://127\.0\.0\.1:9"):
        preflight(search.config, search.plan, checks=("pipeline",))
