"""Tables of the schema that other layers derive theirs from: they agree with the types."""

from __future__ import annotations

from dataclasses import fields
from typing import get_args

import pytest
import torch

from temper.config.errors import ConfigError
from temper.config.schema import (
    DTYPES,
    MEGATRON_DEGREES,
    MODEL_PARALLEL_DEGREES,
    Dtype,
    MegatronConfig,
    Precision,
)


def test_the_dtype_table_is_the_dtype_literal():
    assert tuple(DTYPES) == get_args(Precision)
    assert get_args(Dtype) == ("auto", *DTYPES)


def test_every_dtype_name_is_a_torch_dtype_and_engines_derive_their_tables():
    from temper.config.schema import ModelConfig, RolloutConfig
    from temper.rollout.vllm_args import engine_args
    from temper.training.deepspeed_config import PRECISIONS
    from temper.training.models import resolve_dtype

    cpu = torch.device("cpu")
    for name, attr in DTYPES.items():
        assert isinstance(getattr(torch, attr), torch.dtype)
        assert PRECISIONS[resolve_dtype(name, cpu)] == name
        kwargs, _ = engine_args(
            RolloutConfig(engine="vllm", dtype=name),
            ModelConfig(path="/m"),
            on_cpu=True,
            seed=0,
            valid_args=[],
            environ={},
        )
        assert getattr(torch, kwargs["dtype"]) == resolve_dtype(name, cpu)
    assert resolve_dtype("auto", cpu) == torch.float32
    with pytest.raises(ConfigError, match="fp32, bf16, fp16"):
        resolve_dtype("float8", cpu)


def test_megatron_degrees_are_the_sections_degree_fields():
    # a new *_parallel_size field declared with doc() instead of degree() fails here
    sizes = [f.name for f in fields(MegatronConfig) if f.name.endswith("_parallel_size")]
    assert tuple(sizes) == MEGATRON_DEGREES and len(sizes) == 6
    assert MODEL_PARALLEL_DEGREES == (
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "context_parallel_size",
    )
    m = MegatronConfig(
        tensor_model_parallel_size=2,
        pipeline_model_parallel_size=3,
        context_parallel_size=5,
        expert_model_parallel_size=7,
    )
    assert m.model_parallel_size == 30  # experts are carved out of data parallelism
    assert m.degrees()["expert_model_parallel_size"] == 7 and list(m.degrees()) == list(
        MEGATRON_DEGREES
    )
    assert MegatronConfig().model_parallel_size == 1


def test_the_dialects_map_every_degree():
    from temper.config.dialects.roll.derive import MEGATRON_KEYS
    from temper.config.dialects.verl.megatron import DEGREES

    assert DEGREES == MEGATRON_DEGREES and set(MEGATRON_DEGREES) <= MEGATRON_KEYS
