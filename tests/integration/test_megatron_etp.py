"""Megatron MoE with an expert tensor-parallel size other than TP
(``expert_tensor_parallel_size``), chiefly ETP = 1 under TP = 2: every TP rank holds
whole experts and runs its own share of the positions (sequence parallelism) through
them; the experts' gradients are summed over the expert-data-parallel group, which
holds the TP ranks. Against the torch engine (log-probs, losses, grad norm, updated
weights), with EP = 2 on the same two ranks (the TP pair is then the EP group and the
dispatcher exchanges tokens over it), and a checkpoint saved at TP2 × ETP1 that loads
at TP = 1 and at TP2 × ETP2 and resumes.
"""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("megatron.core")

import megatron.core.models.gpt.gpt_model  # noqa: F401  (imported once, before the forks)
from test_megatron import (  # same folder
    make_batch,
    megatron_actor,
    weights,
    with_log_probs,
)

import temper.training.megatron_engine  # noqa: F401
from temper.cluster.process_group import spawn_ranks
from temper.config.schema import MegatronConfig
from temper.data.batch import Batch
from temper.roles.actor import Actor

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory) -> dict[str, str]:
    from temper.utils.tiny import make_tiny_moe_model

    root = tmp_path_factory.mktemp("megatron-etp")
    return {t: make_tiny_moe_model(root / t, t) for t in ("qwen2_moe", "qwen3_moe", "mixtral")}


def make_actor(
    path: str,
    strategy: str,
    tp: int = 1,
    etp: int | None = None,
    ep: int = 1,
    pp: int = 1,
    extra: dict | None = None,
) -> Actor:
    megatron = MegatronConfig(
        tensor_model_parallel_size=tp,
        expert_tensor_parallel_size=etp,
        expert_model_parallel_size=ep,
        pipeline_model_parallel_size=pp,
        extra=dict(extra or {}),
    )
    return megatron_actor(path, strategy, megatron)


def _step_rank(
    rank: int, world: int, path: str, batch: Batch, tp: int, etp: int, ep: int, pp: int = 1
) -> dict:
    actor = make_actor(path, "megatron", tp=tp, etp=etp, ep=ep, pp=pp)
    p = actor.engine.parallel
    assert (p.tp, p.etp, p.ep, p.expert_split) == (tp, etp, ep, etp != tp or ep > 1)
    old = actor.compute_log_probs(batch)["old_log_probs"]
    metrics = actor.update(batch)
    return {"old": old, "metrics": metrics, "weights": weights(actor.engine)}


def _check(ranks: list[dict], batch: Batch, ref_metrics: dict, ref: dict) -> None:
    for r in ranks:
        torch.testing.assert_close(r["old"], batch["old_log_probs"], atol=1e-5, rtol=1e-5)
        for k in ("actor/pg_loss", "actor/grad_norm", "actor/moe_load_imbalance"):
            if k in ref_metrics:
                assert r["metrics"][k] == pytest.approx(ref_metrics[k], rel=1e-5, abs=1e-6), k
        assert set(r["weights"]) == set(ref)
        for k, v in r["weights"].items():
            torch.testing.assert_close(v, ref[k], atol=1e-5, rtol=1e-4, msg=k)


@pytest.mark.parametrize("ep", [1, 2], ids=lambda ep: f"ep{ep}")
@pytest.mark.parametrize("model", ["qwen2_moe", "qwen3_moe", "mixtral"])
def test_tp2_etp1_update_matches_torch_engine(moe_models, model: str, ep: int, tmp_path) -> None:
    """TP = 2 × ETP = 1 (× EP = 2): the torch engine's log-probs, loss, grad norm (clipping
    active) and weights after one update (the torch engine's as its HF export writes
    them: one tensor per expert)."""
    from safetensors.torch import load_file

    path = moe_models[model]
    single = make_actor(path, "torch")
    batch = with_log_probs(single, make_batch())
    ref_metrics = single.update(batch)
    assert ref_metrics["actor/grad_norm"] > 0.05  # clipping was active
    single.engine.save_hf(str(tmp_path / "torch"))
    ref = load_file(str(tmp_path / "torch" / "model.safetensors"))
    ranks = spawn_ranks(_step_rank, 2, path, batch, 2, 1, ep)
    _check(ranks, batch, ref_metrics, ref)


@pytest.mark.parametrize(("etp", "ep"), [(1, 2), (2, 1)], ids=["etp1-ep2", "etp2"])
def test_tp2_moe_over_two_pipeline_stages_matches_torch_engine(
    moe_models, tmp_path, etp: int, ep: int
) -> None:
    """TP2 × PP2 (4 ranks) with ETP1 × EP2 — the export fetches the dense weights from
    their stage and each expert from the EP rank of its stage holding it (two holders
    groups) — or with experts split over TP: the update equals the torch engine's. The
    second stage's router gets this TP rank's share of the padding mask
    (megatron_sp.stage_padding_mask)."""
    from safetensors.torch import load_file

    path = moe_models["qwen3_moe"]
    single = make_actor(path, "torch")
    batch = with_log_probs(single, make_batch())
    ref_metrics = single.update(batch)
    single.engine.save_hf(str(tmp_path / "torch"))
    ref = load_file(str(tmp_path / "torch" / "model.safetensors"))
    ranks = spawn_ranks(_step_rank, 4, path, batch, 2, etp, ep, 2)
    # log-probs are the last stage's; every rank exports the whole model
    for r in ranks:
        assert set(r["weights"]) == set(ref)
        for k, v in r["weights"].items():
            torch.testing.assert_close(v, ref[k], atol=1e-5, rtol=1e-4, msg=k)
    for k in ("actor/pg_loss", "actor/grad_norm"):
        assert ranks[-1]["metrics"][k] == pytest.approx(ref_metrics[k], rel=1e-5, abs=1e-6), k
    torch.testing.assert_close(ranks[-1]["old"], batch["old_log_probs"], atol=1e-5, rtol=1e-5)


def _dp_rank(rank: int, world: int, path: str, batch: Batch, tp: int, etp: int) -> dict:
    """One update on this data-parallel rank's share of ``batch``, with the auxiliary
    load-balancing loss."""
    actor = make_actor(path, "megatron", tp=tp, etp=etp, extra={"moe_aux_loss_coeff": 0.01})
    engine = actor.engine
    n = len(batch) // engine.dp_size
    mine = batch.slice(engine.dp_rank * n, (engine.dp_rank + 1) * n)
    old = actor.compute_log_probs(mine)["old_log_probs"]
    metrics = actor.update(mine)
    return {"old": old, "dp": engine.dp_rank, "metrics": metrics, "weights": weights(engine)}


@pytest.mark.parametrize(
    ("tp", "etp", "world"),
    [(2, 1, 4), (1, 2, 2)],
    ids=["tp2-etp1-dp2", "tp1-etp2-dp2"],
)
def test_expert_tp_other_than_tp_over_data_parallel_ranks_equals_tp1(
    moe_models, tp: int, etp: int, world: int
) -> None:
    """Two data-parallel ranks: TP2 × ETP1 (4 ranks; the expert-data-parallel group is all
    four: two TP ranks × two DP ranks) and TP1 × ETP2 (2 ranks; each expert split over
    the two DP ranks, the dispatcher gathering both ranks' tokens) give TP = 1's
    log-probs, metrics and weights, with the auxiliary loss (Megatron counts each
    router's tokens per expert over the TP group, whatever the experts' split)."""
    path = moe_models["qwen3_moe"]
    batch = with_log_probs(make_actor(path, "torch"), make_batch())
    split = spawn_ranks(_dp_rank, world, path, batch, tp, etp)
    one = spawn_ranks(_dp_rank, 2, path, batch, 1, 1)
    for a in split:
        b = next(r for r in one if r["dp"] == a["dp"])
        torch.testing.assert_close(a["old"], b["old"], atol=1e-6, rtol=1e-6)
        for k in ("actor/pg_loss", "actor/grad_norm", "actor/moe_load_imbalance"):
            assert a["metrics"][k] == pytest.approx(b["metrics"][k], rel=1e-5, abs=1e-7), k
        # atol 5e-5: an embedding entry whose gradient is of AdamW's eps (1e-8) moves by
        # lr·g/(|g|+eps), which turns fp32 summation-order noise in g (~1e-10: ETP = 1
        # sums in another order) into ~1e-5; the grad norms agree to ~1e-8
        for k, v in a["weights"].items():
            torch.testing.assert_close(v, b["weights"][k], atol=5e-5, rtol=1e-4, msg=k)


def _ckpt_rank(
    rank: int,
    world: int,
    path: str,
    b1: Batch,
    b2: Batch,
    ckpt: str,
    layout: tuple[int, int, int],
    mode: str,
) -> dict:
    """``train``: step on b1, save, step on b2; ``load``: load, then step on b2; at
    ``layout`` = (TP, ETP, EP)."""
    tp, etp, ep = layout
    actor = make_actor(path, "megatron", tp=tp, etp=etp, ep=ep)
    if mode == "train":
        actor.update(b1)
        actor.engine.save_checkpoint(ckpt)
    else:
        actor.engine.load_checkpoint(ckpt)
    out = {"w1": weights(actor.engine)}
    actor.update(b2)
    out["w2"] = weights(actor.engine)
    return out


def test_checkpoint_at_tp2_etp1_resumes_at_other_layouts(moe_models, tmp_path) -> None:
    """Saved at TP2 × ETP1 after one step (whole experts, replicated over the TP pair),
    the checkpoint loads at TP = 1, at TP2 × ETP2 (experts split) and at TP2 × ETP1 × EP2
    (half the experts on each rank) to the same weights and resumes to the uninterrupted
    run's next step (AdamW moments reshard too)."""
    path = moe_models["qwen2_moe"]
    torch_actor = make_actor(path, "torch")
    b1, b2 = with_log_probs(torch_actor, make_batch(0)), with_log_probs(torch_actor, make_batch(1))
    ckpt = str(tmp_path / "ckpt")
    (trained, _) = spawn_ranks(_ckpt_rank, 2, path, b1, b2, ckpt, (2, 1, 1), "train")
    (one,) = spawn_ranks(_ckpt_rank, 1, path, b1, b2, ckpt, (1, 1, 1), "load")
    (split, _) = spawn_ranks(_ckpt_rank, 2, path, b1, b2, ckpt, (2, 2, 1), "load")
    (ep2, _) = spawn_ranks(_ckpt_rank, 2, path, b1, b2, ckpt, (2, 1, 2), "load")
    for resumed in (one, split, ep2):
        assert set(resumed["w1"]) == set(trained["w1"])
        for k, v in resumed["w1"].items():
            assert torch.equal(v, trained["w1"][k]), k
        for k, v in resumed["w2"].items():
            torch.testing.assert_close(v, trained["w2"][k], atol=1e-5, rtol=1e-4, msg=k)
