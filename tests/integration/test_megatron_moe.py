"""Mixture-of-experts models on the megatron engine (Megatron-Core's MoE layer with
``SequentialMLP`` experts and the all-gather token dispatcher, gloo, fp32).

* converted tiny Qwen2-MoE (shared expert and its gate, top-k weights as they are),
  Qwen3-MoE (renormalised top-k, an MLP-only first layer) and Mixtral give Hugging
  Face's logits, at EP = 1 and EP = 2; the export gives back exactly the HF tensors;
* one actor update at EP = 2 equals the torch engine's (HF modeling code) without router
  losses, and equals EP = 1 with the auxiliary and z losses on, also as PP = 2 × EP = 2;
* FSDP2 trains the HF MoE model like the torch engine;
* a checkpoint saved at EP = 2 loads at EP = 1 and resumes at EP = 2 and EP = 1.

Whole runs and ``check`` on MoE models: test_megatron_moe_runs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

import megatron.core.models.gpt.gpt_model  # noqa: F401  (imported once, before the forks)
import torch.distributed.checkpoint
from test_megatron import (
    actor_config,
    make_batch,
    megatron_actor,
    shard,
    weights,
    with_log_probs,
)

import temper.training.megatron_engine  # noqa: F401
from temper.cluster.process_group import spawn_ranks
from temper.config.schema import MegatronConfig, ModelConfig
from temper.roles.actor import Actor
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec
from temper.utils.tiny import make_tiny_moe_model

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytestmark = pytest.mark.slow

ROUTER_LOSSES = {"moe_aux_loss_coeff": 0.01, "moe_z_loss_coeff": 0.001}


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("megatron-moe")
    return {t: make_tiny_moe_model(root / t, t) for t in ("qwen2_moe", "qwen3_moe", "mixtral")}


def make_actor(path: str, strategy: str, ep: int = 1, extra: dict | None = None) -> Actor:
    megatron = MegatronConfig(expert_model_parallel_size=ep, extra=dict(extra or {}))
    return megatron_actor(path, strategy, megatron)


# ----------------------------------------------------------------------- conversion


def _logits_rank(rank: int, world: int, paths: dict[str, str], ids: torch.Tensor) -> dict:
    """Each model's logits at EP = ``world`` and its HF export (rank 0's)."""
    from temper.training.megatron_io import MegatronCheckpointer
    from temper.training.megatron_model import build_model, read_model_source
    from temper.training.megatron_parallel import init_parallel

    m = MegatronConfig(expert_model_parallel_size=world)
    parallel = init_parallel(m, role="actor", device=torch.device("cpu"), seed=0)
    out: dict[str, Any] = {}
    for name, path in paths.items():
        spec = EngineSpec(model=ModelConfig(path=path), device=torch.device("cpu"), megatron=m)
        built = build_model(spec, read_model_source(spec), parallel, torch.device("cpu"))
        with torch.no_grad():
            logits = built.module(ids, torch.arange(ids.shape[1]).expand_as(ids), None)
        io = MegatronCheckpointer(
            model=built.module,
            built=built,
            parallel=parallel,
            optimizer=None,
            schedule=None,
            spec=spec,
            device=torch.device("cpu"),
            trainable=False,
        )
        exported = {k: v.clone() for k, v in io.hf_named_weights()}
        out[name] = {"logits": logits[..., : built.layout.vocab_size], "export": exported}
    return out


@pytest.mark.parametrize("ep", [1, 2], ids=["ep1", "ep2"])
def test_moe_models_give_hf_logits_and_export_back(moe_models, ep: int) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    ids = torch.randint(0, 256, (2, 11), generator=torch.Generator().manual_seed(1))
    ranks = spawn_ranks(_logits_rank, ep, moe_models, ids)
    for name, path in moe_models.items():
        ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)(ids).logits
        saved = load_file(str(Path(path) / "model.safetensors"))
        for got in ranks:  # every EP rank computes its own tokens with all experts
            torch.testing.assert_close(got[name]["logits"], ref, atol=2e-5, rtol=1e-5, msg=name)
            assert set(got[name]["export"]) == set(saved), name
            for k, v in got[name]["export"].items():
                assert torch.equal(v, saved[k]), k


# ----------------------------------------------------------------------- updates


def _step_rank(rank: int, world: int, path: str, batch: Any, ep: int, extra: dict) -> dict:
    actor = make_actor(path, "megatron", ep=ep, extra=extra)
    engine = actor.engine
    mine = shard(batch, engine.dp_rank, engine.dp_size)
    old = actor.compute_log_probs(mine)["old_log_probs"]
    metrics = actor.update(mine)
    full = weights(engine)
    return {"old": old, "dp": engine.dp_rank, "metrics": metrics, "weights": full}


def _gather(ranks: list[dict]) -> torch.Tensor:
    return torch.cat([r["old"] for r in sorted(ranks, key=lambda r: r["dp"])])


def test_expert_parallel_update_matches_torch_engine(moe_models, tmp_path: Path) -> None:
    """EP = 2 (each rank two of the four experts, its own samples) without router losses
    equals the torch engine (HF's Qwen2-MoE, whose router loss is off by default) over
    the whole batch: log-probs, loss and updated weights, clipping active. Weights are
    compared as saved (one tensor per expert; transformers fuses them in memory)."""
    from safetensors.torch import load_file

    path = moe_models["qwen2_moe"]
    single = make_actor(path, "torch")
    batch = with_log_probs(single, make_batch())
    before = load_file(str(Path(path) / "model.safetensors"))
    ref_metrics = single.update(batch)
    single.engine.save_hf(str(tmp_path / "torch"))
    ref = load_file(str(tmp_path / "torch" / "model.safetensors"))
    ranks = spawn_ranks(_step_rank, 2, path, batch, 2, {})
    torch.testing.assert_close(_gather(ranks), batch["old_log_probs"], atol=1e-5, rtol=1e-5)
    for r in ranks:
        for k in ("actor/pg_loss", "actor/grad_norm"):
            assert r["metrics"][k] == pytest.approx(ref_metrics[k], rel=1e-4, abs=1e-6), k
        assert set(r["weights"]) == set(ref)
        for k, v in r["weights"].items():
            torch.testing.assert_close(v, ref[k], atol=1e-5, rtol=1e-4, msg=k)
    moved = [k for k in ref if not torch.equal(ref[k], before[k])]
    assert any(".experts." in k for k in moved) and any("shared_expert_gate" in k for k in moved)


@pytest.mark.parametrize("model", ["qwen3_moe", "mixtral"])
def test_expert_parallel_equals_ep1_with_router_losses(moe_models, model: str) -> None:
    """With the auxiliary load-balancing and z losses on, EP = 2 gives EP = 1's
    log-probs, metrics and updated weights (both over 2 data-parallel ranks); the router
    losses change the update (compared with the run without them)."""
    path = moe_models[model]
    batch = with_log_probs(make_actor(path, "torch"), make_batch())
    ep2 = spawn_ranks(_step_rank, 2, path, batch, 2, ROUTER_LOSSES)
    ep1 = spawn_ranks(_step_rank, 2, path, batch, 1, ROUTER_LOSSES)
    plain = spawn_ranks(_step_rank, 2, path, batch, 1, {})
    torch.testing.assert_close(_gather(ep2), _gather(ep1), atol=1e-6, rtol=1e-6)
    for a, b in zip(ep2, ep1):
        for k in ("actor/pg_loss", "actor/grad_norm", "actor/moe_load_imbalance"):
            assert a["metrics"][k] == pytest.approx(b["metrics"][k], rel=1e-5, abs=1e-7), k
        assert 1.0 < a["metrics"]["actor/moe_load_imbalance"] <= 2.0  # 4 experts, top-2
        for k, v in a["weights"].items():  # Adam's first step: ~lr·sign(g) on tiny g
            torch.testing.assert_close(v, b["weights"][k], atol=1e-5, rtol=1e-4, msg=k)
    router = next(
        k
        for k in ep1[0]["weights"]
        if k.endswith("layers.1.mlp.gate.weight") or k.endswith("block_sparse_moe.gate.weight")
    )
    assert not torch.allclose(ep1[0]["weights"][router], plain[0]["weights"][router], atol=1e-7)


def _pp_ep_rank(rank: int, world: int, path: str, batch: Any) -> dict:
    cfg = actor_config("megatron")
    cfg.megatron = MegatronConfig(
        pipeline_model_parallel_size=2, expert_model_parallel_size=2, extra=dict(ROUTER_LOSSES)
    )
    spec = EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=MicroBatching(size=1),
        total_steps=4,
    )
    actor = Actor(cfg, build_engine("megatron", spec))
    engine = actor.engine
    mine = shard(batch, engine.dp_rank, engine.dp_size)
    old = actor.compute_log_probs(mine)["old_log_probs"]
    metrics = actor.update(mine)
    full = weights(engine)
    return {"old": old, "dp": engine.dp_rank, "metrics": metrics, "weights": full}


def test_pipeline_stages_with_expert_parallelism_equal_one_stage(moe_models) -> None:
    """PP = 2 × EP = 2 (4 ranks: a dense first layer on stage 0, the MoE layer's experts
    split over stage 1's two ranks) with router losses equals EP = PP = 1 over the same
    2 data-parallel shards: log-probs, metrics, updated weights."""
    path = moe_models["qwen3_moe"]
    batch = with_log_probs(make_actor(path, "torch"), make_batch())
    ref = spawn_ranks(_step_rank, 2, path, batch, 1, ROUTER_LOSSES)
    got = spawn_ranks(_pp_ep_rank, 4, path, batch)
    by_dp = {r["dp"]: r for r in ref}
    torch.testing.assert_close(_gather(got[:2]), _gather(ref), atol=1e-6, rtol=1e-6)
    for r in got:
        for k in ("actor/pg_loss", "actor/grad_norm"):
            want = by_dp[r["dp"]]["metrics"][k]
            assert r["metrics"][k] == pytest.approx(want, rel=1e-5, abs=1e-7), k
        assert set(r["weights"]) == set(ref[0]["weights"])
        for k, v in r["weights"].items():
            torch.testing.assert_close(v, ref[0]["weights"][k], atol=1e-5, rtol=1e-4, msg=k)


def _fsdp2_rank(rank: int, world: int, path: str, batch: Any) -> dict:
    actor = make_actor(path, "fsdp2")
    mine = shard(batch, rank, world)
    old = actor.compute_log_probs(mine)["old_log_probs"]
    metrics = actor.update(mine)
    return {"old": old, "metrics": metrics, "weights": weights(actor.engine)}


def test_fsdp2_trains_hf_moe_like_the_torch_engine(moe_models) -> None:
    """FSDP2 over 2 ranks trains the tiny Qwen3-MoE through HF's modeling code as the
    torch engine does (log-probs, loss, weights, clipping active), every tensor moves.
    Neither adds HF's router loss: transformers computes it only with
    ``output_router_logits`` (off in the config), and the megatron engine's default
    ``moe_aux_loss_coeff`` is 0 too, so the three engines train the same objective."""
    path = moe_models["qwen3_moe"]
    single = make_actor(path, "torch")
    batch = with_log_probs(single, make_batch())
    before = weights(single.engine)
    ref_metrics = single.update(batch)
    ref = weights(single.engine)
    ranks = spawn_ranks(_fsdp2_rank, 2, path, batch)
    old = torch.cat([r["old"] for r in ranks])
    torch.testing.assert_close(old, batch["old_log_probs"], atol=1e-5, rtol=1e-5)
    got = ranks[0]["metrics"]
    assert torch.isfinite(torch.tensor(got["actor/pg_loss"]))
    for k in ("actor/pg_loss", "actor/grad_norm"):
        assert got[k] == pytest.approx(ref_metrics[k], rel=1e-4, abs=1e-6), k
    assert ref_metrics["actor/grad_norm"] > 0.05  # clipping was active
    for k, v in ranks[0]["weights"].items():
        torch.testing.assert_close(v, ref[k], atol=1e-5, rtol=1e-4, msg=k)
    assert all(not torch.equal(before[k], ref[k]) for k in ref)


# ----------------------------------------------------------------------- checkpoints


def _checkpoint_rank(
    rank: int, world: int, path: str, b1: Any, b2: Any, ckpt: str, ep: int, mode: str
) -> dict:
    """``train``: step on b1, save, step on b2; ``load``: load, (step on b2 when the
    world has 2 ranks: the same data-parallel shards as the run that saved)."""
    actor = make_actor(path, "megatron", ep=ep, extra=ROUTER_LOSSES)
    engine = actor.engine
    if mode == "train":
        actor.update(shard(b1, engine.dp_rank, engine.dp_size))
        engine.save_checkpoint(ckpt)
    else:
        engine.load_checkpoint(ckpt)
    out = {"w1": weights(engine)}
    if world == 2:
        actor.update(shard(b2, engine.dp_rank, engine.dp_size))
        out["w2"] = weights(engine)
    return out


def test_checkpoint_saved_at_ep2_resumes_at_ep2_and_ep1(moe_models, tmp_path: Path) -> None:
    """Saved at EP = 2 after one step: loads on one rank (EP = 1) to the same weights,
    and resumes on two ranks at EP = 2 and at EP = 1 (AdamW moments and schedule with
    it) to the uninterrupted run's next step."""
    path = moe_models["qwen2_moe"]
    torch_actor = make_actor(path, "torch")
    b1, b2 = with_log_probs(torch_actor, make_batch(0)), with_log_probs(torch_actor, make_batch(1))
    ckpt = str(tmp_path / "ckpt")
    (trained, _) = spawn_ranks(_checkpoint_rank, 2, path, b1, b2, ckpt, 2, "train")
    (loaded,) = spawn_ranks(_checkpoint_rank, 1, path, b1, b2, ckpt, 1, "load")
    assert set(loaded["w1"]) == set(trained["w1"])
    for k, v in loaded["w1"].items():
        assert torch.equal(v, trained["w1"][k]), k
    for ep in (2, 1):
        (resumed, _) = spawn_ranks(_checkpoint_rank, 2, path, b1, b2, ckpt, ep, "load")
        for k, v in resumed["w2"].items():
            torch.testing.assert_close(v, trained["w2"][k], atol=1e-5, rtol=1e-4, msg=f"{ep}:{k}")
