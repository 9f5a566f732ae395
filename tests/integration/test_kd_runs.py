"""Offline distillation end to end on tiny models: the student (the tiny test model)
learns given responses while a confident teacher (another tiny model on the same
tokenizer) scores the same tokens; the divergence to the teacher falls and every
parameter moves. ROLL's distill example file trains unchanged but for these overrides:

- model: the tiny student and teacher in place of the author's;
- data: a JSON-lines file with the file's own columns (``question_zh``/``answer_zh``),
  with two bad rows, which are reported by file and row and skipped;
- length: short samples and 4 steps;
- device: one device for both workers, so no tensor, pipeline or context parallelism;
- where outputs go.

Every other setting — batch arithmetic (8 per device × 4 accumulation), the divergence
(forward KL over the teacher's top 64, weight 0.85), the learning rate and schedule, the
megatron engines of both workers — is the file's.

The same file also trains on 2 devices (the Ray backend) with both workers at the file's
pipeline parallelism (2 stages; tensor and context parallelism 1, as 2 devices hold no
more), and its first step's losses are the one-device run's on the same rows.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from temper.cli.main import main
from temper.cluster.placement import placement_rows
from temper.data.tasks import make_task_rows
from temper.pipelines import run_pipeline
from temper.pipelines.catalog import build_config, load_config
from temper.utils.tiny import make_tiny_model

pytestmark = pytest.mark.slow

UPSTREAM = Path(__file__).resolve().parents[1] / "data" / "upstream"
TRAIN = "task:arithmetic?n=64&seed=5&response=true"
VAL = "task:arithmetic?n=16&seed=6&split=test&response=true"


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    """Another tiny model on the same tokenizer, made confident (its final norm ×16
    scales its logits), so its top-k distribution is far from the random student's."""
    from transformers import AutoModelForCausalLM

    out = make_tiny_model(tmp_path_factory.mktemp("kd-teacher"), hidden_size=32, seed=7)
    model = AutoModelForCausalLM.from_pretrained(out)
    with torch.no_grad():
        model.model.norm.weight.mul_(16.0)
    model.save_pretrained(out)
    return out


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _moved(before_dir: Path, after: Path) -> list[str]:
    """Names of the parameters that did not move."""
    before = load_file(str(before_dir / "model.safetensors"))
    final = load_file(str(after / "final" / "actor" / "model.safetensors"))
    assert before.keys() == final.keys()
    return [k for k in before if torch.equal(before[k], final[k])]


def test_divergence_to_the_teacher_falls_and_every_parameter_moves(
    tmp_path, tiny_model_dir, teacher_dir, monkeypatch
):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "kd"
    cfg = {
        "pipeline": "distill",
        "model": {"path": str(tiny_model_dir)},
        "data": {"train_files": [TRAIN], "val_files": [VAL], "train_batch_size": 8},
        "sft": {"max_length": 128},
        "kd": {"objective": "forward_kl", "topk": 16, "loss_weight": 0.85},
        "distill": {"teachers": {"default": {"model_path": str(teacher_dir)}}},
        "actor": {"micro_batch_size_per_device": 4, "optim": {"lr": 3e-3}},
        "experiment": {
            "max_steps": 8,
            "test_freq": 4,
            "val_before_train": True,
            "output_dir": str(out),
            "trackers": ["jsonl"],
        },
    }
    summary = run_pipeline(build_config(cfg))
    assert summary["curve"] == "train/distill_loss" and summary["steps"] == 8
    kl = summary["curve_values"]
    assert kl[-1] < 0.6 * kl[0], kl
    assert summary["val_after"] < summary["val_before"]  # the student's NLL, ROLL's val
    rows = [r for r in _rows(out) if "train/distill_loss" in r]
    for r in rows:  # the mixed loss is (1 − w)·NLL + w·KD of the same mini-batches
        want = 0.15 * r["train/sft_loss"] + 0.85 * r["train/distill_loss"]
        assert r["train/loss"] == pytest.approx(want, rel=1e-5)
    assert not _moved(tiny_model_dir, out), "parameters that did not move"


def _question_rows(path: Path, n: int) -> Path:
    """``n`` arithmetic rows in the ROLL file's columns, and two bad rows (lines 3, 6)."""
    rows = [
        {"question_zh": r["prompt"][0]["content"], "answer_zh": r["response"]}
        for r in make_task_rows("arithmetic", n=n, seed=5, response=True)
    ]
    rows.insert(2, {"question_zh": "What is 1 + 1?"})  # no answer column
    rows.insert(5, {"question_zh": "What is 2 + 2?", "answer_zh": None})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


#: ROLL's megatron distillation example: student megatron_train, teacher megatron_infer,
#: each TP=2 × PP=2 × CP=2 over the same 8 devices.
ROLL_KD = (
    UPSTREAM / "roll-2026-08-8eb27cc/examples/qwen2.5-7B-distill_megatron/distill_megatron.yaml"
)
#: One device: every parallel size of both workers 1.
ONE_DEVICE = {
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "context_parallel_size": 1,
    "sequence_parallel": "false",
}


def _roll_overrides(
    out: Path, student: Path, teacher: Path, data: Path, devices: int, parallel: dict, steps: int
) -> list[str]:
    """The ROLL file's overrides: model, data, length, ``devices`` for both workers with
    ``parallel`` (strategy_config keys) on both, outputs."""
    return [
        f"student_pretrain={student}",  # model
        f"teacher_pretrain={teacher}",
        f"student.data_args.file_name=[{data}]",  # data
        f"validation.data_args.file_name=[{data}]",
        "sequence_length=128",  # length
        f"max_steps={steps}",
        f"num_gpus_per_node={devices}",  # device
        f"student.device_mapping=list(range(0,{devices}))",
        f"teacher.device_mapping=list(range(0,{devices}))",
        *(
            f"{role}.strategy_args.strategy_config.{k}={v}"
            for role in ("student", "teacher")
            for k, v in parallel.items()
        ),
        f"output_dir={out}",  # outputs
        f"checkpoint_config.output_dir={out}/ckpt",
    ]


def test_roll_distill_file_trains(tmp_path, tiny_model_dir, teacher_dir, monkeypatch, caplog):
    """ROLL's megatron distillation example (2026-08): 32 rows a step (8 per device × 4
    accumulation on one device), the file's own columns, forward KL over the teacher's
    top 64 at weight 0.85, lr 2e-5 constant. The 32 training rows are one step's batch,
    so every step sees the same rows and their divergence to the teacher is comparable."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "roll-kd"
    data = _question_rows(tmp_path / "gsm8k_zh.jsonl", 32)
    overrides = _roll_overrides(out, tiny_model_dir, teacher_dir, data, 1, ONE_DEVICE, steps=4)
    assert main(["train", str(ROLL_KD), *overrides]) == 0
    rows = [r for r in _rows(out) if "train/distill_loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["perf/samples"] == 32 for r in rows)
    assert all(r["data/skipped_rows"] == 2 for r in rows)
    assert f"{data.name}:line 3: missing column 'answer_zh'" in caplog.text
    assert f"{data.name}:line 6: column 'answer_zh' is null" in caplog.text
    kl = [r["train/distill_loss"] for r in rows]
    assert all(b < a for a, b in itertools.pairwise(kl)), kl
    assert not _moved(tiny_model_dir, out), "parameters that did not move"


@pytest.mark.ray
def test_roll_distill_file_trains_over_two_pipeline_stages(
    tmp_path, tiny_model_dir, teacher_dir, monkeypatch, ray_session
):
    """The same file on 2 devices (the Ray backend, as ROLL places its workers): student
    and teacher each two pipeline stages (the file's PP=2) on the same 2 devices. The
    file's TP=2 and CP=2 are set to 1: with PP=2 they would need 8 devices. One step's
    batch is all 32 good rows, so this run and the one-device run learn from the same
    samples: the PP=2 teacher's top-k logits and the PP=2 student's loss give the
    one-device run's losses (fp32 on CPU), and every student parameter moves."""
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    data = _question_rows(tmp_path / "gsm8k_zh.jsonl", 32)
    two = {"tensor_model_parallel_size": 1, "context_parallel_size": 1}
    out = tmp_path / "roll-kd-pp2"
    loaded = load_config(
        ROLL_KD, _roll_overrides(out, tiny_model_dir, teacher_dir, data, 2, two, 2)
    )
    assert loaded.config.actor.megatron.pipeline_model_parallel_size == 2  # the file's
    assert loaded.config.reference.megatron.pipeline_model_parallel_size == 2
    rows = placement_rows(loaded.config, loaded.plan)[1:]  # role -> devices, ranks, dp, engine
    assert {r[0]: (r[1], r[3], r[4], r[5]) for r in rows} == {
        "actor": ("0,1", "2", "1", "megatron"),
        "teacher:default": ("0,1", "2", "1", "megatron"),
    }
    assert loaded.config.resources.backend == "ray"
    run_pipeline(loaded.config)
    pp2 = [r for r in _rows(out) if "train/distill_loss" in r]
    assert [r["step"] for r in pp2] == [1, 2]
    assert all(r["perf/samples"] == 32 for r in pp2)
    assert all(math.isfinite(r["train/distill_loss"]) for r in pp2)
    assert not _moved(tiny_model_dir, out), "parameters that did not move"

    one_out = tmp_path / "roll-kd-one"
    one = _roll_overrides(one_out, tiny_model_dir, teacher_dir, data, 1, ONE_DEVICE, 1)
    assert main(["train", str(ROLL_KD), *one]) == 0
    (first,) = [r for r in _rows(one_out) if "train/distill_loss" in r]
    for key in ("train/loss", "train/distill_loss", "train/sft_loss"):
        assert pp2[0][key] == pytest.approx(first[key], rel=1e-5, abs=1e-6), key
