"""A tiny model shared by the rollout tests (built once per session, ~1 s)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_dir)


@pytest.fixture
def tiny_model(tiny_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)


@pytest.fixture
def prompts(tiny_tokenizer):
    """Two left-padded prompts of different lengths, with a uid object column."""
    from temper.data.batch import Batch

    enc = tiny_tokenizer(
        ["hi", "a somewhat longer prompt"], padding=True, padding_side="left", return_tensors="pt"
    )
    return Batch.from_dict(
        {"prompt_ids": enc["input_ids"], "prompt_mask": enc["attention_mask"]},
        {"uid": ["a", "b"]},
    )
