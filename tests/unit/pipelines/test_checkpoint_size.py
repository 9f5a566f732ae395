"""One checkpoint's size, estimated from ``config.json`` (no weights read), and the
pre-flight that refuses a checkpoint directory whose disk cannot hold one."""

from __future__ import annotations

import json
import math
import shutil

import pytest
from safetensors import safe_open

from temper.config.errors import ConfigError
from temper.pipelines.catalog import build_config, plan
from temper.pipelines.checkpointing import (
    COPIES_PER_PARAMETER,
    estimate_checkpoint_size,
    parameter_count,
)
from temper.pipelines.preflight import preflight

TASK = "task:arithmetic?n=16&seed=3"


def _config(model_dir, tmp_path, **model):
    return build_config(
        {
            "model": {"path": str(model_dir), **model},
            "data": {"train_files": [TASK], "train_batch_size": 4, "max_prompt_length": 96},
            "rollout": {"n": 2, "response_length": 8},
            "experiment": {"output_dir": str(tmp_path / "out"), "max_steps": 1},
        }
    )


def _numel(model_dir) -> int:
    """Parameters in the weights file (tied weights are stored once)."""
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118


def test_parameters_are_counted_from_config_json_as_the_weights_hold_them(tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert parameter_count(config) == _numel(tiny_model_dir)
    assert parameter_count({"model_type": "no-such-architecture"}) is None


def test_estimate_is_the_export_the_trainers_copy_and_two_moments(tiny_model_dir, tmp_path):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    n = _numel(tiny_model_dir)
    fp32 = estimate_checkpoint_size(_config(tiny_model_dir, tmp_path), config, None, cpu=True)
    assert fp32 is not None and fp32.certain and fp32.bytes == n * 4 * COPIES_PER_PARAMETER
    on_gpu = estimate_checkpoint_size(_config(tiny_model_dir, tmp_path), config, None, cpu=False)
    assert on_gpu is not None and on_gpu.bytes == n * 2 * COPIES_PER_PARAMETER  # auto: bf16
    with_critic = estimate_checkpoint_size(
        _config(tiny_model_dir, tmp_path), config, config, cpu=True
    )
    assert with_critic is not None and fp32.bytes < with_critic.bytes <= 2 * fp32.bytes
    lora = _config(tiny_model_dir, tmp_path, lora={"rank": 4})
    merged = estimate_checkpoint_size(lora, config, None, cpu=True)
    assert merged is not None and not merged.certain and merged.bytes == n * 4


@pytest.fixture
def huge_model(tiny_model_dir, tmp_path):
    """The tiny model's directory, its config.json saying a trillion-parameter vocabulary:
    no disk holds one checkpoint of it."""
    path = tmp_path / "huge"
    shutil.copytree(tiny_model_dir, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "vocab_size": 10**12}))
    return path


def test_preflight_refuses_a_checkpoint_dir_without_room_for_one(huge_model, tmp_path):
    cfg = _config(huge_model, tmp_path)
    with pytest.raises(ConfigError) as err:
        preflight(cfg, plan(cfg), checks={"outputs"})
    assert err.value.key == "experiment.output_dir"
    assert err.value.reason.startswith("a checkpoint takes about ")
    assert f"and the disk of {tmp_path / 'out' / 'checkpoints'} has " in err.value.reason
    assert err.value.fix == "free space there, or set experiment.checkpoint_dir to a disk with room"


def test_an_uncertain_estimate_that_does_not_fit_is_a_note(huge_model, tmp_path):
    cfg = _config(huge_model, tmp_path, lora={"rank": 4})
    notes = preflight(cfg, plan(cfg), checks={"outputs"})
    assert any("the merged LoRA export" in n for n in notes), notes
