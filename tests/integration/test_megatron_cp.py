"""Megatron context parallelism (``megatron.context_parallel_size``) against the torch
engine (which the megatron engine equals at CP = 1, see test_megatron): each CP rank
runs its two chunks of every sequence, attention gathers keys and values over the CP
group, outputs are gathered back before the loss. The test batch's rows are 13 tokens
long (odd), so the engine pads them to 16 (a multiple of 2·CP = 4, of 8 at CP = 4 or
with TP = 2 under sequence parallelism).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

import megatron.core.models.gpt.gpt_model  # noqa: F401  (imported once, before the forks)
from test_megatron import (  # same folder: pytest puts it on sys.path
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
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytestmark = pytest.mark.slow


def _megatron(cp: int, tp: int = 1, sp: bool = False) -> MegatronConfig:
    return MegatronConfig(
        context_parallel_size=cp, tensor_model_parallel_size=tp, sequence_parallel=sp
    )


def make_actor(path: str, strategy: str, cp: int = 1, tp: int = 1, sp: bool = False) -> Actor:
    return megatron_actor(path, strategy, _megatron(cp, tp, sp) if strategy == "megatron" else None)


def _step_rank(
    rank: int, world: int, path: str, batch: Batch, tp: int, sp: bool, cp: int = 2
) -> dict:
    actor = make_actor(path, "megatron", cp=cp, tp=tp, sp=sp)
    engine = actor.engine
    assert (engine.parallel.cp, engine.dp_size) == (cp, world // (cp * tp))
    mine = batch.slice(0, len(batch))
    out = engine.forward(mine, with_entropy=True, temperature=0.7, with_sum_pi_squared=True)
    result: dict[str, Any] = {"forward": out, "old": actor.compute_log_probs(mine)}
    result["metrics"] = actor.update(mine)
    result["weights"] = weights(engine)  # a collective: every rank gathers
    result["cp_rank"] = engine.parallel.cp_rank
    return result


def _check_ranks(ranks: list[dict], single: Actor, batch: Batch, cp: int) -> None:
    ref_forward = single.engine.forward(
        batch, with_entropy=True, temperature=0.7, with_sum_pi_squared=True
    )
    ref_metrics = single.update(batch)
    ref_weights = weights(single.engine)
    # each CP rank once per TP rank
    assert sorted(r["cp_rank"] for r in ranks) == sorted(list(range(cp)) * (len(ranks) // cp))
    for r in ranks:  # every CP rank returns whole sequences
        for k in ("log_probs", "entropy", "sum_pi_squared"):
            torch.testing.assert_close(r["forward"][k], ref_forward[k], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            r["old"]["old_log_probs"], batch["old_log_probs"], atol=1e-5, rtol=1e-5
        )
        for k, v in ref_metrics.items():
            if k == "actor/packed_fraction":  # a layout choice (megatron never packs)
                continue
            assert r["metrics"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    assert ref_metrics["actor/grad_norm"] > 0.05  # clipping was active
    assert_close_weights(ranks[0]["weights"], ref_weights)


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_log_probs_and_update_match_torch_engine(tiny_path: str, cp: int) -> None:
    """CP = 2 on two ranks, CP = 4 on four (Llama: GQA, tied embeddings, llama3 RoPE):
    log-probs, entropy, Σπ², one update's metrics and weights equal the one-process
    engine's, every CP rank returning them whole."""
    batch = make_batch()
    width = int((batch["prompt_mask"].sum(1) + batch["response_mask"].sum(1)).max())
    assert width % (2 * cp)  # the engine pads it
    single = make_actor(tiny_path, "torch")
    batch = with_log_probs(single, batch)
    ranks = spawn_ranks(_step_rank, cp, tiny_path, batch, 1, False, cp)
    _check_ranks(ranks, single, batch, cp)


@pytest.fixture(scope="module")
def qwen3_path(tmp_path_factory) -> str:
    from test_megatron import _tiny

    return _tiny(tmp_path_factory.mktemp("megatron-cp") / "qwen3", "qwen3")


def test_cp2_with_tp2_and_sequence_parallel_matches_torch_engine(qwen3_path: str) -> None:
    """CP = 2 × TP = 2 on four ranks (Qwen3: q/k norms), sequence parallel: each CP
    rank's share is split again over its TP pair (rows padded to a multiple of 8)."""
    single = make_actor(qwen3_path, "torch")
    batch = with_log_probs(single, make_batch())
    ranks = spawn_ranks(_step_rank, 4, qwen3_path, batch, 2, True)
    _check_ranks(ranks, single, batch, cp=2)


def _dp_rank(rank: int, world: int, path: str, batch: Batch, ckpt: str) -> dict:
    actor = make_actor(path, "megatron", cp=2)
    engine = actor.engine
    assert engine.dp_size == 2
    n = len(batch) // 2
    mine = batch.slice(engine.dp_rank * n, (engine.dp_rank + 1) * n)
    old = actor.compute_log_probs(mine)["old_log_probs"]
    metrics = actor.update(mine)
    engine.save_checkpoint(ckpt)
    return {"dp": engine.dp_rank, "old": old, "metrics": metrics, "weights": weights(engine)}


def _resume_rank(rank: int, world: int, path: str, ckpt: str) -> dict:
    actor = make_actor(path, "megatron", cp=1)
    actor.engine.load_checkpoint(ckpt)
    return weights(actor.engine)


def test_cp2_with_dp2_sums_gradients_over_dp_and_cp(tiny_path: str, tmp_path) -> None:
    """CP = 2 × DP = 2 (four ranks, CP ranks adjacent): each DP rank's CP pair runs half
    the batch; gradients summed over the DP × CP group give the one-process update. The
    checkpoint written at CP = 2 loads at CP = 1."""
    single = make_actor(tiny_path, "torch")
    batch = with_log_probs(single, make_batch())
    ref_metrics = single.update(batch)
    ranks = spawn_ranks(_dp_rank, 4, tiny_path, batch, str(tmp_path / "ckpt"))
    assert [r["dp"] for r in ranks] == [0, 0, 1, 1]  # Megatron's tp-cp-ep-dp-pp order
    olds = [ranks[0]["old"], ranks[2]["old"]]
    torch.testing.assert_close(torch.cat(olds), batch["old_log_probs"], atol=1e-5, rtol=1e-5)
    for r in ranks:
        for k in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/entropy"):
            assert r["metrics"][k] == pytest.approx(ref_metrics[k], rel=1e-5, abs=1e-6), k
    ref_weights = weights(single.engine)
    assert_close_weights(ranks[0]["weights"], ref_weights)
    (resumed,) = spawn_ranks(_resume_rank, 1, tiny_path, str(tmp_path / "ckpt"))
    for k, v in ranks[0]["weights"].items():
        torch.testing.assert_close(resumed[k], v, atol=0, rtol=0, msg=k)


def _critic_rank(rank: int, world: int, path: str, batch: Batch) -> dict:
    critic = megatron_critic(path, "megatron", _megatron(2))
    values = critic.compute_values(batch)["values"]
    metrics = critic.update(batch.union(Batch.from_dict({"values": values})))
    return {"values": values, "metrics": metrics, "weights": weights(critic.engine)}


def test_cp2_critic_matches_torch_engine(tiny_path: str) -> None:
    single = megatron_critic(tiny_path, "torch")
    batch = make_batch()
    values = single.compute_values(batch)["values"]
    ref_metrics = single.update(batch.union(Batch.from_dict({"values": values})))
    ref = {k: v.detach().clone() for k, v in single.engine.model.state_dict().items()}
    for got in spawn_ranks(_critic_rank, 2, tiny_path, batch):
        torch.testing.assert_close(got["values"], values, atol=1e-5, rtol=1e-5)
        for k, v in ref_metrics.items():
            assert got["metrics"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    for name, tensor in got["weights"].items():
        key = name if name.startswith("value_head.") else f"backbone.{name}"
        torch.testing.assert_close(tensor, ref[key], atol=1e-5, rtol=1e-4, msg=name)


def _kd_rank(rank: int, world: int, path: str, batch: Batch) -> dict:
    from temper.algorithms.kd import KDParams
    from temper.roles.kd_loss import TEACHER_LOGITS
    from temper.training.micro_batching import KD_INDICES

    actor = make_actor(path, "megatron", cp=2)
    values, ids = actor.engine.top_logits(batch, 5, 0.5)
    work = batch.union(Batch.from_dict({KD_INDICES: ids, TEACHER_LOGITS: values}))
    metrics = actor.distill_update(work, "forward_kl", KDParams(teacher_temperature=0.5), 0.5)
    return {"values": values, "ids": ids, "metrics": metrics, "weights": weights(actor.engine)}


def test_cp2_offline_distillation_matches_torch_engine(tiny_path: str) -> None:
    """A teacher's top-k at CP = 2 (every held position, gathered) and a student's
    logits at the teacher's ids (placed at their positions, split, gathered back)."""
    from temper.algorithms.kd import KDParams
    from temper.roles.kd_loss import TEACHER_LOGITS
    from temper.training.micro_batching import KD_INDICES

    batch = make_batch(seed=5)
    single = make_actor(tiny_path, "torch")
    values, ids = single.engine.top_logits(batch, 5, 0.5)
    work = batch.union(Batch.from_dict({KD_INDICES: ids, TEACHER_LOGITS: values}))
    ref = single.distill_update(work, "forward_kl", KDParams(teacher_temperature=0.5), 0.5)
    for got in spawn_ranks(_kd_rank, 2, tiny_path, batch):
        torch.testing.assert_close(got["values"], values, atol=1e-5, rtol=1e-5)
        assert torch.equal(got["ids"], ids)
        for k in ("actor/loss", "actor/distill_loss", "actor/grad_norm"):
            assert got["metrics"][k] == pytest.approx(ref[k], rel=1e-5, abs=1e-6), k
    assert_close_weights(got["weights"], weights(single.engine))


def _pp_rank(rank: int, world: int, path: str, batch: Batch, vp: int | None) -> dict:
    m = MegatronConfig(
        context_parallel_size=2,
        pipeline_model_parallel_size=2,
        virtual_pipeline_model_parallel_size=vp,
    )
    actor = megatron_actor(path, "megatron", m)
    engine = actor.engine
    assert (engine.parallel.cp, engine.parallel.pp, engine.dp_size) == (2, 2, 1)
    old = actor.compute_log_probs(batch)["old_log_probs"]
    metrics = actor.update(batch)
    return {"old": old, "metrics": metrics, "weights": weights(engine)}


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory) -> str:
    from temper.utils.tiny import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("megatron-cp") / "llama4", num_layers=4))


@pytest.mark.parametrize("vp", [None, 2], ids=["pp2", "pp2xvpp2"])
def test_cp2_with_pipeline_stages_matches_torch_engine(four_layers: str, vp: int | None) -> None:
    """CP = 2 × PP = 2 (four ranks; with two virtual stages each, a 4-layer Llama): the
    stages send each CP rank's share of the activations; the last stage gathers the
    outputs over CP and broadcasts them to the first; the tied embedding's copies stay
    equal."""
    single = make_actor(four_layers, "torch")
    batch = with_log_probs(single, make_batch())
    ref_metrics = single.update(batch)
    ref_weights = weights(single.engine)
    for r in spawn_ranks(_pp_rank, 4, four_layers, batch, vp):
        torch.testing.assert_close(r["old"], batch["old_log_probs"], atol=1e-5, rtol=1e-5)
        for k in ("actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "actor/entropy"):
            assert r["metrics"][k] == pytest.approx(ref_metrics[k], rel=1e-5, abs=1e-6), k
    assert_close_weights(r["weights"], ref_weights)


# ----------------------------------------------------------------------- MoE


@pytest.fixture(scope="module")
def moe_path(tmp_path_factory) -> str:
    from temper.utils.tiny import make_tiny_moe_model

    return make_tiny_moe_model(tmp_path_factory.mktemp("megatron-cp-moe") / "m", "qwen3_moe")


def moe_actor(path: str, strategy: str, m: MegatronConfig | None = None) -> Actor:
    cfg = actor_config(strategy)
    cfg.megatron = m or MegatronConfig()
    spec = EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=MicroBatching(size=1),
        total_steps=4,
    )
    return Actor(cfg, build_engine(strategy, spec))


def _moe_rank(
    rank: int, world: int, path: str, batch: Batch, cp: int, tp: int, ep: int, extra: dict
) -> dict:
    m = MegatronConfig(
        context_parallel_size=cp,
        tensor_model_parallel_size=tp,
        expert_model_parallel_size=ep,
        extra=dict(extra),
    )
    actor = moe_actor(path, "megatron", m)
    engine = actor.engine
    n = len(batch) // engine.dp_size
    mine = batch.slice(engine.dp_rank * n, (engine.dp_rank + 1) * n)
    old = actor.compute_log_probs(mine)["old_log_probs"]
    metrics = actor.update(mine)
    return {"old": old, "dp": engine.dp_rank, "metrics": metrics, "weights": weights(engine)}


def test_cp2_moe_matches_torch_engine(moe_path: str, tmp_path) -> None:
    """An MoE model (Qwen3-MoE) at CP = 2: each CP rank routes its share of the tokens
    (the padding mask split like the ids)."""
    from safetensors.torch import load_file

    single = moe_actor(moe_path, "torch")
    batch = with_log_probs(single, make_batch())
    ref_metrics = single.update(batch)
    single.engine.save_hf(str(tmp_path / "torch"))  # HF names (the torch engine's are fused)
    ref = load_file(str(tmp_path / "torch" / "model.safetensors"))
    for r in spawn_ranks(_moe_rank, 2, moe_path, batch, 2, 1, 1, {}):
        torch.testing.assert_close(r["old"], batch["old_log_probs"], atol=1e-5, rtol=1e-5)
        for k in ("actor/pg_loss", "actor/grad_norm"):
            assert r["metrics"][k] == pytest.approx(ref_metrics[k], rel=1e-4, abs=1e-6), k
    assert_close_weights(r["weights"], ref)


def test_cp2_tp2_ep2_moe_with_aux_loss_equals_cp1(moe_path: str) -> None:
    """CP = 2 × TP = 2 × EP = 2 (8 ranks would be needed for DP; here 4 ranks, one DP
    rank) with the load-balancing loss equals one rank's run: Megatron's router counts
    tokens per expert over the TP × CP group, temper sums the router's gradients over
    CP with DP's, and the load imbalance counts every token once."""
    batch = with_log_probs(moe_actor(moe_path, "torch"), make_batch())
    losses = {"moe_aux_loss_coeff": 0.01}
    (one,) = spawn_ranks(_moe_rank, 1, moe_path, batch, 1, 1, 1, losses)
    for a in spawn_ranks(_moe_rank, 4, moe_path, batch, 2, 2, 2, losses):
        torch.testing.assert_close(a["old"], one["old"], atol=1e-6, rtol=1e-6)
        for k in ("actor/pg_loss", "actor/grad_norm", "actor/moe_load_imbalance"):
            assert a["metrics"][k] == pytest.approx(one["metrics"][k], rel=1e-5, abs=1e-7), k
        for k, v in a["weights"].items():
            # Adam's step on an element with a near-zero gradient amplifies summation-order
            # rounding (the embedding's): a looser atol than the dense tests, still a small
            # fraction of one step (lr 1e-3)
            torch.testing.assert_close(v, one["weights"][k], atol=3e-5, rtol=1e-4, msg=k)
