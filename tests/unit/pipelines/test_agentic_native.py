"""The agent-native step env manager (ROLL's AgentNativeStepEnvManager) with a scripted
policy: the env words the conversation, each env step is a sample whose prompt is the
conversation so far, scored with its return-to-go."""

from __future__ import annotations

import pytest
from doubles import ScriptedEngine, turn_index

from temper.config.errors import ConfigError
from temper.envs import EnvManager, StepRecord
from temper.envs.native import SokobanNativeEnv
from temper.pipelines import agentic
from temper.pipelines.agentic_native import NativeStepPlayer, native_messages
from temper.pipelines.catalog import build_config
from temper.rollout.base import SamplingParams


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


def config(tiny_dir, **tag):
    return build_config(
        {
            "pipeline": "agentic",
            "experiment": {"max_steps": 1},
            "model": {"path": str(tiny_dir)},
            "data": {"max_prompt_length": 900},
            "rollout": {"response_length": 32},
            "algorithm": {"adv_estimator": "reinforce"},
            "agentic": {
                "env_manager": "agent_native",
                "step_score": "return_to_go",
                "train_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["N"]},
                "val_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["N"]},
                "custom_envs": {
                    "N": {
                        "env_type": "sokoban_native_env",
                        "max_turns": 3,
                        "max_tokens_per_turn": 32,
                        "format_penalty": -0.15,
                        "env_config": {"system_template": "Play.", "observation_suffix": "Go:"},
                        **tag,
                    }
                },
            },
        }
    )


def test_messages_of_a_step():
    env = SokobanNativeEnv(system_template="Play.", observation_suffix="Go:")
    records = [StepRecord("A", "<answer>Up</answer>", 0.0), StepRecord("B", "x", -0.1, False)]
    assert native_messages(env, "Rules.", records, "C") == [
        {"role": "system", "content": "Play.\n\nRules."},
        {"role": "user", "content": "Here is the current state:\nA\n\nGo:"},
        {"role": "assistant", "content": "<answer>Up</answer>"},
        {"role": "user", "content": "Current state:\nB\n\nGo:"},
        {"role": "assistant", "content": "x"},
        {"role": "user", "content": "Current state:\nC\n\nGo:"},
    ]
    assert native_messages(env, "Rules.", [], "A")[1:] == [
        {"role": "user", "content": "Here is the current state:\nA\n\nGo:"}
    ]
    default = SokobanNativeEnv()
    assert "<answer>" in default.observation_suffix and "Up, Down, Left, Right" in (
        default.observation_suffix
    )


def test_step_samples_carry_the_conversation(tiny_dir, tiny_tokenizer):
    plan = ["<answer>Up</answer>", "nonsense", "<answer>Left</answer>"]
    cfg = config(tiny_dir)
    engine = ScriptedEngine(tiny_tokenizer, lambda text: plan[turn_index(text)])
    player = NativeStepPlayer(cfg, engine, tiny_tokenizer)
    manager = EnvManager.from_agentic(cfg.agentic, "train", 0)
    played = player.play_round(manager, 1, SamplingParams())
    batch = played.batch
    assert len(batch) == 3 and batch["step_index"].tolist() == [0, 1, 2]
    prompts = [
        tiny_tokenizer.decode(ids[mask.bool()])
        for ids, mask in zip(batch["prompt_ids"], batch["prompt_mask"])
    ]
    # each step's prompt holds the whole conversation so far: k earlier answers
    assert [p.count("<|im_start|>assistant") for p in prompts] == [1, 2, 3]
    assert prompts[0].count("Here is the current state:") == 1
    assert prompts[2].count("Current state:\n") == 2 and "nonsense" in prompts[2]
    assert prompts[0].startswith("<|im_start|>system\nPlay.\n\nYou are solving the Sokoban")
    rewards = batch["step_rewards"].tolist()
    assert rewards[1] == pytest.approx(-0.15)  # the invalid answer's format penalty
    # return-to-go scores: G_t = r_t + G_{t+1}
    scores = batch["scores"].tolist()
    assert scores == pytest.approx([sum(rewards), sum(rewards[1:]), rewards[2]])


def test_checks(tiny_dir):
    with pytest.raises(ConfigError, match="returns observations"):
        agentic.check(config(tiny_dir, env_type="sokoban", env_config={}))
    with pytest.raises(ConfigError, match="system_template"):
        agentic.check(config(tiny_dir, system_template="Hi."))


def test_step_samples_allow_a_mini_batch_above_the_episodes(tiny_dir):
    """A step of step samples has at least one per episode (here 1 episode, up to 3
    steps): a mini-batch of 2 is allowed, as ROLL's native file's 2048 over 1024
    episodes is; a trajectory manager's step has exactly its episodes."""
    from temper.pipelines.catalog import plan

    cfg = config(tiny_dir)
    cfg.actor.mini_batch_size = 2
    derived = plan(cfg)
    assert derived.shape.at_least and derived.shape.samples == 1
    assert derived.actor.optimizer_steps_per_rl_step == 1
    with pytest.raises(ConfigError, match="exceed the 1 samples"):
        build_config(
            {
                "pipeline": "agentic",
                "experiment": {"max_steps": 1},
                "model": {"path": str(tiny_dir)},
                "actor": {"mini_batch_size": 2},
                "agentic": {
                    "train_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["N"]},
                    "val_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["N"]},
                    "custom_envs": {"N": {"env_type": "sokoban"}},
                },
            }
        )
