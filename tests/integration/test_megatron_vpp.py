"""Interleaved (virtual) pipeline stages in the megatron engine (temper's chunk-major
schedule on gloo, fp32): PP = 2 × VPP = 2 over 4-layer models — rank 0 holds layers 0
and 2, rank 1 layers 1 and 3 — gives the torch engine's log-probs, loss, metrics and
updated weights (clipping active) and critic values, for a tied Llama and an untied
Qwen2; its export is the HF model (transformers loads it, same logits); its checkpoint
resumes at PP = 2 × VPP = 2, at PP = 2 and on one rank as the uninterrupted run, and a
PP = 2 checkpoint resumes with VPP = 2; a Megatron distributed checkpoint initializes
every chunk.
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
def four_layers(tmp_path_factory) -> str:
    from temper.utils.tiny import make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("megatron-vpp") / "llama4", num_layers=4))


def _qwen2(out: Path, seed: int) -> str:
    """A 4-layer Qwen2 (untied, random q/k/v biases) with the shared byte tokenizer."""
    from transformers import Qwen2Config

    from temper.utils.tiny import build_tokenizer, save_seeded, tiny_fields

    out.mkdir(parents=True, exist_ok=True)
    fields = tiny_fields(build_tokenizer(out), num_hidden_layers=4, tie_word_embeddings=False)
    return save_seeded(Qwen2Config(**fields), out, seed, drawn=("_proj.bias",))


@pytest.fixture(scope="module")
def qwen2_models(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("megatron-vpp")
    return _qwen2(root / "a", 3), _qwen2(root / "b", 4)


def _megatron(
    pp: int, vp: int | None, dist: str | None = None, extra: dict | None = None
) -> MegatronConfig:
    return MegatronConfig(
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vp,
        dist_checkpoint_path=dist,
        extra=dict(extra or {}),
    )


def make_actor(
    path: str,
    strategy: str,
    pp: int = 1,
    vp: int | None = None,
    dist: str | None = None,
    extra: dict | None = None,
) -> Actor:
    return megatron_actor(path, strategy, _megatron(pp, vp, dist, extra))


def make_critic(
    path: str, strategy: str, pp: int = 1, vp: int | None = None, dist: str | None = None
) -> Critic:
    return megatron_critic(path, strategy, _megatron(pp, vp, dist))


def _layers_of(engine: Any) -> list[list[int]]:
    """The global layer indices of each model chunk of this rank."""
    return [[int(x.layer_number) - 1 for x in c.decoder.layers] for c in engine.built.chunks]


def _step_rank(rank: int, world: int, path: str, batch: Batch, out: str, critic: bool) -> dict:
    actor = make_actor(path, "megatron", pp=2, vp=2)
    engine = actor.engine
    p = engine.parallel
    result: dict[str, Any] = {"place": (p.pp, p.vp, p.pp_rank), "layers": _layers_of(engine)}
    result["exported_before"] = weights(engine)
    result["old"] = actor.compute_log_probs(batch)["old_log_probs"]
    result["metrics"] = actor.update(batch)
    result["weights"] = weights(engine)  # a collective: both stages send theirs
    engine.save_hf(out)
    if critic:
        c = make_critic(path, "megatron", pp=2, vp=2)
        values = c.compute_values(batch)["values"]
        result["values"] = values
        result["critic"] = c.update(batch.union(Batch.from_dict({"values": values})))
    return result


@pytest.mark.parametrize("model", ["llama", "qwen2"])
def test_two_stages_of_two_chunks_equal_one(
    model: str, four_layers: str, qwen2_models: tuple[str, str], tmp_path: Path
) -> None:
    """Tied Llama (the embedding's copy on rank 1's last chunk) with the critic's value
    head there too; untied Qwen2 with biases."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    path = four_layers if model == "llama" else qwen2_models[0]
    critic = model == "llama"
    single = make_actor(path, "torch")
    hf_before = load_file(str(Path(path) / "model.safetensors"))
    batch = with_log_probs(single, make_batch())
    before = weights(single.engine)
    ref_metrics = single.update(batch)
    ref_weights = weights(single.engine)

    out = str(tmp_path / "hf")
    ranks = spawn_ranks(_step_rank, 2, path, batch, out, critic)

    # Megatron's interleaved layout: rank r holds virtual stages r and r + 2
    assert [r["place"] for r in ranks] == [(2, 2, 0), (2, 2, 1)]
    assert [r["layers"] for r in ranks] == [[[0], [2]], [[1], [3]]]
    for r in ranks:
        # the export before any step is the checkpoint's tensors, under HF names
        for name, t in hf_before.items():
            torch.testing.assert_close(r["exported_before"][name], t, atol=0, rtol=0, msg=name)
        torch.testing.assert_close(r["old"], batch["old_log_probs"], atol=1e-5, rtol=1e-5)
        assert r["metrics"].keys() == ref_metrics.keys()
        for k, v in ref_metrics.items():
            if k != "actor/packed_fraction":  # a layout choice (megatron never packs)
                assert r["metrics"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
        assert_close_weights(r["weights"], ref_weights)
    assert ref_metrics["actor/grad_norm"] > 0.05  # clipping was active
    moved = [k for k in ref_weights if not torch.equal(before[k], ranks[0]["weights"][k])]
    assert len(moved) == len(ref_weights)

    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = hf(input_ids=ids).logits
        ref = single.engine.model(input_ids=ids).logits
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)

    if not critic:
        return
    one = make_critic(path, "torch")
    values = one.compute_values(batch)["values"]
    ref_c = one.update(batch.union(Batch.from_dict({"values": values})))
    for r in ranks:
        torch.testing.assert_close(r["values"], values, atol=1e-5, rtol=1e-5)
        for k, v in ref_c.items():
            assert r["critic"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k


# ----------------------------------------------------------------------- checkpoints


def _resume_rank(
    rank: int,
    world: int,
    path: str,
    b1: Batch,
    b2: Batch,
    ckpt: str,
    layout: tuple[int, int | None],
    mode: str,
) -> dict | None:
    actor = make_actor(path, "megatron", pp=layout[0], vp=layout[1])
    engine = actor.engine
    out: dict[str, Any] = {}
    if mode == "train":
        actor.update(b1)
        engine.save_checkpoint(ckpt)
    else:
        engine.load_checkpoint(ckpt)
    out["w1"] = weights(engine)
    actor.update(b2)
    out["w2"] = weights(engine)
    out["lr"] = engine.schedule.state_dict() if engine.schedule else None
    return out if rank == world - 1 else None


def _assert_resumed(resumed: dict, trained: dict) -> None:
    assert resumed["lr"] == trained["lr"]
    for k in trained["w1"]:
        torch.testing.assert_close(resumed["w1"][k], trained["w1"][k], atol=0, rtol=0, msg=k)
        torch.testing.assert_close(resumed["w2"][k], trained["w2"][k], atol=1e-6, rtol=1e-5, msg=k)


def test_interleaved_checkpoint_resumes_at_any_pipeline_layout(
    four_layers: str, tmp_path: Path
) -> None:
    """PP=2 × VPP=2: step, save A, step → W2. Load A at PP=2 × VPP=2, at PP=2 and on one
    rank, step: each gives W2 (parameters, AdamW moments, the tied copy's, the LR
    schedule). A PP=2 checkpoint B loads at PP=2 × VPP=2 and continues as PP=2 does."""
    single = make_actor(four_layers, "torch")
    b1 = with_log_probs(single, make_batch(seed=1))
    b2 = with_log_probs(single, make_batch(seed=2))
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    interleaved, plain = (2, 2), (2, None)
    (_, trained) = spawn_ranks(_resume_rank, 2, four_layers, b1, b2, a, interleaved, "train")
    (_, again) = spawn_ranks(_resume_rank, 2, four_layers, b1, b2, a, interleaved, "load")
    (_, two) = spawn_ranks(_resume_rank, 2, four_layers, b1, b2, a, plain, "load")
    (one,) = spawn_ranks(_resume_rank, 1, four_layers, b1, b2, a, (1, None), "load")
    for resumed in (again, two, one):
        _assert_resumed(resumed, trained)
    embed = "model.embed_tokens.weight"
    assert not torch.equal(trained["w1"][embed], trained["w2"][embed])

    (_, trained_pp) = spawn_ranks(_resume_rank, 2, four_layers, b1, b2, b, plain, "train")
    (_, into_vpp) = spawn_ranks(_resume_rank, 2, four_layers, b1, b2, b, interleaved, "load")
    _assert_resumed(into_vpp, trained_pp)


# ----------------------------------------------------------------------- dist-checkpoint init


def _dist_log_probs_rank(rank: int, world: int, path: str, dist: str, batch: Batch) -> Any:
    actor = make_actor(path, "megatron", pp=2, vp=2, dist=dist)
    return actor.compute_log_probs(batch)["old_log_probs"]


def test_a_dist_checkpoint_initializes_every_chunk(
    qwen2_models: tuple[str, str], tmp_path: Path
) -> None:
    """A Megatron distributed checkpoint written on one rank starts a PP=2 × VPP=2 actor
    (the chunks of both ranks read their layers by global index, in one load): its
    log-probs are those of the checkpoint's model, not of ``model.path`` (architecture
    only)."""
    from test_megatron_dist_init import _save_rank

    source, other = qwen2_models
    dist = tmp_path / "mcore"
    dist.mkdir()  # dist_checkpointing.save writes into an existing directory
    spawn_ranks(_save_rank, 1, source, str(dist))
    batch = make_batch()
    want = make_actor(source, "torch").compute_log_probs(batch)["old_log_probs"]
    unwanted = make_actor(other, "torch").compute_log_probs(batch)["old_log_probs"]
    assert not torch.allclose(want, unwanted, atol=1e-3)
    for got in spawn_ranks(_dist_log_probs_rank, 2, other, str(dist), batch):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------- data parallel, MoE


def _grid_rank(rank: int, world: int, path: str, batch: Batch, ckpt: str) -> dict:
    actor = make_actor(path, "megatron", pp=2, vp=2)
    engine = actor.engine
    p = engine.parallel
    assert (p.pp, p.vp, p.dp, p.pp_rank) == (2, 2, 2, rank // 2)
    mine = shard(batch, engine.dp_rank, engine.dp_size)
    old = actor.compute_log_probs(mine)["old_log_probs"]
    metrics = actor.update(mine)
    engine.save_checkpoint(ckpt)
    return {"old": old, "dp": engine.dp_rank, "metrics": metrics, "weights": weights(engine)}


def test_interleaved_pipelines_with_data_parallel_equal_one_rank(
    four_layers: str, tmp_path: Path
) -> None:
    """4 ranks: two pipelines (PP=2 × VPP=2, each with its own rank-1-to-rank-0 channel)
    on half the batch each give the one-rank update of the whole batch."""
    single = make_actor(four_layers, "torch")
    batch = with_log_probs(single, make_batch())
    ref_metrics = single.update(batch)
    ref_weights = weights(single.engine)
    ranks = spawn_ranks(_grid_rank, 4, four_layers, batch, str(tmp_path / "ckpt"))
    olds = [next(r["old"] for r in ranks if r["dp"] == d) for d in range(2)]
    torch.testing.assert_close(torch.cat(olds), batch["old_log_probs"], atol=1e-5, rtol=1e-5)
    for r in ranks:
        for k, v in ref_metrics.items():
            if k != "actor/packed_fraction":
                assert r["metrics"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
        assert_close_weights(r["weights"], ref_weights)


ROUTER_LOSSES = {"moe_aux_loss_coeff": 0.01, "moe_z_loss_coeff": 0.001}


@pytest.fixture(scope="module")
def moe_four_layers(tmp_path_factory) -> str:
    """A 4-layer Qwen3-MoE (layer 0 dense, 1-3 MoE): the tiny MoE model's config with
    more layers."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from temper.utils.tiny import build_tokenizer, make_tiny_moe_model

    root = tmp_path_factory.mktemp("megatron-vpp-moe")
    config = AutoConfig.from_pretrained(make_tiny_moe_model(root / "two", "qwen3_moe"))
    config.num_hidden_layers = 4
    out = root / "four"
    out.mkdir()
    build_tokenizer(out)
    with torch.random.fork_rng():
        torch.manual_seed(5)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("gate.weight"):  # tokens spread unevenly over the experts
                    p.normal_(0.0, 0.5)
    model.save_pretrained(str(out))
    return str(out)


def _moe_rank(rank: int, world: int, path: str, batch: Batch, pp: int, vp: int | None) -> dict:
    actor = make_actor(path, "megatron", pp=pp, vp=vp, extra=ROUTER_LOSSES)
    old = actor.compute_log_probs(batch)["old_log_probs"]
    metrics = actor.update(batch)
    return {"old": old, "metrics": metrics, "weights": weights(actor.engine)}


def test_interleaved_moe_with_router_losses_equals_one_stage(moe_four_layers: str) -> None:
    """A Qwen3-MoE at PP=2 × VPP=2 (each rank's two chunks hold MoE layers) with router
    losses equals the one-rank engine: every chunk's backward of a micro-batch takes its
    router-loss weight, and the routers' token counts add up per micro-batch."""
    batch = with_log_probs(make_actor(moe_four_layers, "torch"), make_batch())
    (ref,) = spawn_ranks(_moe_rank, 1, moe_four_layers, batch, 1, None)
    ranks = spawn_ranks(_moe_rank, 2, moe_four_layers, batch, 2, 2)
    assert 1.0 < ref["metrics"]["actor/moe_load_imbalance"] <= 2.0  # 4 experts, top-2
    for r in ranks:
        torch.testing.assert_close(r["old"], ref["old"], atol=1e-6, rtol=1e-6)
        for k in ("actor/pg_loss", "actor/grad_norm", "actor/moe_load_imbalance"):
            assert r["metrics"][k] == pytest.approx(ref["metrics"][k], rel=1e-5, abs=1e-7), k
        assert_close_weights(r["weights"], ref["weights"])
