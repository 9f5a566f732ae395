"""Pipeline parallelism in the megatron engine (temper's own schedule on gloo, 2 stages of
a 2-layer model, fp32): PP = 2 gives the one-stage result (the torch engine, which the
megatron engine matches at PP = 1, see test_megatron) — log-probs, loss and metrics,
updated weights (clipping active), critic values — for a tied Llama and an untied Qwen2
with biases; the exported directory loads in transformers with the same logits; a PP = 2
checkpoint resumes at PP = 2 and at PP = 1 as the uninterrupted run.
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
from test_megatron import (  # same folder: pytest puts it on sys.path
    _tiny,
    assert_close_weights,
    make_batch,
    megatron_actor,
    megatron_critic,
    shard,
    weights,
    with_log_probs,
)

import temper.training.megatron_engine  # noqa: F401
from temper.cluster.process_group import spawn_ranks
from temper.config.schema import MegatronConfig
from temper.data.batch import Batch
from temper.roles.actor import Actor
from temper.roles.critic import Critic

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def qwen2_path(tmp_path_factory) -> str:
    return _tiny(tmp_path_factory.mktemp("megatron-pp") / "qwen2", "qwen2")


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory) -> str:
    from temper.utils.tiny import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("megatron-pp") / "llama4", num_layers=4))


def make_actor(
    path: str, strategy: str, pp: int = 1, tp: int = 1, dist: str | None = None
) -> Actor:
    megatron = MegatronConfig(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, dist_checkpoint_path=dist
    )
    return megatron_actor(path, strategy, megatron)


def make_critic(path: str, strategy: str, pp: int = 1) -> Critic:
    return megatron_critic(path, strategy, MegatronConfig(pipeline_model_parallel_size=pp))


# ----------------------------------------------------------------------- one step


def _step_rank(rank: int, world: int, path: str, batch: Batch, out: str, critic: bool) -> dict:
    actor = make_actor(path, "megatron", pp=2)
    engine = actor.engine
    assert (engine.parallel.pp, engine.parallel.pp_rank, engine.dp_size) == (2, rank, 1)
    result: dict[str, Any] = {"old": actor.compute_log_probs(batch)["old_log_probs"]}
    result["metrics"] = actor.update(batch)
    result["weights"] = weights(engine)  # a collective: both stages send theirs
    engine.save_hf(out)
    if critic:
        c = make_critic(path, "megatron", pp=2)
        values = c.compute_values(batch)["values"]
        result["values"] = values
        result["critic"] = c.update(batch.union(Batch.from_dict({"values": values})))
    return result


@pytest.mark.parametrize("model", ["llama", "qwen2"])
def test_two_stages_equal_one(model: str, tiny_path: str, qwen2_path: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    path = tiny_path if model == "llama" else qwen2_path
    single = make_actor(path, "torch")
    batch = with_log_probs(single, make_batch())
    before = weights(single.engine)
    ref_metrics = single.update(batch)
    ref_weights = weights(single.engine)
    critic = model == "qwen2"  # the value head on the last stage, forward-only values

    out = str(tmp_path / "hf")
    ranks = spawn_ranks(_step_rank, 2, path, batch, out, critic)

    for r in ranks:  # every stage returns the one-stage log-probs, metrics and weights
        torch.testing.assert_close(r["old"], batch["old_log_probs"], atol=1e-5, rtol=1e-5)
        assert r["metrics"].keys() == ref_metrics.keys()
        for k, v in ref_metrics.items():
            if k != "actor/packed_fraction":  # a layout choice (megatron never packs)
                assert r["metrics"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
        assert_close_weights(r["weights"], ref_weights)
    assert ref_metrics["actor/grad_norm"] > 0.05  # clipping was active
    moved = [k for k in ref_weights if not torch.equal(before[k], ranks[0]["weights"][k])]
    assert len(moved) == len(ref_weights)

    # the exported directory is one HF model: transformers loads it, same logits
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = hf(input_ids=ids).logits
        ref = single.engine.model(input_ids=ids).logits
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)

    if critic:
        one = make_critic(path, "torch")
        values = one.compute_values(batch)["values"]
        ref_c = one.update(batch.union(Batch.from_dict({"values": values})))
        for r in ranks:
            torch.testing.assert_close(r["values"], values, atol=1e-5, rtol=1e-5)
            for k, v in ref_c.items():
                assert r["critic"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k


def _grid_rank(rank: int, world: int, path: str, batch: Batch, tp: int, ckpt: str) -> dict:
    actor = make_actor(path, "megatron", pp=2, tp=tp)
    engine = actor.engine
    p = engine.parallel
    assert (p.pp, p.tp, p.dp, p.pp_rank) == (2, tp, 2 // tp, rank // 2)
    mine = shard(batch, engine.dp_rank, engine.dp_size)
    scored = actor.compute_log_probs(mine, with_sum_pi_squared=True)
    old, spq = scored["old_log_probs"], scored["sum_pi_squared"]
    metrics = actor.update(mine)
    engine.save_checkpoint(ckpt)
    return {
        "old": old,
        "spq": spq,
        "dp": engine.dp_rank,
        "metrics": metrics,
        "weights": weights(engine),
    }


def _load_rank(rank: int, world: int, path: str, ckpt: str) -> dict:
    actor = make_actor(path, "megatron")
    actor.engine.load_checkpoint(ckpt)
    return weights(actor.engine)


@pytest.mark.parametrize("tp", [2, 1], ids=["tp2xpp2", "pp2xdp2"])
def test_pipeline_with_tensor_or_data_parallel_equals_one_rank(
    tiny_path: str, tp: int, tmp_path: Path
) -> None:
    """4 ranks: PP=2 × TP=2, and PP=2 × DP=2 (each pipeline on half the batch), give the
    one-rank update of the whole batch (and its Σπ², through the stages' forward-only
    outputs); their checkpoint loads on one rank."""
    single = make_actor(tiny_path, "torch")
    batch = with_log_probs(single, make_batch())
    ref_spq = single.compute_log_probs(batch, with_sum_pi_squared=True)["sum_pi_squared"]
    ref_metrics = single.update(batch)
    ref_weights = weights(single.engine)

    ckpt = str(tmp_path / "ckpt")
    ranks = spawn_ranks(_grid_rank, 4, tiny_path, batch, tp, ckpt)

    dp = 2 // tp
    olds = [next(r["old"] for r in ranks if r["dp"] == d) for d in range(dp)]
    torch.testing.assert_close(torch.cat(olds), batch["old_log_probs"], atol=1e-5, rtol=1e-5)
    spqs = [next(r["spq"] for r in ranks if r["dp"] == d) for d in range(dp)]
    torch.testing.assert_close(torch.cat(spqs), ref_spq, atol=1e-6, rtol=1e-5)
    for r in ranks:
        for k, v in ref_metrics.items():
            if k != "actor/packed_fraction":
                assert r["metrics"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
        assert_close_weights(r["weights"], ref_weights)
    (loaded,) = spawn_ranks(_load_rank, 1, tiny_path, ckpt)
    for k, v in ranks[0]["weights"].items():
        torch.testing.assert_close(loaded[k], v, atol=0, rtol=0, msg=k)


def _four_stage_rank(rank: int, world: int, path: str, batch: Batch) -> dict:
    actor = make_actor(path, "megatron", pp=4)
    assert actor.engine.parallel.pp_rank == rank
    old = actor.compute_log_probs(batch)["old_log_probs"]
    metrics = actor.update(batch)
    return {"old": old, "metrics": metrics, "weights": weights(actor.engine)}


def test_four_stages_equal_one(four_layers: str) -> None:
    """PP=4 over a 4-layer tied model: the middle stages receive and send both ways and
    hold no embedding copy."""
    single = make_actor(four_layers, "torch")
    batch = with_log_probs(single, make_batch())
    ref_metrics = single.update(batch)
    ref_weights = weights(single.engine)
    ranks = spawn_ranks(_four_stage_rank, 4, four_layers, batch)
    for r in ranks:
        torch.testing.assert_close(r["old"], batch["old_log_probs"], atol=1e-5, rtol=1e-5)
        assert r["metrics"]["actor/loss"] == pytest.approx(ref_metrics["actor/loss"], rel=1e-5)
        assert r["metrics"]["actor/grad_norm"] == pytest.approx(
            ref_metrics["actor/grad_norm"], rel=1e-5
        )
        assert_close_weights(r["weights"], ref_weights)


def _nan_rank(rank: int, world: int, path: str, batch: Batch) -> dict:
    from temper.training.base import NonFiniteError

    engine = make_actor(path, "megatron", pp=2).engine
    before = weights(engine)

    def nan_on_second(mb: Batch, out: dict[str, torch.Tensor]):
        scale = float("nan") if len(mb) and mb["advantages"][0, 0] < 0 else 1.0
        return (out["log_probs"].sum() * scale, {})

    with pytest.raises(NonFiniteError, match="not finite in micro-batch"):
        engine.train_mini_batch(batch, nan_on_second)
    after = weights(engine)
    return {"unchanged": all(torch.equal(before[k], after[k]) for k in before)}


def test_a_non_finite_loss_on_the_last_stage_stops_every_stage(tiny_path: str) -> None:
    """The last stage's NaN loss raises on both stages before any backward; no weight
    moves."""
    single = make_actor(tiny_path, "torch")
    batch = with_log_probs(single, make_batch())
    ranks = spawn_ranks(_nan_rank, 2, tiny_path, batch)
    assert all(r["unchanged"] for r in ranks)


# ----------------------------------------------------------------------- checkpoints


def _resume_rank(
    rank: int, world: int, path: str, b1: Batch, b2: Batch, ckpt: str, pp: int, mode: str
) -> dict | None:
    actor = make_actor(path, "megatron", pp=pp)
    engine = actor.engine
    out: dict[str, Any] = {}
    if mode == "train":
        actor.update(shard(b1, engine.dp_rank, engine.dp_size))
        engine.save_checkpoint(ckpt)
    else:
        engine.load_checkpoint(ckpt)
    out["w1"] = weights(engine)
    actor.update(shard(b2, engine.dp_rank, engine.dp_size))
    out["w2"] = weights(engine)
    out["lr"] = engine.schedule.state_dict() if engine.schedule else None
    return out if rank == world - 1 else None


def test_pipeline_checkpoint_resumes_at_two_and_one_stage(tiny_path: str, tmp_path: Path) -> None:
    """PP=2 (tied Llama): step, save A, step → W2. PP=2 load A, step; and PP=1 (one
    rank) load A, step: both give W2 — parameters, AdamW moments (the tied copy's too)
    and the LR schedule come back."""
    single = make_actor(tiny_path, "torch")
    b1 = with_log_probs(single, make_batch(seed=1))
    b2 = with_log_probs(single, make_batch(seed=2))
    ckpt = str(tmp_path / "a")
    (_, trained) = spawn_ranks(_resume_rank, 2, tiny_path, b1, b2, ckpt, 2, "train")
    (_, again) = spawn_ranks(_resume_rank, 2, tiny_path, b1, b2, ckpt, 2, "load")
    (one,) = spawn_ranks(_resume_rank, 1, tiny_path, b1, b2, ckpt, 1, "load")
    for resumed in (again, one):
        assert resumed["lr"] == trained["lr"]
        for k in trained["w1"]:
            torch.testing.assert_close(resumed["w1"][k], trained["w1"][k], atol=0, rtol=0, msg=k)
            w2, ref = resumed["w2"][k], trained["w2"][k]
            torch.testing.assert_close(w2, ref, atol=1e-6, rtol=1e-5, msg=k)
    embed = "model.embed_tokens.weight"
    assert not torch.equal(trained["w1"][embed], trained["w2"][embed])


# ------------------------------------------------------- a teacher over two stages


def _top_rank(rank: int, world: int, path: str, batch: Batch) -> dict:
    engine = make_actor(path, "megatron", pp=2).engine
    return {
        f"{k}-{log_probs}": engine.top_logits(batch, k, 2.0, vocab=200, log_probs=log_probs)
        for k in (3, 0)
        for log_probs in (False, True)
    }


def test_a_teacher_over_two_stages_gives_the_top_logits_of_one(tiny_path: str) -> None:
    """Offline / on-policy distillation's teacher at PP = 2 (ROLL's distill_megatron): the
    last stage's top-k logits (and k = 0: every column; log-probs) reach every stage, equal
    to the one-process engine's."""
    single = make_actor(tiny_path, "torch").engine
    batch = make_batch()
    ranks = spawn_ranks(_top_rank, 2, tiny_path, batch)
    for k in (3, 0):
        for log_probs in (False, True):
            values, ids = single.top_logits(batch, k, 2.0, vocab=200, log_probs=log_probs)
            for r in ranks:
                got_values, got_ids = r[f"{k}-{log_probs}"]
                assert got_ids.dtype == torch.long
                width = values.shape[-1]  # k; or the 200 real ids, megatron's padded past
                assert width == (3 if k else 200)
                mask = batch["response_mask"].bool()
                assert torch.isneginf(got_values[mask][..., width:]).all()
                got_values, got_ids = got_values[..., :width], got_ids[..., :width]
                assert torch.equal(got_ids[mask], ids[mask])
                finite = torch.isfinite(values[mask])
                torch.testing.assert_close(
                    got_values[mask][finite], values[mask][finite], atol=1e-5, rtol=1e-5
                )
