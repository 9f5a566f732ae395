"""FSDP2 with bf16 master weights (``actor.master_dtype: bf16``) over two gloo ranks:
shards, gradients and AdamW state are bf16, the update (gradients reduced in fp32,
clipped over the whole model) agrees with the single-process engine's to bf16's
precision, and a checkpoint resumes bit for bit."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from test_fsdp2 import (  # same folder: pytest puts it on sys.path
    actor_config,
    make_batch,
    shard,
    weights,
    with_log_probs,
)

from temper.cluster.process_group import spawn_ranks
from temper.config.schema import ModelConfig, OptimConfig
from temper.data.batch import Batch
from temper.roles.actor import Actor
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytestmark = pytest.mark.slow


def make_actor(path: str, strategy: str) -> Actor:
    """lr 1e-2: every weight moves in bf16, norm weights at 1.0 included."""
    cfg = replace(
        actor_config(),
        master_dtype="bf16",
        optim=OptimConfig(
            lr=1e-2, weight_decay=0.01, lr_scheduler="linear", total_training_steps=4
        ),
    )
    spec = EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=MicroBatching(size=1),
        total_steps=4,
    )
    return Actor(cfg, build_engine(strategy, spec))


def _bf16_rank(rank: int, world: int, path: str, b1: Batch, b2: Batch, ckpt: str) -> Any:
    actor = make_actor(path, "fsdp2")
    engine: Any = actor.engine
    shards = {p.to_local().dtype for p in engine.model.parameters()}
    metrics = actor.update(shard(b1, rank, world))
    state = engine.optimizer.state.values()
    moments = {s[k].to_local().dtype for s in state for k in ("exp_avg", "exp_avg_sq")}
    grads = {p.grad is None for p in engine.model.parameters()}
    w1 = weights(actor)
    engine.save_checkpoint(ckpt)
    actor.update(shard(b2, rank, world))
    w2 = weights(actor)
    resumed = make_actor(path, "fsdp2")
    resumed.engine.load_checkpoint(ckpt)  # type: ignore[attr-defined]
    resumed.update(shard(b2, rank, world))
    same = all(torch.equal(v, w2[k]) for k, v in weights(resumed).items())
    out = {"shards": shards, "moments": moments, "grads": grads, "metrics": metrics}
    return {**out, "w1": w1, "same": same} if rank == 0 else {**out, "same": same}


def test_two_ranks_train_bf16_master_weights(tiny_path: str, tmp_path: Path) -> None:
    single = make_actor(tiny_path, "torch")
    b1 = with_log_probs(single, make_batch(0))
    b2 = with_log_probs(single, make_batch(1))
    before = weights(single)
    ref_metrics = single.update(b1)
    ref = weights(single)

    ranks = spawn_ranks(_bf16_rank, 2, tiny_path, b1, b2, str(tmp_path / "ckpt"))

    for r in ranks:
        assert r["shards"] == {torch.bfloat16} and r["moments"] == {torch.bfloat16}
        assert r["grads"] == {True}  # cleared after the step
        assert r["same"]  # resumed step 2 == uninterrupted step 2, on every rank
    got = ranks[0]["metrics"]
    assert 0.05 < got["actor/grad_norm"] < float("inf")  # finite, and clipping bit
    assert got["actor/grad_norm"] == pytest.approx(ref_metrics["actor/grad_norm"], rel=2e-2)
    w1 = ranks[0]["w1"]
    assert {v.dtype for v in w1.values()} == {torch.bfloat16}
    assert all(not torch.equal(before[k], w1[k]) for k in before), "a weight did not move"
    # fp32 reductions in another order: at most one bf16 step apart from the single process
    for k in ref:
        torch.testing.assert_close(w1[k], ref[k], atol=2e-3, rtol=8e-3, msg=k)
