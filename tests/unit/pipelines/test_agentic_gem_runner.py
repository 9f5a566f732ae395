"""The GEM agent-runner env manager (ROLL's ProxyEnvManager + GEMRunner) with a scripted
policy: the instruction in the system message, every user message the tag's template,
no note after an invalid answer, one sample per episode scored with its return."""

from __future__ import annotations

import pytest
from doubles import ScriptedEngine, turn_index

from temper.config.errors import ConfigError
from temper.envs import EnvManager
from temper.pipelines import agentic
from temper.pipelines.agentic_gem_runner import GEMRunnerPlayer, gem_system_message
from temper.pipelines.catalog import build_config
from temper.rollout.base import SamplingParams

LAKE = ["SFF", "FHF", "FFG"]
TEMPLATE = (
    "Turn {turn_idx}:\n{observation}\n{actions_left} left, {max_response_length} tokens.{suffix}"
)


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


def config(tiny_dir, **agentic_keys):
    tag = {
        "env_type": "frozen_lake",
        "max_turns": 5,
        "max_tokens_per_turn": 64,
        "format_penalty": -0.1,
        "system_template": "You play games.",
        "turn_template": TEMPLATE,
        "env_config": {"desc": LAKE, "is_slippery": False},
    }
    return build_config(
        {
            "pipeline": "agentic",
            "experiment": {"max_steps": 1},
            "model": {"path": str(tiny_dir)},
            "rollout": {"response_length": 64},
            "agentic": {
                "env_manager": "gem_runner",
                "train_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["T"]},
                "val_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["T"]},
                "custom_envs": {"T": tag},
                **agentic_keys,
            },
        }
    )


def test_system_message():
    assert gem_system_message("Be good.", "Rules.") == "Be good.\n\nRules."
    assert gem_system_message("Be good.", "") == "Be good."


def test_episode_messages(tiny_dir, tiny_tokenizer):
    plan = ["<answer>Right</answer>", "no tags", "<answer>Right</answer>"]
    plan += ["<answer>Down</answer>", "<answer>Down</answer>"]
    cfg = config(tiny_dir)
    engine = ScriptedEngine(tiny_tokenizer, lambda text: plan[turn_index(text)])
    player = GEMRunnerPlayer(cfg, engine, tiny_tokenizer)
    manager = EnvManager.from_agentic(cfg.agentic, "train", 0)
    played = player.play_round(manager, 1, SamplingParams())
    (log,) = played.logs
    m = log.messages
    assert m[0] == {
        "role": "system",
        "content": f"You play games.\n\n{log.slot.instruction}",
    }
    assert m[1]["content"] == f"Turn 1:\n{log.slot.observation}\n5 left, 64 tokens."
    # after the invalid answer (turn 2): the observation alone, no note
    assert m[5]["content"].startswith("Turn 3:\n") and "Invalid" not in m[5]["content"]
    assert m[5]["content"].endswith("3 left, 64 tokens.")
    assert log.num_turns == 5 and log.stop_reason == "done"
    batch = played.batch
    assert len(batch) == 1 and batch["turn_rewards"][0] == [0.0, -0.1, 0.0, 0.0, 1.0]
    assert float(batch["scores"][0]) == pytest.approx(0.9)


def test_checks(tiny_dir):
    with pytest.raises(ConfigError, match="step_score"):
        agentic.check(config(tiny_dir, step_score="return_to_go"))
    tools = config(tiny_dir)
    tools.agentic.custom_envs["T"].env_type = "countdown_tool"
    tools.agentic.custom_envs["T"].env_config = {}
    with pytest.raises(ConfigError, match="offers tools"):
        agentic.check(tools)
