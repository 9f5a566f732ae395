"""ROLL's detection domain end to end on a tiny Qwen2-VL: rows in Orsta-Data-47k's shape
(images, a ``reward_model`` with an ``<answer>`` ground truth, ratios and
``verifier_parm``) reach the ``detection`` reward through ``extra_info``, and a GRPO run
scores and trains on them for 2 steps without a failed sample."""

from __future__ import annotations

import json
from io import BytesIO
from pathlib import Path

import pytest
from PIL import Image

from temper.data.row_files import write_rows
from temper.data.tasks import visual_color_rows
from temper.pipelines import run_pipeline
from temper.pipelines.catalog import build_config

pytestmark = pytest.mark.slow

SIZE = 56
RATIOS = {
    "iou_max_label_first": 1.0,
    "iou_max_iou_first": 0.0,
    "iou_completeness": 0.3,
    "map": 0.5,
    "map50": 0.0,
    "map75": 0.0,
}


def detection_rows(n: int) -> list[dict]:
    """Squares on white (``visual_color``'s images), each to be found as a box on the
    0–1000 grid of the image."""
    rows = []
    for i, base in enumerate(visual_color_rows(n, seed=11, size=SIZE)):
        image = Image.open(BytesIO(base["images"][0]["bytes"])).convert("RGB")
        xs = [x for x in range(SIZE) for y in range(SIZE) if image.getpixel((x, y)) != (255,) * 3]
        ys = [y for x in range(SIZE) for y in range(SIZE) if image.getpixel((x, y)) != (255,) * 3]
        box = [round(v * 1000 / SIZE) for v in (min(xs), min(ys), max(xs) + 1, max(ys) + 1)]
        truth = f"[{{'bbox_2d': {box}, 'label': 'square'}}]"
        rows.append(
            {
                "data_source": "v3det_train",
                "ability": "cv_detection",
                "images": base["images"],
                "prompt": [
                    {
                        "role": "user",
                        "content": "<image>\nLocate the square. Answer within <answer> and "
                        "</answer> as [{'bbox_2d': [x1,y1,x2,y2],'label': label_name}]",
                    }
                ],
                "reward_model": {
                    "answer": truth,
                    "ground_truth": f"<answer>\n{truth}\n</answer>",
                    "accuracy_ratio": 1.0,
                    "format_ratio": 0.1,
                    "verifier": "detection",
                    "verifier_parm": {"det_verifier_normalized": True, "det_reward_ratio": RATIOS},
                },
                "extra_info": {"index": i},
            }
        )
    return rows


def test_detection_rows_train_two_steps(tmp_path, tiny_vlm_dir, monkeypatch):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path / "cache"))
    data = write_rows(detection_rows(6), tmp_path / "det.parquet")
    out = tmp_path / "run"
    cfg = build_config(
        {
            "experiment": {
                "output_dir": str(out),
                "max_steps": 2,
                "seed": 2,
                "trackers": ["jsonl"],
                "test_freq": 2,
            },
            "model": {"path": str(tiny_vlm_dir)},
            "data": {
                "train_files": [str(data)],
                "val_files": [str(data)],
                "train_batch_size": 2,
                "max_prompt_length": 192,
                "extra_info_columns": ["reward_model"],
            },
            "rollout": {"n": 2, "response_length": 6},
            "actor": {"mini_batch_size": 4, "micro_batch_size_per_device": 4},
            "algorithm": {"adv_estimator": "grpo"},
            "reward": {
                "num_workers": 1,  # a worker process, as a run has
                "routes": {"cv_detection": {"function": "detection", "tags": ["v3det_train"]}},
            },
        }
    )
    run_pipeline(cfg)
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in metrics if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:  # every sample scored by the detection rule, none failed
        assert r["train/reward_failures"] == 0
        assert "reward_extra/format_reward" in r and "reward_extra/accuracy_reward" in r
    assert any("val/reward_mean" in r for r in metrics)


def test_orsta_rows_reach_the_reward_as_extra_info(tmp_path, tiny_vlm_dir):
    from transformers import AutoTokenizer

    from temper.config.schema import DataConfig
    from temper.data import build_dataset
    from temper.data.vision import load_vision_processor

    path = write_rows(detection_rows(2), Path(tmp_path) / "det.parquet")
    tok = AutoTokenizer.from_pretrained(str(tiny_vlm_dir))
    cfg = DataConfig(max_prompt_length=192, extra_info_columns=["reward_model"])
    ds = build_dataset(path, cfg, tok, vision=load_vision_processor(str(tiny_vlm_dir), tok, cfg))
    batch = ds.make_batch([0, 1])
    info = batch["extra_info"][0]
    assert info["reward_model"]["verifier_parm"]["det_reward_ratio"] == RATIOS
    assert batch["ground_truth"][0].startswith("<answer>\n[{'bbox_2d': [")
    (image,) = batch["multi_modal_data"][0]["image"]  # the size the reward rescales with
    assert image.size[0] % 28 == 0 and image.size[1] % 28 == 0


def test_scorer_reads_the_model_type_only_for_a_reward_that_needs_it(tmp_path, tiny_vlm_dir):
    from temper.rewards.manager import RewardScorer

    data = write_rows(detection_rows(1), tmp_path / "det.parquet")

    def scorer(routes: dict) -> RewardScorer:
        cfg = build_config(
            {
                "model": {"path": str(tiny_vlm_dir)},
                "data": {"train_files": [str(data)]},
                "reward": {"num_workers": 1, "routes": routes},
            }
        )
        return RewardScorer.from_config(cfg)

    with scorer({"cv": {"function": "detection", "tags": ["v3det_train"]}}) as detecting:
        assert detecting.model_type == "qwen2_vl"  # answers on the 0-1000 grid: no rescale
    with scorer({"m": {"function": "math", "tags": ["math"]}}) as plain:
        assert plain.model_type is None
