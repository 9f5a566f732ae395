"""ROLL's on-policy distillation files: the student's workers are the actor's, each
teacher becomes ``distill.teachers.<name>`` (model, ``opd_kl_coef``, ``tag_included``),
pure mode fixes what ROLL fixes, and messages name the file's own keys."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from reference_paths import UPSTREAM  # next to this file

from temper.config.dialects.roll.translate import translate_roll
from temper.config.errors import ConfigError
from temper.config.loader import RawConfig, load_yaml
from temper.config.schema import TemperConfig
from temper.config.typed import from_dict

OPD = UPSTREAM / "roll-2026-08-8eb27cc/examples/qwen3-8B-onpolicy-distill-megatron"
SINGLE = OPD / "onpolicy_distill_config.yaml"
MULTI = OPD / "multi_teacher_onpolicy_distill_config.yaml"


@cache
def _base(path: Path) -> dict[str, Any]:
    return load_yaml(path, []).data


def build(data: dict[str, Any]) -> tuple[TemperConfig, list[str]]:
    tr = translate_roll(RawConfig(data=data, source="<test>"))
    return from_dict(TemperConfig, tr.native), tr.notes


def test_single_teacher_file_is_pure_distillation_of_the_student():
    cfg, notes = build(copy.deepcopy(_base(SINGLE)))
    assert cfg.pipeline == "rlvr" and cfg.model.path == "Qwen/Qwen3-8B"
    assert cfg.distill.pure
    ((name, teacher),) = cfg.distill.teachers.items()
    assert (name, teacher.model_path, teacher.kl_coef, teacher.tags) == (
        "default",
        "Qwen/Qwen3-32B",
        1.0,
        [],
    )
    # what ROLL's pure OPD fixes; the teacher's engine is the reference section's
    assert cfg.algorithm.adv_estimator == "reinforce" and cfg.algorithm.gamma == 0.0
    assert not cfg.algorithm.use_kl_in_reward and not cfg.actor.use_kl_loss
    assert cfg.reference.strategy == "megatron"
    assert cfg.reference.megatron.pipeline_model_parallel_size == 4
    assert cfg.actor.strategy == "megatron" and cfg.rollout.n == 4
    assert any(n.startswith("teacher: on-policy distillation from default (pure)") for n in notes)


def test_multi_teacher_file_routes_by_tag_with_each_coefficient():
    data = copy.deepcopy(_base(MULTI))
    data["teacher"]["teacher_14B"]["opd_kl_coef"] = 0.5
    cfg, notes = build(data)
    teachers = cfg.distill.teachers
    assert list(teachers) == ["teacher_32B", "teacher_14B"]
    assert teachers["teacher_32B"].model_path == "Qwen/Qwen3-32B"
    assert (teachers["teacher_32B"].kl_coef, teachers["teacher_32B"].tags) == (1.0, ["math_dapo"])
    assert (teachers["teacher_14B"].kl_coef, teachers["teacher_14B"].tags) == (0.5, ["KodCode"])
    assert cfg.resources.reference == list(range(16, 32))  # the first teacher's devices
    # the second teacher's megatron degrees differ from the first's: said, not silent
    assert any(n.startswith("teacher.teacher_14B: its worker settings") for n in notes)


def test_mixed_mode_keeps_the_rl_advantage():
    data = copy.deepcopy(_base(SINGLE))
    data["actor_train"] = data.pop("student_train")
    data["actor_infer"] = data.pop("student_infer")
    data |= {"use_opd": True, "adv_estimator": "grpo"}
    cfg, _ = build(data)
    assert not cfg.distill.pure and cfg.algorithm.reward_norm == "group"
    assert list(cfg.distill.teachers) == ["default"]


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"use_opd": True}, "use_opd"),  # with student_train: both modes at once
        ({"teacher": {"model_args": {"dtype": "bf16"}}}, "teacher.model_args.model_name_or_path"),
        ({"actor_train": {"model_args": {"dtype": "bf16"}}}, "actor_train"),
    ],
)
def test_what_roll_refuses_names_the_key(change, key):
    data = copy.deepcopy(_base(SINGLE)) | change
    with pytest.raises(ConfigError) as err:
        build(data)
    assert err.value.key == key


def test_errors_name_the_students_and_teachers_keys():
    data = copy.deepcopy(_base(SINGLE))
    data["student_train"]["training_args"]["no_such_key"] = 1
    with pytest.raises(ConfigError) as err:
        build(data)
    assert err.value.key == "student_train.training_args.no_such_key"
    tr = translate_roll(RawConfig(data=copy.deepcopy(_base(SINGLE)), source="<test>"))
    assert tr.sources["resources.actor_train"] == "student_train.device_mapping"
    assert tr.sources["reference.strategy"] == "teacher.strategy_args.strategy_name"


def test_a_tag_template_other_than_the_files_is_refused():
    data = copy.deepcopy(_base(MULTI))
    data["tag_to_template"]["KodCode"] = "qwen3_nothink"
    with pytest.raises(ConfigError) as err:
        build(data)
    assert err.value.key == "tag_to_template.KodCode"
