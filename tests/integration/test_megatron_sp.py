"""Megatron sequence parallelism (``megatron.sequence_parallel``) against the torch engine:
at TP=2 with sequences split over the TP ranks, a tiny Llama (tied) and Qwen3 (q/k-norm)
actor gives the torch engine's log-probs, one update's metrics and weights; a critic
its values and update; over two pipeline stages × TP=2 too. The test batch's rows are
13 tokens long, so the engine pads them to 14 for the split.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

import megatron.core.models.gpt.gpt_model  # noqa: F401  (imported once, before the forks)
from test_megatron import (  # same folder: pytest puts it on sys.path
    _tiny,
    actor_config,
    assert_close_weights,
    make_batch,
    megatron_actor,
    megatron_critic,
    weights,
    with_log_probs,
)

import temper.training.megatron_engine  # noqa: F401
from temper.cluster.process_group import spawn_ranks
from temper.config.schema import MegatronConfig, ModelConfig
from temper.data.batch import Batch
from temper.roles.actor import Actor
from temper.roles.critic import Critic
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def qwen3_path(tmp_path_factory) -> str:
    return _tiny(tmp_path_factory.mktemp("megatron-sp") / "qwen3", "qwen3")


def _megatron(tp: int, pp: int = 1, sp: bool = True) -> MegatronConfig:
    return MegatronConfig(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, sequence_parallel=sp
    )


def make_actor(path: str, strategy: str, tp: int = 1, pp: int = 1, sp: bool = True) -> Actor:
    return megatron_actor(path, strategy, _megatron(tp, pp, sp))


def make_critic(path: str, strategy: str, tp: int = 1) -> Critic:
    return megatron_critic(path, strategy, _megatron(tp))


def _step_rank(rank: int, world: int, path: str, batch: Batch, pp: int, sp: bool) -> dict:
    actor = make_actor(path, "megatron", tp=2, pp=pp, sp=sp)
    engine = actor.engine
    assert engine.built.sequence_parallel == sp
    # with it, every norm on this rank is tagged for the TP sum of its gradient
    norms = [p for n, p in engine.model.named_parameters() if "layernorm" in n]
    assert norms and all(getattr(p, "sequence_parallel", False) == sp for p in norms)
    result: dict[str, Any] = {"old": actor.compute_log_probs(batch)["old_log_probs"]}
    result["metrics"] = actor.update(batch)
    result["weights"] = weights(engine)  # a collective: every rank gathers
    return result if rank == 0 else {}


def _check_step(got: dict, batch: Batch, ref_metrics: dict, ref_weights: dict) -> None:
    torch.testing.assert_close(got["old"], batch["old_log_probs"], atol=1e-5, rtol=1e-5)
    assert got["metrics"].keys() == ref_metrics.keys()
    for k, v in ref_metrics.items():
        if k == "actor/packed_fraction":  # a layout choice (megatron never packs)
            continue
        assert got["metrics"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    assert ref_metrics["actor/grad_norm"] > 0.05  # clipping was active
    assert_close_weights(got["weights"], ref_weights)


@pytest.mark.parametrize(
    ("model", "sp"), [("llama", True), ("qwen3", True), ("qwen3", False)], ids=str
)
def test_tp2_sequence_parallel_update_matches_torch_engine(
    model: str, sp: bool, tiny_path: str, qwen3_path: str
) -> None:
    """Norm gradients summed over TP, padding to an even split. q/k-norm gradients are
    summed over TP with or without sequence parallelism (each rank normalizes its own
    heads with the shared weight)."""
    path = tiny_path if model == "llama" else qwen3_path
    single = make_actor(path, "torch")
    batch = with_log_probs(single, make_batch())
    ref_metrics = single.update(batch)
    (got, _) = spawn_ranks(_step_rank, 2, path, batch, 1, sp)
    _check_step(got, batch, ref_metrics, weights(single.engine))


def test_pipeline_and_sequence_parallel_update_matches_torch_engine(tiny_path: str) -> None:
    """PP=2 × TP=2: the stages send sequence-split activations."""
    single = make_actor(tiny_path, "torch")
    batch = with_log_probs(single, make_batch())
    ref_metrics = single.update(batch)
    ranks = spawn_ranks(_step_rank, 4, tiny_path, batch, 2, True)
    _check_step(ranks[0], batch, ref_metrics, weights(single.engine))


def _critic_rank(rank: int, world: int, path: str, batch: Batch) -> dict:
    critic = make_critic(path, "megatron", tp=2)
    values = critic.compute_values(batch)["values"]
    metrics = critic.update(batch.union(Batch.from_dict({"values": values})))
    named = weights(critic.engine)
    return {"values": values, "metrics": metrics, "weights": named} if rank == 0 else {}


def test_tp2_sequence_parallel_critic_matches_torch_engine(tiny_path: str) -> None:
    """The value head gathers the split sequence itself."""
    single = make_critic(tiny_path, "torch")
    batch = make_batch()
    values = single.compute_values(batch)["values"]
    ref_metrics = single.update(batch.union(Batch.from_dict({"values": values})))
    ref = {k: v.detach().clone() for k, v in single.engine.model.state_dict().items()}
    (got, _) = spawn_ranks(_critic_rank, 2, tiny_path, batch)
    torch.testing.assert_close(got["values"], values, atol=1e-5, rtol=1e-5)
    for k, v in ref_metrics.items():
        assert got["metrics"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    for name, tensor in got["weights"].items():
        key = name if name.startswith("value_head.") else f"backbone.{name}"
        torch.testing.assert_close(tensor, ref[key], atol=1e-5, rtol=1e-4, msg=name)


# ----------------------------------------------------------------------- MoE at TP = 2


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory) -> dict[str, str]:
    from temper.utils.tiny import make_tiny_moe_model

    root = tmp_path_factory.mktemp("megatron-sp-moe")
    return {t: make_tiny_moe_model(root / t, t) for t in ("qwen2_moe", "qwen3_moe", "mixtral")}


def make_moe_actor(
    path: str, strategy: str, tp: int = 1, ep: int = 1, extra: dict | None = None
) -> Actor:
    cfg = actor_config(strategy)
    cfg.megatron = MegatronConfig(
        tensor_model_parallel_size=tp, expert_model_parallel_size=ep, extra=dict(extra or {})
    )
    spec = EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=MicroBatching(size=1),
        total_steps=4,
    )
    return Actor(cfg, build_engine(strategy, spec))


def _moe_rank(
    rank: int, world: int, path: str, batch: Batch, tp: int, ep: int, extra: dict
) -> dict:
    actor = make_moe_actor(path, "megatron", tp=tp, ep=ep, extra=extra)
    engine = actor.engine
    assert engine.built.sequence_parallel == (tp > 1)  # required by an MoE model at TP > 1
    n = len(batch) // engine.dp_size
    mine = batch.slice(engine.dp_rank * n, (engine.dp_rank + 1) * n)
    old = actor.compute_log_probs(mine)["old_log_probs"]
    metrics = actor.update(mine)
    full = weights(engine)
    return {"old": old, "dp": engine.dp_rank, "metrics": metrics, "weights": full}


@pytest.mark.parametrize("model", ["qwen2_moe", "qwen3_moe", "mixtral"])
def test_moe_at_tp2_matches_torch_engine(moe_models, model: str, tmp_path) -> None:
    from safetensors.torch import load_file

    path = moe_models[model]
    single = make_moe_actor(path, "torch")
    batch = with_log_probs(single, make_batch())
    ref_metrics = single.update(batch)
    single.engine.save_hf(str(tmp_path / "torch"))
    ref = load_file(str(tmp_path / "torch" / "model.safetensors"))
    ranks = spawn_ranks(_moe_rank, 2, path, batch, 2, 1, {})
    for r in ranks:
        torch.testing.assert_close(r["old"], batch["old_log_probs"], atol=1e-5, rtol=1e-5)
        for k in ("actor/pg_loss", "actor/grad_norm"):
            assert r["metrics"][k] == pytest.approx(ref_metrics[k], rel=1e-4, abs=1e-6), k
        assert set(r["weights"]) == set(ref)
        for k, v in r["weights"].items():
            torch.testing.assert_close(v, ref[k], atol=1e-5, rtol=1e-4, msg=k)


def test_moe_at_tp2_ep2_equals_tp1_with_aux_loss(moe_models) -> None:
    """TP = 2 × EP = 2 (4 ranks, 2 data-parallel) with the auxiliary load-balancing loss
    gives TP = 1's log-probs, metrics (load imbalance too) and weights over 2
    data-parallel ranks: the router sees each TP rank's share of the tokens, Megatron
    counts tokens per expert over the TP group. (Not the z-loss: Megatron averages it
    over each TP rank's share, see megatron_check.)"""
    path = moe_models["qwen3_moe"]
    batch = with_log_probs(make_moe_actor(path, "torch"), make_batch())
    losses = {"moe_aux_loss_coeff": 0.01}
    split = spawn_ranks(_moe_rank, 4, path, batch, 2, 2, losses)
    one = spawn_ranks(_moe_rank, 2, path, batch, 1, 1, losses)
    for a in split:
        b = next(r for r in one if r["dp"] == a["dp"])
        torch.testing.assert_close(a["old"], b["old"], atol=1e-6, rtol=1e-6)
        for k in ("actor/pg_loss", "actor/grad_norm", "actor/moe_load_imbalance"):
            assert a["metrics"][k] == pytest.approx(b["metrics"][k], rel=1e-5, abs=1e-7), k
        for k, v in a["weights"].items():
            torch.testing.assert_close(v, b["weights"][k], atol=1e-5, rtol=1e-4, msg=k)


def _moe_checkpoint_rank(
    rank: int, world: int, path: str, b1: Batch, b2: Batch, ckpt: str, tp: int, mode: str
) -> dict:
    """``train``: step on b1, save, step on b2; ``load``: load (and step on b2 at TP=2)."""
    actor = make_moe_actor(path, "megatron", tp=tp)
    engine = actor.engine
    if mode == "train":
        actor.update(b1)
        engine.save_checkpoint(ckpt)
    else:
        engine.load_checkpoint(ckpt)
    out = {"w1": weights(engine)}
    if tp == 2:
        actor.update(b2)
        out["w2"] = weights(engine)
    return out


def test_moe_checkpoint_saved_at_tp2_loads_at_tp1_and_resumes_at_tp2(moe_models, tmp_path) -> None:
    """Each expert's TP shards reshard like the dense weights': saved at TP = 2 after one
    step, the checkpoint loads on one rank to the same weights and resumes at TP = 2 to
    the uninterrupted run's next step."""
    path = moe_models["qwen2_moe"]
    torch_actor = make_moe_actor(path, "torch")
    b1, b2 = with_log_probs(torch_actor, make_batch(0)), with_log_probs(torch_actor, make_batch(1))
    ckpt = str(tmp_path / "ckpt")
    (trained, _) = spawn_ranks(_moe_checkpoint_rank, 2, path, b1, b2, ckpt, 2, "train")
    (loaded,) = spawn_ranks(_moe_checkpoint_rank, 1, path, b1, b2, ckpt, 1, "load")
    assert set(loaded["w1"]) == set(trained["w1"])
    for k, v in loaded["w1"].items():
        assert torch.equal(v, trained["w1"][k]), k
    (resumed, _) = spawn_ranks(_moe_checkpoint_rank, 2, path, b1, b2, ckpt, 2, "load")
    for k, v in resumed["w2"].items():
        torch.testing.assert_close(v, trained["w2"][k], atol=1e-5, rtol=1e-4, msg=k)
