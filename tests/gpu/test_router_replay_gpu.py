"""Router replay (R2) on CUDA, for the torch engine (HF router hooks) and the megatron
engine (Megatron-Core's ``RouterReplay``), in bf16 autocast on one GPU:

* replaying a forward's own record changes nothing bitwise (bf16 autocast), on the GPU as
  on the CPU;
* replaying a designed routing (random experts per token) on the GPU in fp32 gives the
  torch engine's CPU log-probs under that routing: the GPU forward follows the recorded
  experts, not its own top-k (the tiny model's experts differ by a few 1e-3 in log-prob,
  so the comparison is fp32's, not bf16's).

Written for a GPU machine; skipped without CUDA (not run on the CPU CI).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from gpu_common import tiny_batch  # same folder: pytest puts it on sys.path

from temper.config.schema import ActorConfig, ModelConfig, OptimConfig
from temper.data.batch import Batch
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.router_replay import ROUTED_EXPERTS
from temper.training.spec import EngineSpec
from temper.utils.tiny import make_tiny_moe_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _engine(path: str, strategy: str, device: str, dtype: str) -> Any:
    cfg = ActorConfig(
        strategy=strategy,
        micro_batch_size_per_device=2,
        optim=OptimConfig(lr=1e-3, weight_decay=0.0),
        router_replay="R2",
    )
    spec = EngineSpec(
        model=ModelConfig(path=path, dtype=dtype),  # type: ignore[arg-type]
        device=torch.device(device),
        train=cfg,
        infer_micro=MicroBatching(size=2),
        router_replay=True,
    )
    return build_engine(strategy, spec)


def _designed(batch: Batch, layers: int, experts: int) -> torch.Tensor:
    """Random distinct top-2 experts for every token, ``(B, P + R, L, 2)``."""
    B, C = len(batch), batch["prompt_ids"].shape[1] + batch["response_ids"].shape[1]
    g = torch.Generator().manual_seed(1)
    rows = [torch.randperm(experts, generator=g)[:2] for _ in range(B * C * layers)]
    return torch.stack(rows).reshape(B, C, layers, 2).to(torch.int8)


def _with(batch: Batch, routing: torch.Tensor) -> Batch:
    return batch.union(Batch.from_dict({ROUTED_EXPERTS: routing}))


@pytest.mark.parametrize(
    "strategy",
    [
        "torch",
        pytest.param(
            "megatron",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("megatron") is None, reason="needs megatron-core"
            ),
        ),
    ],
)
def test_gpu_replay_is_bitwise_and_follows_a_designed_routing(
    tmp_path: Path, strategy: str
) -> None:
    path = make_tiny_moe_model(tmp_path / "qwen3_moe", "qwen3_moe")
    batch = tiny_batch(advantages=False)
    cpu = _engine(path, "torch", "cpu", "fp32")
    layers = cpu.router_replay.num_layers
    rec_cpu = cpu.forward(batch, routing="record")[ROUTED_EXPERTS]
    experts = int(rec_cpu.max()) + 1
    designed = _designed(batch, layers, max(experts, 4))
    ref = cpu.forward(_with(batch, designed), routing="replay")["log_probs"]

    gpu = _engine(path, strategy, "cuda", "auto")
    plain = gpu.forward(batch)["log_probs"]
    rec = gpu.forward(batch, routing="record")[ROUTED_EXPERTS]
    assert rec.shape == rec_cpu.shape
    assert torch.equal(rec >= 0, rec_cpu >= 0)  # padding marked alike
    replayed = gpu.forward(_with(batch, rec), routing="replay")["log_probs"]
    assert torch.equal(replayed.cpu(), plain.cpu())

    fp32 = _engine(path, strategy, "cuda", "fp32")
    own = fp32.forward(batch)["log_probs"].cpu()
    forced = fp32.forward(_with(batch, designed), routing="replay")["log_probs"].cpu()
    real = batch["response_mask"] > 0
    assert (forced - own)[real].abs().max() > 1e-3  # the designed routing bites
    torch.testing.assert_close(forced[real], ref[real], atol=2e-4, rtol=0)
