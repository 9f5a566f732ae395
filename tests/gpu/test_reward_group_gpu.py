"""The reward model's Ray ``reward`` group on two GPUs (nccl): megatron at TP=2 and
fsdp2 data-parallel score as the one-process Hugging Face classifier on one GPU does.
Written for a GPU machine; skipped without 2 GPUs (not run on the CPU CI)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from temper.config.schema import MegatronConfig, RewardModelConfig
from temper.rewards.model import RewardModel
from temper.utils.tiny import make_tiny_classifier

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.ray,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs"),
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs ray"),
]

#: token lists of different lengths, micro-batched 2 by 2
SEQS = [[5, 9, 12, 40, 41], [7, 3], [100, 101, 102, 103, 104, 105, 106, 107], [8], [30, 31, 32]]


@pytest.mark.parametrize(
    ("strategy", "layout", "dp"),
    [("megatron", {"tensor_model_parallel_size": 2}, 1), ("fsdp2", {}, 2)],
    ids=["megatron-tp2", "fsdp2-dp2"],
)
def test_a_reward_group_on_two_gpus_scores_as_one_gpu(
    tmp_path: Path, strategy: str, layout: dict, dp: int
) -> None:
    from ray_groups import score_on_a_ray_group

    if strategy == "megatron" and importlib.util.find_spec("megatron") is None:
        pytest.skip("needs megatron-core")
    ray = pytest.importorskip("ray")
    path = make_tiny_classifier(tmp_path / "rm", "qwen2")
    config = RewardModelConfig(enable=True, path=path, micro_batch_size_per_device=2)
    want = RewardModel.from_config(config, device="cuda", dtype=torch.float32)
    expected = want.score_sequences(SEQS)
    try:
        got, data_size = score_on_a_ray_group(
            path, strategy, MegatronConfig(**layout), SEQS, device="cuda"
        )
    finally:
        if ray.is_initialized():
            ray.shutdown()
    assert data_size == dp
    # TF32 and TransformerEngine kernels may differ in the last bits from the HF model
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-3)
    assert expected.std() > 0
