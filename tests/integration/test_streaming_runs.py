"""Streaming asynchronous RL end to end (``async_training.mode: streaming``): a tiny RLVR
run trains on groups handed over as they finish, never more than k versions old, and a
run killed (SIGKILL) after step 3's checkpoint resumes losing and repeating no prompt — it
trains the very prompts, step by step, that a synchronous run of the same data does; the
same for agentic env groups (FrozenLake); a partial rollout trains — single-turn,
multi-turn with a tool, and agentic env turns, the last killed and resumed too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from killed_runs import kill_at, metric_rows, start_train  # tests/ is on the path

from temper.pipelines.catalog import build_config

pytestmark = pytest.mark.slow

STEPS = 6


def _config(tmp: Path, model_dir: Path, out: Path, **async_training: object) -> dict:
    cfg = {
        "experiment": {
            "max_steps": STEPS,
            "seed": 1,
            "save_freq": 3,
            "trackers": ["jsonl"],
            "output_dir": str(out),
            "rollout_data_dir": str(out / "dumps"),
        },
        "model": {"path": str(model_dir)},
        "data": {
            "train_files": ["task:arithmetic?n=32&seed=3"],
            "train_batch_size": 4,
            "max_prompt_length": 96,
        },
        "rollout": {"n": 2, "response_length": 8, "temperature": 1.0},
        "actor": {"mini_batch_size": 8, "micro_batch_size_per_device": 8, "optim": {"lr": 3e-3}},
        "algorithm": {"adv_estimator": "grpo"},
        "reward": {"function": "arithmetic"},
    }
    if async_training:
        cfg["async_training"] = dict(async_training)
    build_config(cfg)  # fail here, not in a subprocess
    return cfg


def _train(cfg: dict) -> dict:
    from temper.pipelines import run_pipeline

    return run_pipeline(build_config(cfg))


def _trained_prompts(out: Path, steps_: int = STEPS) -> list[list[str]]:
    """The group uids each step trained on (``rollout_data_dir``), step by step."""
    steps = []
    for s in range(1, steps_ + 1):
        rows = [json.loads(x) for x in (out / "dumps" / f"{s}.jsonl").read_text().splitlines()]
        steps.append(sorted({r["uid"] for r in rows}))
    return steps


def test_streaming_kill_resume_trains_every_prompt_once(tmp_path, tiny_model_dir, capsys):
    sync = _config(tmp_path, tiny_model_dir, tmp_path / "sync")
    _train(sync)

    out = tmp_path / "streaming"
    cfg = _config(tmp_path, tiny_model_dir, out, staleness=1, mode="streaming", stream_chunk=1)
    proc, log = start_train(cfg, "streaming", tmp_path)
    kill_at(out / "checkpoints" / "global_step_3" / "manifest.json", proc, log, timeout=240)
    summary = _train(cfg)  # resume_mode auto
    assert f"resumed from {out / 'checkpoints'}" in capsys.readouterr().out
    assert summary["steps"] == STEPS

    assert _trained_prompts(out) == _trained_prompts(tmp_path / "sync")
    rows = metric_rows(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # contiguous metrics
    assert all(r["async/staleness_max"] <= 1 for r in rows)
    assert all(r["async/dropped_groups"] == 0 for r in rows)
    assert any(r["async/staleness_max"] == 1 for r in rows)  # it did run ahead


def test_streaming_check_explains_the_schedule(tmp_path, tiny_model_dir):
    from temper.cli.main import main

    cfg = _config(tmp_path, tiny_model_dir, tmp_path / "x", staleness=2, mode="streaming")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["check", str(path)]) == 0


def test_partial_rollout_continues_generations_under_new_weights(tmp_path, tiny_model_dir):
    """Responses generated 2 tokens at a time: the newest weights are pushed between
    segments, so some responses mix versions; the run trains with them."""
    out = tmp_path / "partial"
    cfg = _config(
        tmp_path,
        tiny_model_dir,
        out,
        staleness=1,
        mode="streaming",
        stream_chunk=4,
        partial_rollout_segment=2,
    )
    cfg["experiment"]["max_steps"] = 4
    summary = _train(cfg)
    assert summary["steps"] == 4
    rows = metric_rows(out)
    assert all(r["async/staleness_max"] <= 1 for r in rows)
    assert all(0 <= r["async/continued_token_fraction"] <= 1 for r in rows)
    assert all(r["async/token_staleness_mean"] <= r["async/staleness_max"] for r in rows)


def test_dynamic_sampling_streams_only_groups_with_signal(tmp_path, tiny_model_dir):
    """DAPO's filter on a stream: every trained group has responses that score apart (or
    is a masked filler after max_num_gen_batches draws), and the counts are logged."""
    out = tmp_path / "dapo"
    cfg = _config(tmp_path, tiny_model_dir, out, staleness=1, mode="streaming", stream_chunk=2)
    cfg["algorithm"]["filter_groups"] = {
        "enable": True,
        "metric": "score",
        "max_num_gen_batches": 3,
    }
    cfg["experiment"]["max_steps"] = 3
    assert _train(cfg)["steps"] == 3
    logged = metric_rows(out)
    for s, r in enumerate(logged, start=1):
        rows = [json.loads(x) for x in (out / "dumps" / f"{s}.jsonl").read_text().splitlines()]
        scores: dict[str, set[float]] = {}
        for row in rows:
            scores.setdefault(row["uid"], set()).add(row["score"])
        with_signal = sum(len(v) > 1 for v in scores.values())
        assert len(scores) == 4 and with_signal >= 4 - r["dynamic_sampling/groups_masked"]
        assert r["dynamic_sampling/batch_full"] == float(r["dynamic_sampling/groups_masked"] == 0)
    assert any(r["dynamic_sampling/groups_dropped"] > 0 for r in logged)


LAKE = {
    "env_type": "frozen_lake",
    "max_turns": 2,
    "max_tokens_per_turn": 8,
    "env_config": {"size": 3, "is_slippery": True},
}


def _agentic(model_dir: Path, out: Path, **async_training: object) -> dict:
    cfg = {
        "pipeline": "agentic",
        "experiment": {
            "max_steps": 4,
            "seed": 2,
            "trackers": ["jsonl"],
            "output_dir": str(out),
            "rollout_data_dir": str(out / "dumps"),
        },
        "model": {"path": str(model_dir)},
        "data": {"max_prompt_length": 300},
        "rollout": {"response_length": 8, "max_model_len": 360},
        "actor": {"mini_batch_size": 8, "micro_batch_size_per_device": 8, "optim": {"lr": 3e-3}},
        "algorithm": {"adv_estimator": "reinforce"},
        "agentic": {
            "train_env_manager": {"num_env_groups": 4, "group_size": 2, "tags": ["T"]},
            "val_env_manager": {"num_env_groups": 2, "group_size": 1, "tags": ["T"]},
            "custom_envs": {"T": LAKE},
            "reward_normalization": {"grouping": "batch", "method": "identity"},
        },
    }
    if async_training:
        cfg["async_training"] = dict(async_training)
    build_config(cfg)
    return cfg


def test_agentic_streaming_trains_the_env_groups_a_synchronous_run_does(tmp_path, tiny_model_dir):
    """Env groups streamed one at a time, at most 2 versions old: step s trains draw s's
    groups (episode seeds from (seed, s, group)), as the synchronous step s does."""
    sync = tmp_path / "sync"
    _train(_agentic(tiny_model_dir, sync))
    out = tmp_path / "streaming"
    _train(_agentic(tiny_model_dir, out, staleness=2, mode="streaming", stream_chunk=1))
    assert _trained_prompts(out, 4) == _trained_prompts(sync, 4)
    rows = metric_rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["async/staleness_max"] <= 2 for r in rows)


CALCULATOR = """
tools:
  - class_name: temper.envs.tools.Calculator
    config: {}
    tool_schema:
      type: function
      function:
        name: calculator
        description: Evaluate arithmetic.
        parameters:
          type: object
          properties: {expression: {type: string}}
          required: [expression]
"""


def test_multi_turn_tool_calls_train_as_a_partial_rollout(tmp_path, tiny_model_dir):
    """verl's multi-turn rlvr (a calculator tool) streamed with a partial rollout: the
    tiny model is first taught to call the calculator on each question and then answer,
    so every exchange has a turn boundary (the tool result) besides its 16-token
    segments; two steps train on the exchanges, the tool calls run, and the token
    versions stay within the staleness bound."""
    from doubles import ScriptedEngine, teach_tiny_model
    from transformers import AutoTokenizer

    from temper.data.tasks import arithmetic_rows, evaluate_terms
    from temper.pipelines.agentic_rollout import rlvr_tool_engine

    tools = tmp_path / "tools.yaml"
    tools.write_text(CALCULATOR)
    out = tmp_path / "tool_partial"
    cfg = _config(tmp_path, tiny_model_dir, out)
    cfg["experiment"].update(max_steps=2, save_freq=-1)
    cfg["data"].update(
        train_files=["task:arithmetic?n=8&seed=3"], train_batch_size=2, max_prompt_length=900
    )
    cfg["rollout"] = {
        "n": 2,
        "response_length": 160,
        "do_sample": False,  # the taught turns come out exactly
        "multi_turn": {"enable": True, "tool_config_path": str(tools), "max_assistant_turns": 2},
    }
    cfg["actor"].update(mini_batch_size=4, micro_batch_size_per_device=4)
    cfg["async_training"] = {
        "staleness": 1,
        "mode": "streaming",
        "stream_chunk": 1,
        "partial_rollout_segment": 16,
    }
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = rlvr_tool_engine(ScriptedEngine(tok, lambda text: ""), build_config(cfg), tok)
    conversations = []
    for row in arithmetic_rows(8, seed=3):
        expr = row["extra_info"]["expression"]
        value = evaluate_terms([int(t) for t in expr.split()[::2]], expr.split()[1::2])
        call = f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expr}"}}}}</tool_call>'
        conversations.append(
            [
                *engine.start_messages(row["prompt"]),
                {"role": "assistant", "content": call},
                {"role": "tool", "name": "calculator", "content": str(value)},
                {"role": "assistant", "content": f"#### {value}"},
            ]
        )
    taught = tmp_path / "taught"
    losses = teach_tiny_model(tiny_model_dir, taught, conversations)
    assert losses["loss_last"] < 0.1 * losses["loss_first"]
    cfg["model"]["path"] = str(taught)
    summary = _train(cfg)
    assert summary["steps"] == 2
    rows = metric_rows(out)
    assert all(r["tools/calls"] > 0 for r in rows)  # the exchanges crossed a tool turn
    dumped = [json.loads(x) for x in (out / "dumps" / "1.jsonl").read_text().splitlines()]
    assert any("</tool_call>" in r["response"] and "####" in r["response"] for r in dumped)
    assert all(r["async/staleness_max"] <= 1 for r in rows)
    assert all(0 <= r["async/continued_token_fraction"] <= 1 for r in rows)
    assert all(r["async/token_staleness_mean"] <= r["async/staleness_max"] for r in rows)


def test_agentic_partial_rollout_kill_resume_trains_every_env_group_once(
    tmp_path, tiny_model_dir, capsys
):
    """FrozenLake env groups streamed as a partial rollout (every 8-token turn in
    segments of 4, every env turn a boundary too), killed (SIGKILL) after step 2's
    checkpoint: the resumed run trains, step by step, the env groups a synchronous run
    does — none lost, none twice — and the token versions stay within the bound."""
    sync = tmp_path / "sync"
    _train(_agentic(tiny_model_dir, sync))
    out = tmp_path / "partial"
    cfg = _agentic(
        tiny_model_dir,
        out,
        staleness=1,
        mode="streaming",
        stream_chunk=1,
        partial_rollout_segment=4,
    )
    cfg["experiment"]["save_freq"] = 2
    proc, log = start_train(cfg, "partial", tmp_path)
    kill_at(out / "checkpoints" / "global_step_2" / "manifest.json", proc, log)
    summary = _train(cfg)  # resume_mode auto
    assert f"resumed from {out / 'checkpoints'}" in capsys.readouterr().out
    assert summary["steps"] == 4
    assert _trained_prompts(out, 4) == _trained_prompts(sync, 4)
    rows = metric_rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # contiguous metrics
    assert all(r["async/staleness_max"] <= 1 for r in rows)
    assert all(0 <= r["async/continued_token_fraction"] <= 1 for r in rows)
    assert all(r["async/token_staleness_mean"] <= r["async/staleness_max"] for r in rows)
