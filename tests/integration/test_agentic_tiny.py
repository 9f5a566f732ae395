"""End-to-end agentic runs on the tiny random model (CPU): FrozenLake 4×4 trains 3 steps
with validation and rendering; the tool loop runs inside training (Countdown + calculator);
the ROLL-dialect agentic example trains 2 steps with CPU-scale overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from temper.pipelines import run_pipeline
from temper.pipelines.catalog import build_config, load_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def agentic_config(tmp_path, model_dir, tag_cfg, **over):
    cfg = {
        "pipeline": "agentic",
        "experiment": {
            "output_dir": str(tmp_path / "run"),
            "max_steps": 3,
            "seed": 3,
            "test_freq": 3,
            "trackers": ["jsonl"],
            "render_save_dir": str(tmp_path / "render"),
        },
        "model": {"path": str(model_dir)},
        "data": {"max_prompt_length": 400},
        "rollout": {"response_length": 12, "max_model_len": 1000},
        "actor": {
            "mini_batch_size": 4,
            "micro_batch_size_per_device": 2,
            "optim": {"lr": 1e-3, "weight_decay": 0.0},
        },
        "algorithm": {"adv_estimator": "grpo"},
        "agentic": {
            "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["T"]},
            "val_env_manager": {"num_env_groups": 2, "group_size": 1, "tags": ["T"]},
            "custom_envs": {"T": tag_cfg},
            "reward_normalization": {"grouping": "state", "method": "mean_std"},
        },
    }
    for section, values in over.items():
        cfg.setdefault(section, {}).update(values)
    return build_config(cfg)


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


LAKE = {
    "env_type": "frozen_lake",
    "max_turns": 3,
    "max_tokens_per_turn": 12,
    "env_config": {"size": 4, "is_slippery": False},
}


@pytest.mark.slow
def test_frozen_lake_trains_three_steps(tmp_path, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    before = {
        n: p.detach().clone()
        for n, p in AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters()
    }
    # a random model answers nothing valid: every episode returns 3 × format penalty, so
    # group baselines (GRPO, mean_std) cancel it; plain REINFORCE still gets a gradient
    cfg = agentic_config(
        tmp_path,
        tiny_model_dir,
        LAKE,
        algorithm={"adv_estimator": "reinforce"},
        agentic={"reward_normalization": {"grouping": "batch", "method": "identity"}},
    )
    summary = run_pipeline(cfg)
    metrics = rows(tmp_path / "run")
    train = [r for r in metrics if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    for key in (
        "train/success_rate",
        "env/T/success_rate",
        "env/num_turns_mean",
        "env/invalid_action_rate",
        "actor/pg_loss",
        "actor/grad_norm",
        "rollout/tokenization_mismatch_frac",
        "timing/rollout_s",
    ):
        assert key in train[0], key
    assert all(r["rollout/tokenization_mismatch_frac"] == 0.0 for r in train)
    assert all(1 <= r["env/num_turns_mean"] <= 3 for r in train)
    assert "val/success_rate" in train[-1] and "val/env/T/success_rate" in train[-1]
    assert summary["steps"] == 3 and len(summary["val"]) == 1
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final" / "actor")
    moved = [n for n, p in after.named_parameters() if not torch.equal(p, before[n])]
    assert moved, "no parameter changed"
    rendered = list((tmp_path / "render").rglob("*"))
    assert any(p.suffix == ".png" for p in rendered)
    assert any(p.name.endswith("_dialog.txt") for p in rendered)


def solve_countdown(numbers: list[int], target: int) -> str:
    """An expression reaching ``target`` with each number once (no parentheses needed
    or one pair around the first two), for teaching the tiny model the right answer."""
    from itertools import permutations, product

    from temper.envs.tools import safe_eval

    for a, b, c in permutations(numbers):
        for o1, o2 in product("+-*", repeat=2):
            for expr in (f"{a} {o1} {b} {o2} {c}", f"({a} {o1} {b}) {o2} {c}"):
                if safe_eval(expr) == target:
                    return expr
    raise AssertionError(f"no simple solution for {numbers} -> {target}")


CALCULATOR_YAML = """\
tools:
  - class_name: temper.calculator
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


@pytest.mark.slow
def test_taught_tiny_model_calls_the_calculator_in_training(tmp_path, tiny_model_dir):
    """End to end with a real model that *does* call the tool: the tiny model is first
    taught (supervised, on the exact episode it will play at step 1) to check its answer
    with a hermes ``<tool_call>`` and then answer; greedy rollouts then run the real tool
    loop inside agentic training. The calls execute, the env scores the answer, the tool
    output is context only (response_mask 0 in the dumped rollout) and the update moves
    the weights."""
    from doubles import ScriptedEngine, teach_tiny_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from temper.envs import EnvManager
    from temper.envs.tools import execute_tool
    from temper.pipelines.agentic_rollout import AgenticPlayer

    tools = tmp_path / "tools.yaml"
    tools.write_text(CALCULATOR_YAML)
    countdown = {
        "env_type": "countdown_tool",
        "max_turns": 2,
        "max_tokens_per_turn": 96,
        "env_instruction": "Reach the target.",
        "env_config": {"num_numbers": 3, "max_number": 9, "max_target": 30},
    }
    taught = tmp_path / "taught"

    def make(model_dir):
        return agentic_config(
            tmp_path,
            model_dir,
            countdown,
            experiment={
                "max_steps": 2,
                "test_freq": -1,
                "render_save_dir": None,
                "rollout_data_dir": str(tmp_path / "dumps"),
            },
            rollout={
                "response_length": 96,
                "max_model_len": 1100,
                "do_sample": False,  # greedy: the taught turns come out exactly
                "multi_turn": {"enable": True, "max_user_turns": 2, "tool_config_path": str(tools)},
            },
            data={"max_prompt_length": 900},
            actor={"mini_batch_size": 2},
            algorithm={"adv_estimator": "reinforce"},
            agentic={
                "train_env_manager": {"num_env_groups": 1, "group_size": 2, "tags": ["T"]},
                "val_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["T"]},
                "reward_normalization": {"grouping": "batch", "method": "identity"},
            },
        )

    # the first message of step 1's episode, exactly as the run will build it
    base_cfg = make(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    player = AgenticPlayer(base_cfg, ScriptedEngine(tok, lambda text: ""), tok)
    manager = EnvManager.from_agentic(base_cfg.agentic, "train", base_cfg.experiment.seed)
    slots, specs = player.episodes(manager, 1)
    numbers, target = slots[0].info["numbers"], slots[0].info["target"]
    expr = solve_countdown(numbers, target)
    call = f"<tool_call>{json.dumps({'name': 'calculator', 'arguments': {'expression': expr}})}</tool_call>"
    result = execute_tool("calculator", {"expression": expr}).content
    conversation = [
        *specs[0].messages,
        {"role": "assistant", "content": call},
        {"role": "tool", "name": "calculator", "content": result},
        {"role": "assistant", "content": f"<answer>{expr}</answer>"},
    ]
    losses = teach_tiny_model(tiny_model_dir, taught, [conversation])
    assert losses["loss_last"] < 0.1 * losses["loss_first"]

    summary = run_pipeline(make(taught))
    assert summary["steps"] == 2
    train = [r for r in rows(tmp_path / "run") if "train/reward_mean" in r]
    first = train[0]
    # both episodes of step 1: one call each, executed; then the right answer
    assert first["tools/calls"] == 2.0 and first["tools/ok_calls"] == 2.0
    assert first["tools/error_frac"] == 0.0
    assert first["train/success_rate"] == 1.0 and first["train/reward_mean"] == 1.0
    # the dumped rollouts: model turns trained, tool output and scaffolding context only;
    # tools/calls counts each step's calls (one tool message each), not a running total
    dumps = {
        step: [
            json.loads(x) for x in (tmp_path / "dumps" / f"{step}.jsonl").read_text().splitlines()
        ]
        for step in (1, 2)
    }
    for step, r in zip((1, 2), train):
        shown = sum(
            seg["text"].count("<|im_start|>tool")
            for row in dumps[step]
            for seg in row["segments"]
            if not seg["trained"]
        )
        assert r["tools/calls"] == shown, step
    dumped = dumps[1]
    assert len(dumped) == 2
    for row in dumped:
        trained = [seg["text"] for seg in row["segments"] if seg["trained"]]
        context = [seg["text"] for seg in row["segments"] if not seg["trained"]]
        assert trained == [call + "<|im_end|>", f"<answer>{expr}</answer><|im_end|>"]
        assert context == [f"\n<|im_start|>tool\n{result}<|im_end|>\n<|im_start|>assistant\n"]
        assert row["success"] and row["num_turns"] == 2
    before = AutoModelForCausalLM.from_pretrained(taught)
    after = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "final" / "actor")
    moved = [
        n
        for (n, p), (_, q) in zip(before.named_parameters(), after.named_parameters())
        if not torch.equal(p, q)
    ]
    assert moved, "no parameter changed"


@pytest.mark.slow
def test_val_before_train_reports_success_before_and_after(tmp_path, tiny_model_dir, capsys):
    """``val_before_train``: the summary and the closing line give the validation success
    before any update and after the last step, each from its own validation. The tiny
    model is taught to win a fixed 3×3 lake in one answer (success 1.0 before); an
    absurd learning rate then wrecks it (success 0.0 after), so the two cannot be
    confused. Without a validation after training there is no "after" to report."""
    from doubles import teach_tiny_model

    from temper.envs import EnvManager

    lake = {
        "env_type": "frozen_lake",
        "max_turns": 2,
        "max_tokens_per_turn": 48,
        "env_config": {"desc": ["SFF", "FHF", "FFG"], "is_slippery": False},
    }
    win = "<answer>Right || Right || Down || Down</answer>"

    def make(model_dir, name, **experiment):
        return agentic_config(
            tmp_path / name,
            model_dir,
            lake,
            experiment={"val_before_train": True, "render_save_dir": None, **experiment},
            rollout={"response_length": 48, "max_model_len": 600, "do_sample": False},
            actor={"mini_batch_size": 4, "optim": {"lr": 1.0, "weight_decay": 0.0}},
            algorithm={"adv_estimator": "reinforce"},
            agentic={"reward_normalization": {"grouping": "batch", "method": "identity"}},
        )

    base = make(tiny_model_dir, "probe")
    slot = EnvManager.from_agentic(base.agentic, "val", 0).reset(0)[0]
    first = [{"role": "user", "content": f"{slot.instruction}\n\n{slot.observation}"}]
    taught = tmp_path / "taught"
    teach_tiny_model(tiny_model_dir, taught, [[*first, {"role": "assistant", "content": win}]])

    summary = run_pipeline(make(taught, "a", max_steps=2, test_freq=2))
    out = capsys.readouterr().out
    assert summary["val_steps"] == [0, 2]
    assert summary["val_before"] == summary["val"][0]["val/success_rate"] == 1.0
    assert summary["val_after"] == summary["val"][1]["val/success_rate"] == 0.0
    assert "val/success_rate 1.000 before training → 0.000 after 2 steps" in out
    logged = [r for r in rows(tmp_path / "a" / "run") if "val/success_rate" in r]
    assert [(r["step"], r["val/success_rate"]) for r in logged] == [(0, 1.0), (2, 0.0)]

    summary = run_pipeline(make(taught, "b", max_steps=1, test_freq=-1))
    out = capsys.readouterr().out
    assert summary["val_steps"] == [0] and summary["val_before"] == 1.0
    assert "val_after" not in summary
    assert "val/success_rate 1.000 before training (no validation after it)" in out


@pytest.mark.slow
def test_roll_agentic_example_trains_two_steps(tmp_path, tiny_model_dir):
    """The ROLL-dialect example runs on this CPU as written: only the model (the tiny one
    in place of SmolLM2), where outputs go and the length are overridden."""
    overrides = [
        f"pretrain={tiny_model_dir}",
        f"output_dir={tmp_path / 'roll'}",
        f"render_save_dir={tmp_path / 'render'}",
        "max_steps=2",
        "eval_steps=2",
    ]
    loaded = load_config(EXAMPLES / "roll_agentic_sokoban.yaml", overrides)
    cfg = loaded.config
    assert cfg.pipeline == "agentic" and cfg.rollout.engine == "hf"
    assert (
        cfg.agentic.train_env_manager.num_env_groups * cfg.agentic.train_env_manager.group_size == 8
    )
    summary = run_pipeline(cfg)
    train = [r for r in rows(tmp_path / "roll") if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all("actor/pg_loss" in r for r in train)
    val = [r for r in rows(tmp_path / "roll") if "val/success_rate" in r]
    assert [r["step"] for r in val] == [2]
    assert (
        "val/env/FrozenLake/success_rate" in val[0]
        and "val/env/SimpleSokoban/success_rate" in val[0]
    )
    assert summary["steps"] == 2 and (tmp_path / "roll" / "final" / "actor").is_dir()
