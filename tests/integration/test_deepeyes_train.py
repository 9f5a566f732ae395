"""ROLL's DeepEyes file (2026-08, ``examples/agentic_deepeyes/deepeyes.yaml``) trains 2
steps on CPU with only model, data, length, device and output overrides.

- model: a tiny Qwen2.5-VL policy, taught a few supervised steps to answer the file's
  rows either with a zoom-in tool call or with an answer (so episodes differ and the
  tool runs), and a tiny text judge (the ``reward`` cluster's model), taught to reply
  ``1``;
- data: a hand-made parquet of DeepEyes rows (``tests/deepeyes_rows.py``), two of them
  broken (skipped and reported);
- length: 2 steps, short turns and judge verdicts, 2 actions an episode, one mini-batch
  (48 episodes: the file's 1 per device, 48 accumulation steps) a step, 2 validation episodes;
- device: every ``device_mapping`` on device 0, ``hf_train`` / ``hf_infer`` (the file's
  megatron has no Qwen2.5-VL conversion here, vLLM is tested on its own);
- outputs: under the test's directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deepeyes_rows import row, write_rows  # tests/ is on the path

from temper.cli.main import main
from temper.pipelines.catalog import load_config

UPSTREAM = Path(__file__).resolve().parents[1] / "data" / "upstream"
CONFIG = UPSTREAM / "roll-2026-08-8eb27cc/examples/agentic_deepeyes/deepeyes.yaml"
ZOOM = (
    '<tool_call>{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [0, 0, 60, 60]}}'
    "</tool_call>"
)


def _policy(tmp: Path) -> Path:
    """A tiny Qwen2.5-VL that answers a row with a zoom-in call or an answer, about evenly."""
    from vl_teach import teach_tiny_vlm

    from temper.utils.tiny_vlm import make_tiny_vlm

    base = make_tiny_vlm(tmp / "vlm-base", family="qwen2_5_vl")
    rows = [row(i, name) for i, name in enumerate(["red", "blue", "green"] * 2)]
    answers = [
        ZOOM if i < 3 else f"<answer>{r['reward_model']['ground_truth']}</answer>"
        for i, r in enumerate(rows)
    ]
    teach_tiny_vlm(base, tmp / "vlm", rows, answers, steps=150)
    return tmp / "vlm"


def _judge(tmp: Path) -> Path:
    """A tiny text judge taught to reply 1 to DeepEyes' judge prompt."""
    from doubles import teach_tiny_model

    from temper.envs.deepeyes_reward import judge_messages
    from temper.utils.tiny import make_tiny_model

    base = make_tiny_model(tmp / "judge-base", max_position_embeddings=2048)
    talks = [
        [
            *judge_messages("What colour is the square?", name, f"{name}"),
            {"role": "assistant", "content": "1"},
        ]
        for name in ("red", "blue")
    ]
    teach_tiny_model(base, tmp / "judge", talks, steps=30)
    return tmp / "judge"


@pytest.mark.slow
def test_roll_deepeyes_file_trains(tmp_path, monkeypatch):
    from transformers import AutoModelForImageTextToText

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    policy, judge = _policy(tmp_path), _judge(tmp_path)
    before = {
        n: p.detach().clone()
        for n, p in AutoModelForImageTextToText.from_pretrained(policy).named_parameters()
    }
    data = write_rows(tmp_path / "deepeyes.parquet")
    out = tmp_path / "deepeyes"
    roles = ["actor_train", "actor_infer", "reference", "reward"]
    overrides = [
        f"pretrain={policy}",  # model
        f"reward.model_args.model_name_or_path={judge}",
        f"custom_envs.deepeyes.env_config.data_args.file_name={data}",  # data
        "max_steps=2",  # length
        "response_length=112",  # a zoom-in call fits (the tiny tokenizer is near byte-level)
        "sequence_length=2048",  # the tiny model's context (the file's 16384 is Qwen's)
        "max_actions_per_traj=2",
        "reward.generating_args.max_new_tokens=2",
        # one mini-batch (1 per device × 48 accumulation) of episodes a step: 6 groups
        # of the file's 8, and 2 validation episodes
        "rollout_batch_size=48",
        "actor_train.training_args.gradient_accumulation_steps=48",
        "train_env_manager.num_env_groups=6",
        "train_env_manager.num_groups_partition=[6]",
        "val_batch_size=2",
        "val_env_manager.num_env_groups=2",
        "val_env_manager.num_groups_partition=[2]",
        "num_gpus_per_node=1",  # device
        *[f"{r}.device_mapping=list(range(0,1))" for r in roles],
        "actor_train.strategy_args.strategy_name=hf_train",
        "~actor_train.strategy_args.strategy_config",
        "actor_infer.strategy_args.strategy_name=hf_infer",
        "~actor_infer.strategy_args.strategy_config",
        "reward.strategy_args.strategy_name=hf_infer",
        "~reward.strategy_args.strategy_config",
        "actor_infer.infer_batch_size=48",
        "track_with=stdout",
        f"output_dir={out}",  # outputs
        f"checkpoint_config.output_dir={out / 'ckpt'}",
    ]
    cfg = load_config(CONFIG, overrides).config
    assert cfg.agentic.env_manager == "vl_trajectory"
    assert cfg.reward.judge.model_path == str(judge) and cfg.reward.judge.temperature == 0.3
    assert main(["train", str(CONFIG), *overrides]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    (out / "train_rows.json").write_text(json.dumps(train))  # for a failing run's reader
    for r in train:
        assert "actor/pg_loss" in r
        assert r["env/tool_calls_mean"] > 0  # the zoom tool ran on the image
        assert r["rollout/images_per_episode"] > 1  # crops shown in later turns
        assert r["train/score_mean"] > 0.5  # the judge's 1 (0.8), with tool bonuses
    after = AutoModelForImageTextToText.from_pretrained(out / "final" / "actor")
    assert any(not p.equal(before[n]) for n, p in after.named_parameters())
