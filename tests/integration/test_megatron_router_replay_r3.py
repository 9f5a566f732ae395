"""Router replay R3 on the megatron engine (gloo, fp32): the actor replays the routing an
``hf`` rollout recorded in bf16 (so it differs from the fp32 trainer's own at some
tokens) —

* its old-log-prob forward gives the torch engine's R3 old log-probs (the same replayed
  experts, HF's gates), at one rank and over two pipeline stages;
* no forward records: the batch keeps the rollout's routing;
* the update's first training forward (old weights) gives the old log-probs bitwise.

Run alone (a Megatron module: its own pytest process).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

import megatron.core.models.gpt.gpt_model  # noqa: F401  (imported once, before the forks)
from test_rollout_routing import prompts, rollout, trainer

import temper.training.megatron_engine  # noqa: F401
from temper.cluster.process_group import spawn_ranks
from temper.config.schema import ActorConfig, MegatronConfig, ModelConfig, OptimConfig
from temper.data.batch import Batch
from temper.data.routing import ROUTED_EXPERTS
from temper.roles.actor import Actor
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec
from temper.utils.tiny import make_tiny_moe_model

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory: Any) -> str:
    return make_tiny_moe_model(tmp_path_factory.mktemp("megatron-r3") / "q3", "qwen3_moe")


def megatron_actor(path: str, pp: int) -> Actor:
    cfg = ActorConfig(
        strategy="megatron",
        micro_batch_size_per_device=8,
        mini_batch_size=32,
        optim=OptimConfig(lr=1e-2, weight_decay=0.0),
        megatron=MegatronConfig(pipeline_model_parallel_size=pp),
        router_replay="R3",
    )
    spec = EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=MicroBatching(size=8),
        router_replay=True,
    )
    return Actor(cfg, build_engine("megatron", spec))


def _rank(rank: int, world: int, path: str, batch: Batch, pp: int) -> dict:
    actor = megatron_actor(path, pp)
    old = actor.compute_log_probs(batch)
    got: list[torch.Tensor] = []

    def capture(mb: Batch, out: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        got.append(out["log_probs"].detach())
        return out["log_probs"].sum() * 0.0, {}

    actor.engine.train_micro = MicroBatching(size=len(batch))  # got[0]: the whole batch
    actor.engine.train_mini_batch(old, capture)
    return {
        "old": old["old_log_probs"],
        "routed": old[ROUTED_EXPERTS],
        "train": got[0] if got else None,  # the loss runs on the last pipeline stage
    }


@pytest.mark.parametrize("pp", [1, 2], ids=["one-rank", "pp2"])
def test_megatron_r3_replays_the_rollout_routing_like_the_torch_engine(
    moe_path: str, pp: int
) -> None:
    out = rollout(moe_path, prompts(8, seed=1), dtype="bf16", n=4)
    ref = trainer(moe_path, "R3").compute_log_probs(out)
    free = trainer(moe_path, "none").compute_log_probs(out)
    ranks = spawn_ranks(_rank, pp, moe_path, out, pp)
    for r in ranks:
        assert torch.equal(r["routed"], out[ROUTED_EXPERTS])  # replayed, never re-recorded
        torch.testing.assert_close(r["old"], ref["old_log_probs"], atol=2e-5, rtol=0)
        if r["train"] is not None:
            assert torch.equal(r["train"], r["old"])  # the update's first forward: bitwise
    gap = (ref["old_log_probs"] - free["old_log_probs"]).abs().max()
    print(f"\nR3 vs own routing, torch engine old log-probs: max |Δ| {float(gap):.3e}")
    assert gap > 1e-4  # the rollout's routing differs from the trainer's where it is scored
