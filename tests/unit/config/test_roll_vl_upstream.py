"""ROLL's vision-language RLVR configs (the files ``start_rlvr_vl_pipeline.py`` runs), as
``temper check`` reads them: their VL keys are honoured (image pixel limits, the vision
tower frozen by prefix, vLLM's mm preprocessor cache), and what stops a file is named.

Keys that other open issues are building are removed first, each named with its issue:
the general ROLL keys (i12: ``attn_implementation``, ``async_generation_ratio``,
``offload_nccl``, ``device_map``, ROLL's default ``num_gpus_per_node`` of 8). ROLL's
detection domain (``rewards.cv_detection``) is checked as written: its route scores with
the ``detection`` reward and reads each row's ``reward_model``. The Megatron (i14) and
DeepSpeed (i13) engines these files name translate; their engines are those issues' work.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from reference_paths import UPSTREAM, needs, params  # next to this file

from temper.config.errors import ConfigError
from temper.pipelines.catalog import load_config

NEW = "roll-2026-08-8eb27cc/examples"
OLD = "roll-2025-06-70e9c6c/examples/qwen2.5-vl-7B-math"
# file -> (engine of actor_train, rejection substring or None when it passes)
FILES: dict[str, tuple[str, str | None]] = {
    f"{NEW}/qwen2_5-vl-3B-rlvr_fsdp2/rlvr_fsdp2_offload.yaml": ("fsdp2", None),
    f"{NEW}/qwen2.5-vl-7B-rlvr/rlvr_async.yaml": ("megatron", None),
    f"{NEW}/qwen2.5-vl-7B-rlvr/rlvr_megatron.yaml": ("megatron", None),
    f"{NEW}/qwen3-vl-4B-rlvr_megatron/rlvr_megatron_80G.yaml": ("megatron", None),
    # tensor-parallel vLLM rollouts: one engine over tensor_parallel_size actor_infer ranks
    f"{NEW}/qwen3-vl-32B-rlvr_megatron/rlvr_megatron_80GB.yaml": ("megatron", None),
    f"{NEW}/qwen3-vl-30BA3B-rlvr_megatron/rlvr_megatron_80GB.yaml": ("megatron", None),
    f"{NEW}/qwen3-vl-30BA3B-rlvr_megatron/rlvr_megatron_80GB_sglang.yaml": (
        "megatron",
        None,  # the config; its engine (sglang) is the pre-flight's to refuse
    ),
    f"{NEW}/qwen3-vl-30BA3B-rlvr_megatron/rlvr_megatron_ppu.yaml": ("megatron", None),
    # Video-R1: ROLL's data function's rows (data.row_format video_r1), its reward worker
    f"{NEW}/qwen3-vl-30BA3B-video-rlvr/video_r1.yaml": ("megatron", None),
    f"{NEW}/qwen3-vl-30BA3B-video-rlvr/video_r1_sglang.yaml": ("megatron", None),
    f"{OLD}/rlvr_math_megatron.yaml": ("megatron", None),
    f"{OLD}/rlvr_math_zero3.yaml": ("deepspeed", None),
}
# key -> the open issue that builds it (removed before checking)
OWNED_ELSEWHERE = {
    "actor_train.model_args.attn_implementation": "i12",
    "actor_infer.model_args.attn_implementation": "i12",
    "reference.model_args.attn_implementation": "i12",
    "reference.model_args.device_map": "i12",
    "async_generation_ratio": "i12",
    "actor_train.offload_nccl": "i12",
    "actor_infer.offload_nccl": "i12",
    "reference.offload_nccl": "i12",
    "offload_nccl": "i12",
}


def _get(data: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


def overrides(rel: str) -> list[str]:
    data = yaml.safe_load((UPSTREAM / rel).read_text())
    out = [f"~{k}" for k in OWNED_ELSEWHERE if _get(data, k) is not None]
    if _get(data, "num_gpus_per_node") is None:  # ROLL's default (i12)
        out.append("+num_gpus_per_node=8")
    return out


@needs(UPSTREAM / NEW)
@pytest.mark.parametrize("rel", params(sorted(FILES), UPSTREAM / NEW))
def test_roll_vl_file_passes_check_or_names_what_stops_it(rel):
    engine, rejection = FILES[rel]
    data = yaml.safe_load((UPSTREAM / rel).read_text())
    if rejection is not None:
        with pytest.raises(ConfigError) as err:
            load_config(UPSTREAM / rel, overrides(rel))
        assert rejection in str(err.value) and "\n" not in str(err.value)
        return
    cfg = load_config(UPSTREAM / rel, overrides(rel)).config
    assert cfg.actor.strategy == engine
    pixels = _get(data, "actor_train.data_args.image_max_pixels")
    assert cfg.data.image_max_pixels == pixels
    prefix = _get(data, "actor_train.model_args.freeze_module_prefix")
    assert cfg.actor.freeze_module_prefix == ([prefix] if prefix else [])
    if _get(data, "rewards.videor1") is not None:
        assert cfg.data.row_format == "video_r1"
        assert (cfg.data.video_fps, cfg.data.video_max_frames) == (2.0, 192)
        assert cfg.data.video_folder == _get(data, "actor_train.data_args.video_folder")
        route = cfg.reward.routes["videor1"]
        assert (route.function, route.tags) == ("video_r1", ["video"])
    if _get(data, "rewards.cv_detection") is not None:
        route = cfg.reward.routes["cv_detection"]
        assert route.function == "detection"
        assert route.tags == _get(data, "rewards.cv_detection.tag_included")
        assert "reward_model" in cfg.data.extra_info_columns
    infer = _get(data, "actor_infer.strategy_args.strategy_config") or {}
    if "disable_mm_preprocessor_cache" in infer:
        vllm = cfg.rollout.engine_kwargs.get("vllm", {})
        assert vllm["disable_mm_preprocessor_cache"] == infer["disable_mm_preprocessor_cache"]


@needs(UPSTREAM / NEW)
def test_validation_images_must_be_sized_like_training_images():
    rel = f"{NEW}/qwen2.5-vl-7B-rlvr/rlvr_megatron.yaml"
    with pytest.raises(ConfigError, match=r"validation\.data_args\.image_max_pixels: 5000 differs"):
        load_config(
            UPSTREAM / rel,
            [*overrides(rel), "validation.data_args.image_max_pixels=5000"],
        )


@needs(UPSTREAM / NEW)
def test_video_data_args_are_honoured_and_audio_is_refused():
    """Video-R1's video settings (ROLL's data_args) set temper's video sampling; the
    validation prompts' must agree; an audio folder is refused naming audio."""
    rel = f"{NEW}/qwen2.5-vl-7B-rlvr/rlvr_megatron.yaml"
    video = [
        "+actor_train.data_args.video_total_pixels=9633792",
        "+actor_train.data_args.video_min_pixels=100352",
        "+actor_train.data_args.video_max_pixels=100352",
        "+actor_train.data_args.video_fps=2.0",
        "+actor_train.data_args.video_max_frames=192",
        "+actor_train.data_args.video_folder=/data/videos",
        "+actor_train.data_args.video_resize_chunk_frames=32",
    ]
    data = load_config(UPSTREAM / rel, [*overrides(rel), *video]).config.data
    assert (data.video_total_pixels, data.video_min_pixels, data.video_max_pixels) == (
        9633792,
        100352,
        100352,
    )
    assert (data.video_fps, data.video_max_frames, data.video_folder) == (2.0, 192, "/data/videos")
    with pytest.raises(ConfigError, match=r"validation\.data_args\.video_fps: 1\.0 differs"):
        load_config(
            UPSTREAM / rel, [*overrides(rel), *video, "+validation.data_args.video_fps=1.0"]
        )
    with pytest.raises(ConfigError, match="audio inputs are not supported") as err:
        load_config(UPSTREAM / rel, [*overrides(rel), "+actor_train.data_args.audio_folder=/a"])
    assert "Qwen-Omni" in str(err.value)
