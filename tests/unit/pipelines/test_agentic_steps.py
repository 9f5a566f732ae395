"""The step-wise env manager with a scripted policy: one sample per env step, its keys,
and GiGPO's step groups forming on identical states."""

from __future__ import annotations

import pytest
import torch
from doubles import ScriptedEngine

from temper.algorithms import AdvantageInputs, AdvantageParams, compute_advantages
from temper.config import ConfigError
from temper.envs import EnvManager
from temper.pipelines.agentic_steps import StepPlayer
from temper.pipelines.catalog import build_config
from temper.rollout.base import SamplingParams


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


LAKE = ["SFF", "FHF", "FFG"]
# generate calls answer the live episodes in env order: env 0 walks Right, Right, Down,
# Down to the goal; env 1 goes Right, answers without tags (penalty, state unchanged),
# then Down into the hole at the centre
ANSWERS = [
    "<answer>Right</answer>",
    "<answer>Right</answer>",
    "<answer>Right</answer>",
    "no tags",
    "<answer>Down</answer>",
    "<answer>Down</answer>",
    "<answer>Down</answer>",
]


def config(tiny_dir, estimator="gigpo", **agentic):
    tag = {
        "env_type": "frozen_lake",
        "max_turns": 6,
        "format_penalty": -0.1,
        "history_length": 2,
        "turn_template": "Step {current_step}. Before: [{history}]\n{current_observation}",
        "env_config": {"desc": LAKE, "is_slippery": False},
    }
    return build_config(
        {
            "pipeline": "agentic",
            "experiment": {"max_steps": 1},
            "model": {"path": str(tiny_dir)},
            "rollout": {"response_length": 64},
            "algorithm": {"adv_estimator": estimator},
            "agentic": {
                "env_manager": "step",
                "train_env_manager": {"num_env_groups": 1, "group_size": 2, "tags": ["T"]},
                "val_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["T"]},
                "custom_envs": {"T": tag},
                **agentic,
            },
        }
    )


def test_every_env_step_is_a_sample(tiny_dir, tiny_tokenizer):
    cfg = config(tiny_dir)
    answers = iter(ANSWERS)
    engine = ScriptedEngine(tiny_tokenizer, lambda text: next(answers))
    player = StepPlayer(cfg, engine, tiny_tokenizer)
    manager = EnvManager.from_agentic(cfg.agentic, "train", 0)
    played = player.play_round(manager, 3, SamplingParams())
    assert engine.batch_sizes == [2, 2, 2, 1]  # one generate per env step of live episodes
    b = played.batch
    assert len(b) == 7  # 4 steps of env 0, 3 of env 1
    assert b["episode_index"] == ["3:0"] * 4 + ["3:1"] * 3
    assert b["step_index"].tolist() == [0, 1, 2, 3, 0, 1, 2]
    assert b["uid"] == ["3:0"] * 7  # one env group: one seed
    assert b["step_rewards"].tolist() == pytest.approx([0.0, 0.0, 0.0, 1.0, 0.0, -0.1, 0.0])
    assert b["scores"].tolist() == pytest.approx([1.0] * 4 + [-0.1] * 3)  # episode returns
    anchors = b["anchor_index"]
    assert anchors[0] == anchors[4]  # both start on S
    assert anchors[1] == anchors[5] == anchors[6]  # one step right (the bad answer stays)
    assert len({anchors[0], anchors[1], anchors[2], anchors[3]}) == 4
    # each sample is one prompt and one answer: the answer alone is trained
    assert (
        b["response_mask"].sum(-1).tolist()
        == b["attention_mask"][:, b["prompt_ids"].shape[1] :].sum(-1).tolist()
    )
    # env 0's third prompt shows one earlier step (history_length 2), numbered 2
    prompt = tiny_tokenizer.decode(b["prompt_ids"][2][b["prompt_mask"][2].bool()])
    assert "Step 3. Before: [(step: 2, observation:" in prompt and "(step: 1," not in prompt
    m = played.episodes
    assert m["success"] == [True, False] and m["num_turns"] == [4, 3]
    assert m["invalid_actions"] == [0, 1]
    assert [log.stop_reason for log in played.logs] == ["done", "done"]
    assert played.metrics["env/step_samples"] == 7.0
    # step groups: start (2), one right (3), two lone states
    assert played.metrics["env/anchor_group_size_max"] == 3.0
    assert played.metrics["env/anchor_group_size_mean"] == 7 / 4
    assert played.metrics["env/anchor_grouped_frac"] == 5 / 7

    # GiGPO on these samples: step groups of sizes 2 (start), 3 (one right), 1, 1
    inp = AdvantageInputs(  # one token per sample is enough to read the scalars
        token_level_rewards=b["scores"].unsqueeze(-1),
        response_mask=torch.ones(len(b), 1),
        group_index=b["uid"],
        step_rewards=b["step_rewards"],
        episode_index=b["episode_index"],
        step_index=b["step_index"],
        anchor_index=b["anchor_index"],
    )
    params = AdvantageParams(norm_adv_by_std_in_grpo=False, episode_weight=0.0, step_gamma=1.0)
    adv, _ = compute_advantages("gigpo", inp, params)
    # returns (γ = 1): env 0: 1, 1, 1, 1; env 1: -0.1, -0.1, 0
    # start: [1, -0.1] -> ±0.55; one right: [1, -0.1, 0] mean 0.3 -> 0.7, -0.4, -0.3
    assert adv[:, 0].tolist() == pytest.approx([0.55, 0.7, 0.0, 0.0, -0.55, -0.4, -0.3])


def test_step_manager_refuses_turn_rewards_and_needs_gigpo_inputs(tiny_dir):
    with pytest.raises(ConfigError, match="agentic.use_turn_rewards"):
        config(tiny_dir, use_turn_rewards=True)
    with pytest.raises(ConfigError, match="agentic.env_manager: step"):
        config(tiny_dir, env_manager="trajectory")  # gigpo's inputs
    with pytest.raises(ConfigError, match="history_length"):
        config(tiny_dir, "grpo", env_manager="trajectory")  # the tag's window


def test_env_steps_in_a_partial_rollout_are_boundaries_that_push_weights(tiny_dir, tiny_tokenizer):
    """Step samples as a partial rollout, no answer longer than a segment: the only
    boundaries are the 3 between the 4 env steps; the trainer publishes version 5 at the
    1st and 6 at the 3rd, so env 0's steps are at 4, 5, 5, 6 and env 1's at 4, 5, 5."""
    from temper.rollout.partial import RESPONSE_VERSIONS, Segments

    cfg = config(tiny_dir)
    answers = iter(ANSWERS)
    engine = ScriptedEngine(tiny_tokenizer, lambda text: next(answers))
    player = StepPlayer(cfg, engine, tiny_tokenizer)
    manager = EnvManager.from_agentic(cfg.agentic, "train", 0)
    pushes, calls = {1: 5, 3: 6}, []

    def boundary() -> int:
        calls.append(pushes.get(len(calls) + 1, calls[-1] if calls else 4))
        return calls[-1]

    played = player.play_round(manager, 3, SamplingParams(), segments=Segments(64, boundary, 4))
    b = played.batch
    assert len(calls) == 3 and b["step_index"].tolist() == [0, 1, 2, 3, 0, 1, 2]
    mask = b["response_mask"].bool()
    per_sample = [sorted(set(v[m].tolist())) for v, m in zip(b[RESPONSE_VERSIONS], mask)]
    assert per_sample == [[4], [5], [5], [6], [4], [5], [5]]
