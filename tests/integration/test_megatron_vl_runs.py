"""Runs of vision-language models on the megatron engine: ROLL's megatron VL
distillation example trains with only model, data, length, device and output
overrides; a GRPO run whose megatron actor is a tiny Qwen2-VL trains on image prompts."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("megatron.core")

from test_vl_distill import UPSTREAM, image_rows, metrics, models  # noqa: F401 (fixture)

from temper.cli.main import main

pytestmark = pytest.mark.slow

VL_MEGATRON = (
    UPSTREAM / "roll-2026-08-8eb27cc/examples/qwen2.5-vl-7B-distill/distill_vl_megatron.yaml"
)


def test_roll_megatron_vl_distill_file_passes_check_and_trains(tmp_path, models, monkeypatch):  # noqa: F811
    """ROLL's megatron VL distillation example (2026-08): the tiny student and teacher,
    rows in its columns, prompt_length 256 and 2 steps, one device (TP = PP = 1 for both
    workers), outputs; everything else is the file's (4 rows a step, forward KL over the top 64,
    weight 0.85, megatron_train student and megatron_infer teacher)."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    student, teacher = models
    data = image_rows(tmp_path)
    out = tmp_path / "roll"
    args = [
        str(VL_MEGATRON),
        f"student_pretrain={student}",  # model
        f"teacher_pretrain={teacher}",
        f"student.data_args.file_name=[{data}]",  # data
        "prompt_length=256",  # length
        "max_steps=2",
        "num_gpus_per_node=1",  # device
        "student.device_mapping=list(range(0,1))",
        "teacher.device_mapping=list(range(0,1))",
        "student.strategy_args.strategy_config.tensor_model_parallel_size=1",
        "student.strategy_args.strategy_config.pipeline_model_parallel_size=1",
        "teacher.strategy_args.strategy_config.tensor_model_parallel_size=1",
        "teacher.strategy_args.strategy_config.pipeline_model_parallel_size=1",
        f"output_dir={out}",  # outputs
        f"checkpoint_config.output_dir={out}/ckpt",
    ]
    assert main(["check", *args]) == 0
    assert main(["train", *args]) == 0
    rows = metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["perf/samples"] == 4 and r["train/distill_loss"] > 0 for r in rows)


def test_grpo_with_a_megatron_vl_actor_trains(tmp_path, tiny_vlm_dir, monkeypatch):
    """verl's VL GRPO example with the actor and reference on the megatron engine (the
    tiny Qwen2-VL, vision tower trained): two steps on image prompts; weights reach the
    rollout engine (by the HF model's names) and the saved actor is a VL directory."""
    from test_vl_tiny import TASK, run_example

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "verl"
    metrics = run_example(
        "verl_geo3k_vl_grpo.yaml",
        [
            f"actor_rollout_ref.model.path={tiny_vlm_dir}",
            f"data.train_files={TASK}",
            f"data.val_files={TASK}",
            "data.max_prompt_length=64",
            "data.max_response_length=4",
            "data.train_batch_size=4",
            "actor_rollout_ref.actor.strategy=megatron",
            "actor_rollout_ref.ref.strategy=megatron",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "trainer.total_training_steps=2",
            "trainer.test_freq=2",
            "trainer.logger=[console]",
            f"trainer.default_local_dir={out}",
        ],
    )
    train_rows = [r for r in metrics if "train/reward_mean" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    assert all("actor/kl" in r for r in train_rows)
    saved = out / "final" / "actor"
    assert (saved / "preprocessor_config.json").is_file()
    config = json.loads((saved / "config.json").read_text())
    assert config["architectures"] == ["Qwen2VLForConditionalGeneration"]


def test_video_grpo_with_a_megatron_qwen2_5_vl_actor_moves_the_tower(tmp_path, monkeypatch):
    """Video rows (``pixel_values_videos``, ``video_grid_thw``, Qwen2.5-VL's
    ``second_per_grid_ts`` in its M-RoPE positions) on a megatron actor and reference:
    2 steps, and the saved actor's vision tower and language model both moved."""
    from test_vl_video_tiny import LETTERS, moved_parameters, train_rows, video_rows

    from temper.pipelines import run_pipeline
    from temper.pipelines.catalog import build_config
    from temper.utils.tiny_vlm import make_tiny_vlm

    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    model = make_tiny_vlm(tmp_path / "qwen2_5_vl", family="qwen2_5_vl")
    reward = tmp_path / "letters.py"
    reward.write_text(LETTERS)
    cfg = build_config(
        {
            "experiment": {
                "output_dir": str(tmp_path / "run"),
                "max_steps": 2,
                "seed": 1,
                "trackers": ["jsonl"],
                "save_freq": -1,
            },
            "model": {"path": str(model)},
            "data": {
                "train_files": [str(video_rows(tmp_path / "data"))],
                "train_batch_size": 2,
                "max_prompt_length": 128,
                "video_max_frames": 4,
                "video_min_pixels": 4 * 32 * 32,
                "video_max_pixels": 4 * 32 * 32,
            },
            "rollout": {"n": 4, "response_length": 3, "engine": "hf"},
            "actor": {
                "strategy": "megatron",
                "mini_batch_size": 8,
                "micro_batch_size_per_device": 4,
                "use_kl_loss": True,
                "optim": {"lr": 1e-2, "weight_decay": 0.0},
            },
            "reference": {"strategy": "megatron"},
            "algorithm": {"adv_estimator": "grpo"},
            "reward": {
                "function": "custom",
                "custom_function": {"path": str(reward)},
                "num_workers": 0,
                "timeout_s": None,
            },
        }
    )
    run_pipeline(cfg)
    assert [r["step"] for r in train_rows(tmp_path / "run")] == [1, 2]
    moved = moved_parameters(model, tmp_path / "run" / "final" / "actor")
    tower = [k for k in moved if "visual" in k]
    assert tower and len(moved) > len(tower), moved
