"""``model.use_liger`` (temper.training.liger): which model Liger's kernels go into, and
what happens where they cannot (CPU: the model is left as HF built it; no liger-kernel
on a GPU: a config error naming the key). The kernels themselves run on CUDA only
(tests/gpu/test_liger_gpu.py)."""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytest
import torch

from temper.config.errors import ConfigError
from temper.config.schema import LoraConfig, ModelConfig
from temper.training.liger import apply_liger, hf_model
from temper.training.models import load_causal_lm, load_value_model
from temper.utils.tiny import make_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: Any) -> str:
    return str(make_tiny_model(tmp_path_factory.mktemp("liger") / "m"))


def test_hf_model_is_the_transformers_model_inside_any_wrapper(tiny: str) -> None:
    lm = load_causal_lm(ModelConfig(path=tiny), device=torch.device("cpu"), dtype=torch.float32)
    assert hf_model(lm) is lm
    value = load_value_model(
        ModelConfig(path=tiny), device=torch.device("cpu"), dtype=torch.float32
    )
    assert hf_model(value) is value.backbone
    lora = load_causal_lm(
        ModelConfig(path=tiny, lora=LoraConfig(rank=4, alpha=8)),
        device=torch.device("cpu"),
        dtype=torch.float32,
    )
    assert hf_model(lora) is lora.get_base_model()


def test_on_cpu_the_model_keeps_its_modules_and_a_warning_says_so(
    tiny: str, caplog: pytest.LogCaptureFixture
) -> None:
    lm = load_causal_lm(ModelConfig(path=tiny), device=torch.device("cpu"), dtype=torch.float32)
    kinds = [type(m) for m in lm.modules()]
    with caplog.at_level(logging.WARNING):
        assert apply_liger(lm, torch.device("cpu"), "actor") is False
    assert [type(m) for m in lm.modules()] == kinds
    assert "model.use_liger needs CUDA" in caplog.text


def test_on_cuda_without_liger_kernel_the_key_is_named(
    tiny: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # import fails, installed or not
    lm = load_causal_lm(ModelConfig(path=tiny), device=torch.device("cpu"), dtype=torch.float32)
    with pytest.raises(ConfigError, match=r"model.use_liger: liger-kernel is not installed"):
        apply_liger(lm, torch.device("cuda"), "actor")
