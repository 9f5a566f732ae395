"""Router replay R3 with vLLM on CUDA (``enable_return_routed_experts``, vLLM's V2 model
runner): a tiny Qwen3-MoE / Mixtral rolled out in bf16 —

* ``routed_experts`` comes back in the batch's columns: -1 at padding and at each row's
  last generated token, the experts of every other token; those are, but for near-ties
  of bf16 kernels, the experts the fp32 trainer's teacher-forced forward picks;
* the actor under R3 replays them: its old log-probs are at least as close to the
  rollout's as with its own routing.

Written for a GPU machine; skipped without CUDA or a GPU build of vLLM (not run on the
CPU CI).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from temper.config.schema import ActorConfig, ModelConfig, OptimConfig, RolloutConfig
from temper.data.batch import Batch
from temper.data.routing import ROUTED_EXPERTS, real_columns
from temper.roles.actor import Actor
from temper.rollout.base import SamplingParams
from temper.rollout.vllm_kv import EngineDemand
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec
from temper.utils.tiny import make_tiny_moe_model


def _gpu_vllm() -> bool:
    if not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None:
        return False
    from temper.rollout.vllm_engine import is_cpu_platform

    return not is_cpu_platform()


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _gpu_vllm(), reason="needs CUDA and a GPU build of vLLM"),
]


def _prompts() -> Batch:
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([6, 2, 4, 5])
    mask = (torch.arange(6)[None] >= 6 - lengths[:, None]).long()
    ids = torch.where(mask > 0, torch.randint(3, 250, (4, 6), generator=g), 0)
    return Batch.from_dict({"prompt_ids": ids, "prompt_mask": mask})


def _actor(path: str, replay: str) -> Actor:
    cfg = ActorConfig(
        strategy="torch",
        micro_batch_size_per_device=4,
        optim=OptimConfig(lr=1e-3, weight_decay=0.0),
        router_replay=replay,
    )
    spec = EngineSpec(
        model=ModelConfig(path=path, dtype="fp32"),
        device=torch.device("cuda"),
        train=cfg,
        infer_micro=MicroBatching(size=4),
        router_replay=replay != "none",
    )
    return Actor(cfg, build_engine("torch", spec))


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral"])
def test_vllm_returns_the_routing_r3_replays(tmp_path: Path, model_type: str) -> None:
    from temper.rollout.vllm_engine import VLLMRolloutEngine

    path = make_tiny_moe_model(tmp_path / model_type, model_type)
    demand = EngineDemand(64, ("test",), 8, routed_experts=True)
    engine = VLLMRolloutEngine.from_config(
        RolloutConfig(engine="vllm", max_model_len=64, gpu_memory_utilization=0.3),
        ModelConfig(path=path),
        seed=0,
        demand=demand,
    )
    try:
        out = engine.generate(
            _prompts(), SamplingParams(n=2, max_new_tokens=8, routed_experts=True)
        )
    finally:
        engine.close()
    out = out.to("cpu")
    routed = out[ROUTED_EXPERTS]
    actor = _actor(path, "R2")
    assert actor.engine.router_replay is not None
    layers = actor.engine.router_replay.num_layers
    assert routed.shape == (8, 6 + out["response_ids"].shape[1], layers, 2)
    have = routed[..., 0, 0] >= 0
    real = real_columns(out["prompt_mask"], out["response_mask"])
    assert not (have & ~real).any()
    last = real.cumsum(dim=1).argmax(dim=1)
    assert not have[torch.arange(8), last].any() and (have | ~real).sum() == real.numel() - 8
    own = actor.engine.forward(out.to("cuda"), routing="record")[ROUTED_EXPERTS].cpu()
    agree = (routed.sort(-1).values == own.sort(-1).values).all(-1)[have]
    print(
        f"\n{model_type}: vLLM bf16 routing = fp32 trainer's at {float(agree.float().mean()):.4f}"
    )
    assert agree.float().mean() > 0.9
    gaps = {}
    for mode in ("R3", "none"):
        scored = _actor(path, mode).compute_log_probs(out.to("cuda")).to("cpu")
        mask = scored["response_mask"] > 0
        gaps[mode] = float(
            (scored["old_log_probs"] - scored["rollout_log_probs"]).abs()[mask].mean()
        )
    print(f"{model_type}: mean |old - rollout| log-prob {gaps}")
    assert gaps["R3"] <= gaps["none"]
