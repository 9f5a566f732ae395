"""ROLL's (offline) distillation files: ``student`` is the actor, ``teacher`` the one
entry of ``distill.teachers`` with the reference section's engine, the ``kd_*`` keys the
``kd`` section; what cannot run is refused in one line naming the file's own key."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from reference_paths import UPSTREAM  # next to this file

from temper.config.dialects.roll.translate import key_meaning, translate_roll
from temper.config.errors import ConfigError
from temper.config.loader import RawConfig, load_yaml
from temper.config.schema import TemperConfig
from temper.config.typed import from_dict
from temper.pipelines.catalog import load_config

EXAMPLES = UPSTREAM / "roll-2026-08-8eb27cc/examples"
MEGATRON = EXAMPLES / "qwen2.5-7B-distill_megatron/distill_megatron.yaml"
VL = EXAMPLES / "qwen2.5-vl-7B-distill/distill_vl_fsdp2.yaml"


@cache
def _base(path: Path) -> dict[str, Any]:
    return load_yaml(path, []).data


def build(data: dict[str, Any]) -> tuple[TemperConfig, list[str]]:
    tr = translate_roll(RawConfig(data=data, source="<test>"))
    return from_dict(TemperConfig, tr.native), tr.notes


def test_megatron_file_is_a_distill_run_of_the_student_on_the_teacher():
    cfg, notes = build(copy.deepcopy(_base(MEGATRON)))
    assert cfg.pipeline == "distill" and cfg.model.path == "Qwen/Qwen2.5-7B-Instruct"
    assert cfg.distill.teachers["default"].model_path == "Qwen/Qwen2.5-14B-Instruct"
    kd = cfg.kd
    assert (kd.objective, kd.topk, kd.loss_weight, kd.temperature) == ("forward_kl", 64, 0.85, 1)
    assert (cfg.data.prompt_key, cfg.sft.response_key) == ("question_zh", "answer_zh")
    assert cfg.sft.max_length == 2048 and cfg.actor.grad_clip == 1.0
    # 8 devices over TP 2 × PP 2 × CP 2: one data-parallel rank, 8 × 4 rows a step
    assert cfg.data.train_batch_size == 32
    assert cfg.actor.strategy == cfg.reference.strategy == "megatron"
    assert cfg.reference.log_prob_micro_batch_size_per_device == 8  # the teacher forward
    assert cfg.resources.reference == list(range(8))
    assert any("'\\n' + question" in n for n in notes)


def test_kd_keys_and_roll_defaults():
    data = copy.deepcopy(_base(MEGATRON))
    del data["question_key"], data["answer_key"], data["max_grad_norm"]
    data |= {"kd_objective": "adaptive_kl", "adaptive_kl_alpha": 0.3, "kd_temperature": 2.0}
    data |= {"teacher_temperature": 0.5, "skew_lambda": 0.2, "logits_topk": 0}
    cfg, notes = build(data)
    kd = cfg.kd
    assert (kd.objective, kd.adaptive_alpha, kd.temperature) == ("adaptive_kl", 0.3, 2.0)
    assert (kd.teacher_temperature, kd.skew_lambda, kd.topk) == (0.5, 0.2, 0)
    # DistillConfig's defaults: question/answer columns, no gradient clipping
    assert (cfg.data.prompt_key, cfg.sft.response_key) == ("question", "answer")
    assert cfg.actor.grad_clip == 0
    assert any("question_key='question'" in n for n in notes)


@pytest.mark.parametrize(
    "change, start",
    [
        ({"teacher_pretrain": None}, "teacher_pretrain: offline distillation needs"),
        ({"teacher": {"model_args": {"torch_compile": True}}}, "teacher.model_args.torch_comp"),
    ],
)
def test_refusals_name_the_files_own_keys(change, start):
    data = copy.deepcopy(_base(MEGATRON))
    for key, value in change.items():
        if isinstance(value, dict):
            for sub, inner in value.items():
                data[key].setdefault(sub, {}).update(inner)
        else:
            data[key] = value
    with pytest.raises(ConfigError) as err:
        build(data)
    assert str(err.value).startswith(start), str(err.value)


def test_distill_on_prompt_learns_the_prompt():
    data = copy.deepcopy(_base(MEGATRON))
    assert build(data)[0].sft.learn_prompt is False
    data["distill_on_prompt"] = True
    assert build(data)[0].sft.learn_prompt is True


VL_MEGATRON = EXAMPLES / "qwen2.5-vl-7B-distill/distill_vl_megatron.yaml"


def test_vision_language_file_reads_rolls_vl_rows():
    """ROLL's VL distill pipeline: rows problem/solution/image whatever question_key says,
    ROLL's image bounds, samples cut at prompt_length, every token learnt."""
    cfg, notes = build(copy.deepcopy(_base(VL)))
    assert cfg.pipeline == "distill" and cfg.model.path == "Qwen/Qwen2.5-VL-7B-Instruct"
    assert cfg.distill.teachers["default"].model_path == "Qwen/Qwen2.5-VL-32B-Instruct"
    data = cfg.data
    assert (data.row_format, data.prompt_key, cfg.sft.response_key) == (
        "roll_distill_vl",
        "problem",
        "solution",
    )
    assert (data.image_min_pixels, data.image_max_pixels) == (56 * 56, 1024 * 1024)
    assert cfg.sft.learn_prompt is True and cfg.sft.max_length == 1024
    assert cfg.actor.strategy == cfg.reference.strategy == "fsdp2"
    kd = cfg.kd
    assert (kd.objective, kd.topk, kd.loss_weight) == ("forward_kl", 64, 0.85)
    assert any("rows problem/solution/image" in n for n in notes)
    assert any(n.startswith("sequence_length:") for n in notes)
    data = copy.deepcopy(_base(VL)) | {"prompt_length": 512, "distill_on_prompt": False}
    cfg, notes = build(data)
    assert cfg.sft.max_length == 512 and cfg.sft.learn_prompt is False
    assert any("ROLL's VL pipeline learns every token" in n for n in notes)


@pytest.mark.parametrize(
    "change, start",
    [
        ({"question_key": "q"}, "question_key: ROLL's VL distillation reads a row's problem"),
        ({"answer_key": "a"}, "answer_key: ROLL's VL distillation reads a row's problem"),
    ],
)
def test_vision_language_file_refuses_other_columns(change, start):
    with pytest.raises(ConfigError) as err:
        build(copy.deepcopy(_base(VL)) | change)
    assert str(err.value).startswith(start), str(err.value)
    assert f"(got {next(iter(change.values()))!r}). Fix: remove" in str(err.value)


def test_vision_language_megatron_file_runs_on_the_megatron_engine():
    """ROLL's megatron VL distillation file: student and teacher on the megatron engine
    with the file's TP=2 × PP=2 (the Qwen2-VL family converts, megatron_vision), its
    rows ROLL's VL columns."""
    cfg = load_config(VL_MEGATRON).config
    for section in (cfg.actor, cfg.reference):
        assert section.strategy == "megatron"
        assert section.megatron.tensor_model_parallel_size == 2
        assert section.megatron.pipeline_model_parallel_size == 2
    assert cfg.data.row_format == "roll_distill_vl"


def test_every_key_of_the_files_is_explained():
    for key in ("kd_objective", "logits_topk", "logits_transfer_backend", "teacher_pretrain"):
        assert key_meaning(key) is not None, key
