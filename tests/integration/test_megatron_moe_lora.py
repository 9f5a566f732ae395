"""LoRA on mixture-of-experts models on the megatron engine (gloo, fp32, CPU): tiny
Qwen3-MoE (an MLP-only first layer), Qwen2-MoE (a shared expert) and Mixtral, over two
ranks at EP = 1 (DP = 2) and EP = 2 (each rank two of the four experts and their
adapters):

* at init (B = 0) the log-probs are the base model's (Hugging Face's, on the torch
  engine), and equal to the adapters-off forward;
* with random adapters (every expert's own pair, the shared expert's, attention's) a
  step moves the adapters only, every one of them;
* the merged export loaded in transformers, and the peft adapter directory (HF expert
  names ``mlp.experts.N.gate_proj`` …) loaded by peft onto the base model, give the
  megatron engine's log-probs after the step;
* EP = 2 gives EP = 1's log-probs, metrics, adapters and merged weights;
* a checkpoint resumes exactly at its EP size, and to rounding at the other.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

import megatron.core.models.gpt.gpt_model  # noqa: F401  (imported once, before the forks)
from test_megatron import actor_config, make_batch, shard, weights, with_log_probs

import temper.training.megatron_engine  # noqa: F401
from temper.cluster.process_group import spawn_ranks
from temper.config.schema import LoraConfig, MegatronConfig, ModelConfig
from temper.data.batch import Batch
from temper.roles.actor import Actor
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec
from temper.utils.tiny import make_tiny_moe_model

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytestmark = pytest.mark.slow

LORA = LoraConfig(
    rank=4, alpha=8, target_modules=["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
)


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("megatron-moe-lora")
    out = {t: make_tiny_moe_model(root / t, t) for t in ("qwen3_moe", "qwen2_moe", "mixtral")}
    out["qwen3_moe_experts_only"] = make_tiny_moe_model(
        root / "experts_only", "qwen3_moe", dense_first=False
    )
    return out


def lora_actor(
    path: str, strategy: str, megatron: MegatronConfig, lora: LoraConfig = LORA
) -> Actor:
    cfg = actor_config(strategy)
    cfg.megatron = megatron
    spec = EngineSpec(
        model=ModelConfig(path=path, lora=lora),
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=MicroBatching(size=1),
        total_steps=4,
    )
    return Actor(cfg, build_engine(strategy, spec))


def random_adapters(engine: Any) -> None:
    """Every adapter tensor set from a generator keyed by its peft name (so the same
    whole tensors at any EP / TP layout), each rank taking its shard."""
    params = dict(engine.model.named_parameters())
    full = {}
    for r in engine.lora.rows:
        shape = list(params[r.name].shape)
        if r.kind != "rep":
            shape[0 if r.kind == "col" else 1] *= r.tp
        gen = torch.Generator().manual_seed(zlib.crc32(r.peft.encode()))
        full[r.peft] = torch.randn(shape, generator=gen) * 0.2
    engine.lora.load_peft(full)


#: models whose adapter peft cannot place whole on transformers 5: its conversion of
#: per-expert adapters (``experts.N.gate_proj`` → the fused ``experts.gate_up_proj``) takes
#: every target named gate_proj / up_proj / down_proj for an expert, so the adapters of a
#: dense MLP layer (Qwen3-MoE's ``mlp_only_layers``) or of Qwen2-MoE's shared expert are
#: left out when peft loads the directory (the merged export holds them)
PEFT_DROPS = ("qwen3_moe", "qwen2_moe")


def _step_rank(rank: int, world: int, path: str, batch: Batch, m: MegatronConfig, out: str) -> dict:
    actor = lora_actor(path, "megatron", m)
    engine: Any = actor.engine
    mine = shard(batch, engine.dp_rank, engine.dp_size)
    init = actor.compute_log_probs(mine)["old_log_probs"]
    with engine.adapters_disabled():
        base = actor.compute_log_probs(mine)["old_log_probs"]
    random_adapters(engine)
    lora = actor.compute_log_probs(mine)["old_log_probs"]
    with engine.adapters_disabled():  # the reference policy: the base model
        off = actor.compute_log_probs(mine)["old_log_probs"]
    frozen = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    trainable = {n for n, p in engine.model.named_parameters() if p.requires_grad}
    metrics = actor.update(mine)
    moved = {n for n, p in engine.model.named_parameters() if not torch.equal(p, frozen[n])}
    after = actor.compute_log_probs(mine)["old_log_probs"]
    merged = weights(engine)
    peft = dict(engine.checkpointer.peft_named_weights())
    engine.save_checkpoint(f"{out}/ckpt")
    engine.save_hf(f"{out}/hf")
    actor.update(mine)
    peft2 = dict(engine.checkpointer.peft_named_weights())
    return {
        "dp": engine.dp_rank,
        "init": init,
        "base": base,
        "lora": lora,
        "off": off,
        "after": after,
        "metrics": metrics,
        "trainable": trainable,
        "moved": moved,
        "merged": merged,
        "peft": peft,
        "peft2": peft2,
        "targets": engine.lora.hf_targets(),
    }


def _resume_rank(rank: int, world: int, path: str, batch: Batch, ep: int, out: str) -> dict:
    actor = lora_actor(path, "megatron", MegatronConfig(expert_model_parallel_size=ep))
    engine: Any = actor.engine
    engine.load_checkpoint(f"{out}/ckpt")
    actor.update(shard(batch, engine.dp_rank, engine.dp_size))
    return dict(engine.checkpointer.peft_named_weights())


def EP(ep: int) -> MegatronConfig:
    return MegatronConfig(expert_model_parallel_size=ep)


def _gather(ranks: list[dict], key: str) -> torch.Tensor:
    return torch.cat([r[key] for r in sorted(ranks, key=lambda r: r["dp"])])


def _hf_log_probs(path: str, batch: Batch, lora: LoraConfig | None = None) -> torch.Tensor:
    """Log-probs of the HF model at ``path`` on the torch engine (with ``lora``: peft's
    adapter directory ``lora.adapter_path`` loaded onto it)."""
    cfg = actor_config("torch")
    spec = EngineSpec(
        model=ModelConfig(path=path, lora=lora or LoraConfig()),
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=MicroBatching(size=1),
        total_steps=4,
    )
    actor = Actor(cfg, build_engine("torch", spec))
    return actor.compute_log_probs(batch)["old_log_probs"]


@pytest.mark.parametrize("model", ["qwen3_moe", "qwen3_moe_experts_only", "qwen2_moe", "mixtral"])
def test_moe_lora_trains_exports_and_resumes(moe_models, tmp_path: Path, model: str) -> None:
    import json

    path = moe_models[model]
    base = make_actor_batch(path)
    ep2 = spawn_ranks(_step_rank, 2, path, base, EP(2), str(tmp_path / "ep2"))
    ep1 = spawn_ranks(_step_rank, 2, path, base, EP(1), str(tmp_path / "ep1"))
    for run in (ep1, ep2):
        # B = 0: the base model's log-probs (HF's), and the adapters-off forward's
        torch.testing.assert_close(
            _gather(run, "init"), base["old_log_probs"], atol=1e-5, rtol=1e-5
        )
        assert torch.equal(_gather(run, "init"), _gather(run, "base"))
        assert not torch.allclose(_gather(run, "lora"), _gather(run, "init"), atol=1e-3)
        assert torch.equal(_gather(run, "off"), _gather(run, "init"))  # adapters off: the base
        for r in run:
            assert r["trainable"] and all(".lora." in n for n in r["trainable"])
            assert r["moved"] == r["trainable"]
            assert any(".local_experts." in n for n in r["trainable"])
    # each expert's own adapters, named by HF's expert modules (global index)
    peft = ep2[0]["peft"]
    expert = "block_sparse_moe.experts" if model == "mixtral" else "mlp.experts"
    up = "w3" if model == "mixtral" else "up_proj"
    layer = 0 if model == "qwen3_moe_experts_only" else 1
    for e in range(4):
        assert f"base_model.model.model.layers.{layer}.{expert}.{e}.{up}.lora_A.weight" in peft
    if model == "qwen2_moe":
        assert "base_model.model.model.layers.1.mlp.shared_expert.down_proj.lora_B.weight" in peft
    assert not any("gate.lora" in k or "router" in k for k in peft)  # the router: not adapted
    # EP = 2 equals EP = 1
    torch.testing.assert_close(_gather(ep2, "lora"), _gather(ep1, "lora"), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(_gather(ep2, "after"), _gather(ep1, "after"), atol=1e-6, rtol=1e-6)
    # the weights after one AdamW step (lr 1e-3): m/sqrt(v) turns the fp32 reduction-order
    # difference of a near-zero gradient entry into a visible one (2e-6 on some CPUs, 0.2%
    # of a step), so they compare to 1% of a step; the log-probs above to 1e-6
    for a, b in zip(ep2, ep1):
        for k in ("actor/pg_loss", "actor/grad_norm"):
            assert a["metrics"][k] == pytest.approx(b["metrics"][k], rel=1e-5, abs=1e-7), k
        assert a["peft"].keys() == b["peft"].keys()
        for k, v in a["peft"].items():
            torch.testing.assert_close(v, b["peft"][k], atol=1e-5, rtol=1e-5, msg=k)
        assert a["merged"].keys() == b["merged"].keys()
        for k, v in a["merged"].items():
            torch.testing.assert_close(v, b["merged"][k], atol=1e-5, rtol=1e-5, msg=k)
    # the merged HF export, and peft's adapter directory on the base model, give the
    # megatron engine's log-probs after the step
    for ep, run in ((2, ep2), (1, ep1)):
        hf = tmp_path / f"ep{ep}" / "hf"
        after = _gather(run, "after")
        torch.testing.assert_close(_hf_log_probs(str(hf), base), after, atol=2e-5, rtol=1e-5)
        config = json.loads((hf / "lora_adapter" / "adapter_config.json").read_text())
        assert sorted(config["target_modules"]) == run[0]["targets"]
        if model in PEFT_DROPS:
            continue
        adapter = LoraConfig(
            rank=LORA.rank, alpha=LORA.alpha, adapter_path=str(hf / "lora_adapter")
        )
        torch.testing.assert_close(_hf_log_probs(path, base, adapter), after, atol=2e-5, rtol=1e-5)
    # a checkpoint resumes exactly at its EP size, and an EP = 2 one at EP = 1
    for ep, again, tol in ((2, 2, 0.0), (2, 1, 1e-6)):
        out = str(tmp_path / f"ep{ep}")
        resumed = spawn_ranks(_resume_rank, 2, path, base, again, out)[0]
        for k, v in ep2[0]["peft2"].items():
            torch.testing.assert_close(resumed[k], v, atol=tol, rtol=tol, msg=k)


def make_actor_batch(path: str) -> Batch:
    """The test batch with HF's log-probs (the torch engine's, no adapters) and reference
    log-probs near them."""
    from test_megatron import megatron_actor

    return with_log_probs(megatron_actor(path, "torch"), make_batch())


LAYOUTS = {
    "tp2-etp1": dict(tensor_model_parallel_size=2, expert_tensor_parallel_size=1),
    "tp2-etp2": dict(tensor_model_parallel_size=2, expert_tensor_parallel_size=2),
    "tp2-ep2-etp1": dict(
        tensor_model_parallel_size=2, expert_model_parallel_size=2, expert_tensor_parallel_size=1
    ),
    "pp2": dict(pipeline_model_parallel_size=2),
    "cp2": dict(context_parallel_size=2),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_moe_lora_over_two_ranks_equals_one(moe_models, tmp_path: Path, layout: str) -> None:
    """TP = 2 (an MoE layer then runs with sequence parallelism; the adapters see the whole
    sequence) with each expert whole on every TP rank (ETP = 1), split over them (ETP =
    2), or EP = 2 over the TP pair; two pipeline stages; two context-parallel ranks: the
    one-rank run's log-probs, metrics, adapters after a step and merged weights (the
    Qwen2-MoE: attention, experts and shared expert)."""
    path = moe_models["qwen2_moe"]
    base = make_actor_batch(path)
    ref = spawn_ranks(_step_rank, 1, path, base, EP(1), str(tmp_path / "one"))[0]
    m = MegatronConfig(**LAYOUTS[layout])
    for got in spawn_ranks(_step_rank, 2, path, base, m, str(tmp_path / "tp")):
        torch.testing.assert_close(got["init"], base["old_log_probs"], atol=1e-5, rtol=1e-5)
        for k in ("lora", "after"):
            torch.testing.assert_close(got[k], ref[k], atol=1e-5, rtol=1e-5, msg=k)
        for k in ("actor/pg_loss", "actor/grad_norm"):
            assert got["metrics"][k] == pytest.approx(ref["metrics"][k], rel=1e-5, abs=1e-6), k
        assert got["moved"] == got["trainable"]
        assert got["peft"].keys() == ref["peft"].keys()
        for k, v in ref["peft"].items():
            torch.testing.assert_close(got["peft"][k], v, atol=1e-5, rtol=1e-4, msg=k)
        for k, v in ref["merged"].items():
            torch.testing.assert_close(got["merged"][k], v, atol=1e-5, rtol=1e-4, msg=k)
