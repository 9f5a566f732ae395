"""verl's gsm8k interaction end to end on a tiny model taught to answer wrong, then right
after the simulated user's retry: the interaction's turns are context (mask 0), its
scores reach the sample's ``extra_info.turn_scores``, and the run trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from temper.pipelines import run_pipeline as train
from temper.pipelines.catalog import build_config

QUESTION = "What is 2 + 3?"
RETRY = "Your response is incorrect! You need to reflect on your answer and try again."
UPSTREAM = Path(__file__).resolve().parents[1] / "data" / "upstream"
VERL_YAML = (
    UPSTREAM / "verl-2026-01-b178a3c/examples/sglang_multiturn/config/interaction_config"
    "/gsm8k_interaction_config.yaml"
)


def _rows(path: Path, n: int = 4) -> Path:
    row = {
        "prompt": [{"role": "user", "content": QUESTION}],
        "data_source": "openai/gsm8k",
        "reward_model": {"ground_truth": "5"},
        "extra_info": {
            "interaction_kwargs": {"name": "gsm8k", "query": QUESTION, "ground_truth": "5"}
        },
    }
    path.write_text("".join(json.dumps(row) + "\n" for _ in range(n)))
    return path


@pytest.mark.slow
def test_gsm8k_interaction_rollout_and_training(tmp_path, tiny_model_dir, monkeypatch):
    from doubles import teach_tiny_model

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    taught = tmp_path / "taught"
    conversation = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "#### 4"},
        {"role": "user", "content": RETRY},
        {"role": "assistant", "content": "#### 5"},
    ]
    teach_tiny_model(tiny_model_dir, taught, [conversation], steps=150)
    data = _rows(tmp_path / "gsm8k.jsonl")
    cfg = build_config(
        {
            "experiment": {
                "output_dir": str(tmp_path / "run"),
                "max_steps": 2,
                "seed": 1,
                "trackers": ["jsonl"],
            },
            "model": {"path": str(taught)},
            "data": {"train_files": [str(data)], "train_batch_size": 2, "max_prompt_length": 64},
            "rollout": {
                "n": 2,
                "response_length": 160,
                "do_sample": False,
                "multi_turn": {
                    "enable": True,
                    "interaction_config_path": str(VERL_YAML),
                    "max_assistant_turns": 3,
                },
            },
            "actor": {"mini_batch_size": 4, "micro_batch_size_per_device": 4},
            "algorithm": {"adv_estimator": "grpo"},
        }
    )
    from temper.pipelines import resolve_pipeline
    from temper.pipelines.build import build_run
    from temper.pipelines.catalog import plan
    from temper.rollout.base import SamplingParams

    run = build_run(cfg, resolve_pipeline(cfg.pipeline), plan(cfg))
    try:
        engine = run.producer.engine
        assert type(engine).__name__ == "ToolCallingEngine"
        from temper.data.batch import Batch

        kw = {"name": "gsm8k", "ground_truth": "5"}
        prompts = Batch.from_dict(
            {"prompt_ids": torch.zeros(1, 2, dtype=torch.long), "prompt_mask": torch.ones(1, 2)},
            {
                "raw_prompt": [[{"role": "user", "content": QUESTION}]],
                "extra_info": [{"interaction_kwargs": kw}],
                "ground_truth": ["5"],
            },
        )
        out = engine.generate(prompts, SamplingParams(max_new_tokens=160, do_sample=False))
    finally:
        run.close()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(taught))
    ids, mask = out["response_ids"][0], out["response_mask"][0].bool()
    present = out["attention_mask"][0, -ids.shape[0] :].bool()
    assert out["turn_scores"] == [[0.0, 1.0]]  # wrong, then right: the episode ends
    assert out["extra_info"][0]["turn_scores"] == [0.0, 1.0]
    text = tok.decode(ids[present])
    assert f"<|im_start|>user\n{RETRY}<|im_end|>" in text  # the user turn is in the sequence
    trained = tok.decode(ids[mask])
    assert RETRY not in trained and trained.count("####") == 2  # … and out of the loss
    assert engine.metrics["rollout/tokenization_mismatch_frac"] == 0.0

    summary = train(cfg)
    assert summary["steps"] == 2
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/reward_mean" in r]
    assert [r["interaction/turns_mean"] for r in steps] == [2.0, 2.0]
    # the gsm8k reward function reads the whole exchange: its last answer is the right one
    assert all(r["train/reward_mean"] == 1.0 for r in steps)
