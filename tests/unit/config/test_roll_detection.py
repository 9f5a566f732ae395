"""ROLL's ``DetectionRewardWorker`` domain in the ROLL dialect: the route, the row column
it reads, ``DET_IOU_THRESHOLD`` and its reward model path — honoured or refused."""

from __future__ import annotations

from typing import Any

import pytest

from temper.config.dialects.roll.translate import translate_roll
from temper.config.errors import ConfigError
from temper.config.loader import RawConfig
from temper.config.schema import TemperConfig
from temper.config.typed import from_dict

W = "roll.pipeline.rlvr.rewards."
DETECTION = W + "detection_reward_worker.DetectionRewardWorker"
CODE = W + "code_sandbox_reward_worker.CodeSandboxRewardWorker"


def run(rewards: dict[str, Any], **top: Any) -> tuple[TemperConfig, list[str]]:
    data = {"pretrain": "Qwen/Qwen2.5-VL-7B-Instruct", "rewards": rewards, **top}
    t = translate_roll(RawConfig(data=data, source="<test>", from_defaults=set()))
    return from_dict(TemperConfig, t.native), t.notes


def detection(**more: Any) -> dict[str, Any]:
    return {
        "worker_cls": DETECTION,
        "model_args": {"model_name_or_path": "Qwen/Qwen2.5-VL-7B-Instruct"},
        "tag_included": ["v3det_train", "object365_train"],
        "world_size": 8,
        "infer_batch_size": 1,
        **more,
    }


def test_detection_worker_is_the_detection_route_reading_reward_model():
    cfg, notes = run({"cv_detection": detection()})
    route = cfg.reward.routes["cv_detection"]
    assert route.function == "detection" and route.tags == ["v3det_train", "object365_train"]
    assert route.kwargs == {}  # ROLL's default threshold, average, is the function's
    assert cfg.data.extra_info_columns == ["reward_model"]
    assert cfg.reward.num_workers == 8
    assert any("model_name_or_path" in n and "policy model's type" in n for n in notes)


def test_detection_and_code_domains_both_get_their_columns():
    cfg, _ = run({"code": {"worker_cls": CODE}, "cv_detection": detection()})
    assert cfg.data.extra_info_columns == [
        "case_type",
        "test_cases",
        "test_case_function",
        "reward_model",
    ]


@pytest.mark.parametrize(
    ("where", "value", "expected"),
    [("top", "0.75", 0.75), ("top", "dynamic", "dynamic"), ("worker", "0.99", 0.99)],
)
def test_det_iou_threshold_becomes_the_route_threshold(where, value, expected):
    env = {"DET_IOU_THRESHOLD": value}
    if where == "top":
        cfg, _ = run({"cv_detection": detection()}, system_envs=env)
    else:  # the worker's own environment (temper refuses two that disagree)
        cfg, _ = run({"cv_detection": detection(system_envs=env)})
    assert cfg.reward.routes["cv_detection"].kwargs == {"iou_threshold": expected}


def test_unknown_det_iou_threshold_is_refused_with_the_valid_ones():
    with pytest.raises(ConfigError) as err:
        run({"cv_detection": detection()}, system_envs={"DET_IOU_THRESHOLD": "0.42"})
    text = str(err.value)
    assert "system_envs.DET_IOU_THRESHOLD" in text and "'0.42'" in text
    assert "0.55" in text and "dynamic" in text and "average" in text


def test_reward_model_other_than_the_policy_is_refused():
    spec = detection(model_args={"model_name_or_path": "Qwen/Qwen3-VL-4B-Instruct"})
    with pytest.raises(ConfigError, match=r"rewards\.cv_detection\.model_args\.model_name_or_path"):
        run({"cv_detection": spec})
