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
