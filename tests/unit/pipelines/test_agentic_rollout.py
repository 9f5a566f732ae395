"""Envs ↔ runner glue with a scripted policy: a won FrozenLake episode, the format
penalty, a Countdown episode that uses the calculator tool, and rendering."""

from __future__ import annotations

import pytest
from doubles import ScriptedEngine, turn_index

from temper.envs import EnvManager
from temper.pipelines.agentic_rollout import AgenticPlayer, save_renders
from temper.pipelines.catalog import build_config
from temper.pipelines.trajectories import episode_metrics, trajectory_batch
from temper.rollout.base import SamplingParams


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


LAKE = ["SFF", "FHF", "FFG"]
PLAN = [
    "<answer>Right</answer>",
    "no tags at all",
    "<answer>Right || Down</answer>",
    "<answer>Down</answer>",
]


def config(tiny_dir, tag, **agentic):
    return build_config(
        {
            "pipeline": "agentic",
            "experiment": {"max_steps": 1},
            "model": {"path": str(tiny_dir)},
            "rollout": {"response_length": 64, "multi_turn": agentic.pop("multi_turn", {})},
            "agentic": {
                "train_env_manager": {"num_env_groups": 1, "group_size": 2, "tags": ["T"]},
                "val_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["T"]},
                "custom_envs": {"T": tag},
                **agentic,
            },
        }
    )


def test_won_episode_with_an_invalid_turn(tiny_dir, tiny_tokenizer, tmp_path):
    tag = {
        "env_type": "frozen_lake",
        "max_turns": 6,
        "format_penalty": -0.1,
        "env_config": {"desc": LAKE, "is_slippery": False},
    }
    cfg = config(tiny_dir, tag)
    engine = ScriptedEngine(tiny_tokenizer, lambda text: PLAN[turn_index(text)])
    player = AgenticPlayer(cfg, engine, tiny_tokenizer)
    assert not player.tools_on
    manager = EnvManager.from_agentic(cfg.agentic, "train", 0, record_frames=True)
    trajs, slots, metrics = player.play(manager, 1, SamplingParams())
    assert engine.batch_sizes == [2, 2, 2, 2]  # both episodes in every generate call
    t = trajs[0]
    assert t.num_turns == 4 and t.stop_reason == "done"
    assert t.turn_rewards == [0.0, -0.1, 0.0, 1.0]
    assert t.infos[-1]["success"] and not t.infos[1]["format_ok"]
    assert "Invalid answer" in t.messages[4]["content"]  # the model is told why
    assert t.meta["uid"] == trajs[1].meta["uid"] == "1:0"  # one group, one seed
    batch = trajectory_batch(trajs, engine.pad_token_id)
    m = episode_metrics(batch, "train")
    assert m["train/success_rate"] == 1.0 and m["env/invalid_action_rate"] == 0.25
    assert metrics["rollout/tokenization_mismatch_frac"] == 0.0
    files = save_renders(tmp_path, 7, manager, trajs, slots, limit=1)
    names = sorted(p.name for p in files)
    assert any(n.endswith(".png") for n in names) and "T_g0_e0_dialog.txt" in names
    # frames: the start + one per executed action (Right, Right, Down, Down)
    assert sum(n.endswith(".png") for n in names) == 5


def test_env_turns_in_a_partial_rollout_carry_the_version_that_sampled_them(
    tiny_dir, tiny_tokenizer
):
    """A won FrozenLake episode (Right, Right, Down, Down) as a partial rollout in
    segments of 8 tokens: "<answer>Right</answer>" + EOS is 23 tokens (segments of 8, 8,
    7), "<answer>Down</answer>" + EOS 22 (8, 8, 6), so a turn has 2 boundaries and every
    env turn one more. The trainer publishes version 1 at the 2nd boundary (inside turn
    1) and version 2 at the 3rd (the first env turn): turn 1 is 0 ×16 then 1 ×7, turns
    2–4 (23 + 22 + 22 tokens) version 2; env tokens are masked with version 0."""
    from temper.rollout.partial import RESPONSE_VERSIONS, Segments

    tag = {
        "env_type": "frozen_lake",
        "max_turns": 6,
        "env_config": {"desc": LAKE, "is_slippery": False},
    }
    cfg = config(tiny_dir, tag)
    plan = [PLAN[0], PLAN[0], PLAN[3], PLAN[3]]  # Right, Right, Down, Down: the goal
    plain_engine = ScriptedEngine(tiny_tokenizer, lambda text: plan[turn_index(text)])
    plain = AgenticPlayer(cfg, plain_engine, tiny_tokenizer).play_round(
        EnvManager.from_agentic(cfg.agentic, "train", 0), 1, SamplingParams()
    )
    engine = ScriptedEngine(tiny_tokenizer, lambda text: plan[turn_index(text)])
    player = AgenticPlayer(cfg, engine, tiny_tokenizer)
    pushes = {2: 1, 3: 2}
    calls: list[int] = []

    def boundary() -> int:
        calls.append(pushes.get(len(calls) + 1, calls[-1] if calls else 0))
        return calls[-1]

    manager = EnvManager.from_agentic(cfg.agentic, "train", 0)
    played = player.play_round(manager, 1, SamplingParams(), segments=Segments(8, boundary, 0))
    batch = played.batch
    assert batch["success"] == [True, True] and batch["num_turns"] == [4, 4]
    assert len(calls) == 4 * 2 + 3  # 2 inside each turn, 1 at each of 3 env turns
    assert (batch["response_ids"] == plain.batch["response_ids"]).all()
    for row in range(2):
        mask = batch["response_mask"][row].bool()
        versions = batch[RESPONSE_VERSIONS][row]
        assert versions[mask].tolist() == [0] * 16 + [1] * 7 + [2] * (23 + 22 + 22)
        assert not versions[~mask].any()
    assert RESPONSE_VERSIONS not in plain.batch


CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>'


def test_countdown_with_the_calculator_tool(tiny_dir, tiny_tokenizer):
    tag = {
        "env_type": "countdown_tool",
        "max_turns": 2,
        "env_config": {"num_numbers": 2, "max_number": 9, "max_target": 20},
    }
    cfg = config(tiny_dir, tag, multi_turn={"max_user_turns": 4})
    manager = EnvManager.from_agentic(cfg.agentic, "train", 0)
    numbers = manager.reset(1)[0].observation  # "Numbers: [a, b]\nTarget: t"

    def policy(text: str) -> str:
        a, b = eval(numbers.split("\n")[0].split(":")[1])
        target = int(numbers.split("Target:")[1].split()[0])
        for expr in (
            f"{a} + {b}",
            f"{a} * {b}",
            f"{a} - {b}",
            f"{b} - {a}",
            f"{a} / {b}",
            f"{b} / {a}",
        ):
            if turn_index(text) == 0:
                return CALL % expr
            if float(eval(expr)) == target:
                return f"<answer>{expr}</answer>"
        return "<answer>0</answer>"

    engine = ScriptedEngine(tiny_tokenizer, policy)
    player = AgenticPlayer(cfg, engine, tiny_tokenizer)
    assert player.tools_on and "<tools>" in player.tool_text  # ChatML ignores tools=
    trajs, _, metrics = player.play(manager, 1, SamplingParams())
    t = trajs[0]
    assert [m["role"] for m in t.messages] == ["user", "assistant", "tool", "assistant"]
    assert "<tools>" in t.messages[0]["content"]
    assert t.infos[0]["tool_calls"] == 1 and t.infos[0]["tool_errors"] == 0
    assert t.infos[-1]["success"] and t.episode_return > 0
    assert metrics["tools/calls"] >= 2 and metrics["tools/error_frac"] == 0.0


def test_tool_env_refuses_a_tool_call_format_it_cannot_parse(tiny_dir, tiny_tokenizer):
    """A tool env turns the tool loop on by itself; a format temper has no parser for
    would then find no calls in the model's text, so the player refuses it."""
    from temper.config.errors import ConfigError

    tag = {"env_type": "countdown_tool", "max_turns": 2}
    cfg = config(tiny_dir, tag, multi_turn={"format": "gpt-oss"})
    engine = ScriptedEngine(tiny_tokenizer, lambda text: "")
    with pytest.raises(ConfigError, match=r"rollout.multi_turn.format: tool-call format 'gpt-oss'"):
        AgenticPlayer(cfg, engine, tiny_tokenizer)
    lake = {"env_type": "frozen_lake", "max_turns": 2}  # no tools: the format is unused
    assert not AgenticPlayer(
        config(tiny_dir, lake, multi_turn={"format": "gpt-oss"}), engine, tiny_tokenizer
    ).tools_on
