"""Tables of the schema that other layers derive theirs from: they agree with the types."""

from __future__ import annotations

from typing import get_args

import pytest
import torch

from temper.config.errors import ConfigError
from temper.config.schema import DTYPES, Dtype, Precision


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
