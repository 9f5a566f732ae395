"""Router replay on the megatron engine (Megatron-Core's ``RouterReplay`` in each
``TopKRouter``; gloo, fp32), held against the torch engine's (HF modeling code):

* a recording forward gives the torch engine's routing of every real token, at TP = 1,
  at TP = 2 with sequence parallelism × EP = 2 (records gathered over the TP group), at
  PP = 2 (each stage records its layers, gathered over the pipeline; Qwen3-MoE's first
  stage holds no MoE layer), with virtual stages (each rank's MoE layers not adjacent),
  at CP = 2, alone, × TP = 2 with sequence parallelism and × PP = 2 (each CP rank routes
  its two chunks of every sequence, gathered back in order);
* replaying the record changes nothing bitwise, and the update's first training forward
  gives the old log-probs bitwise;
* replaying a routing unlike the model's own (random experts per token) gives the torch
  engine's replayed log-probs and, trained on, its gradient, whatever the micro-batching:
  the layout maps each token to its own row's experts, and the replayed gates are HF's
  (Qwen3-MoE: softmax of the chosen logits; Qwen2-MoE: the full softmax at them).

Run alone (a Megatron module: its own pytest process).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch

pytest.importorskip("megatron.core")

import megatron.core.models.gpt.gpt_model  # noqa: F401  (imported once, before the forks)
from test_router_replay import engine as torch_engine
from test_router_replay import make_batch

import temper.training.megatron_engine  # noqa: F401
from temper.cluster.process_group import spawn_ranks
from temper.config.schema import ActorConfig, MegatronConfig, ModelConfig, OptimConfig
from temper.data.batch import Batch
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.router_replay import ROUTED_EXPERTS
from temper.training.spec import EngineSpec
from temper.utils.tiny import make_tiny_moe_model

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory: Any) -> dict[str, str]:
    root = tmp_path_factory.mktemp("megatron-rr")
    models = {t: make_tiny_moe_model(root / t, t) for t in ("qwen2_moe", "qwen3_moe")}
    # four layers, the first dense: virtual stages 0, 2 on rank 0 hold MoE layer 1 of 0-2
    models["qwen3_moe_4"] = make_tiny_moe_model(root / "q3-4", "qwen3_moe", num_layers=4)
    return models


def megatron_engine(
    path: str, tp: int, ep: int, micro: MicroBatching, pp: int = 1, cp: int = 1, vp: int = 1
) -> Any:
    cfg = ActorConfig(
        strategy="megatron",
        use_dynamic_bsz=micro.max_tokens is not None,
        max_token_len_per_device=micro.max_tokens or 1,
        micro_batch_size_per_device=micro.size,
        optim=OptimConfig(lr=1e-2, weight_decay=0.0),
        megatron=MegatronConfig(
            tensor_model_parallel_size=tp,
            expert_model_parallel_size=ep,
            pipeline_model_parallel_size=pp,
            context_parallel_size=cp,
            virtual_pipeline_model_parallel_size=vp if vp > 1 else None,
        ),
        router_replay="R2",
    )
    spec = EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=micro,
        router_replay=True,
    )
    return build_engine("megatron", spec)


def designed_routing(batch: Batch, layers: int, seed: int = 0) -> torch.Tensor:
    """Random distinct top-2 experts of 4 for every token, ``(B, P + R, L, 2)``."""
    B, C = len(batch), batch["prompt_ids"].shape[1] + batch["response_ids"].shape[1]
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randperm(4, generator=g)[:2] for _ in range(B * C * layers)]
    return torch.stack(rows).reshape(B, C, layers, 2).to(torch.int8)


def _with_routing(batch: Batch, routing: torch.Tensor) -> Batch:
    return batch.union(Batch.from_dict({ROUTED_EXPERTS: routing}))


def _rank(
    rank: int, world: int, path: str, batch: Batch, tp: int, ep: int, pp: int, cp: int, vp: int
) -> dict:
    micro = MicroBatching(size=2) if tp == 1 else MicroBatching(max_tokens=20)
    eng = megatron_engine(path, tp, ep, micro, pp, cp, vp)
    share = len(batch) // eng.dp_size
    mine = batch.slice(eng.dp_rank * share, (eng.dp_rank + 1) * share)
    designed = mine.pop("designed")
    plain = eng.forward(mine)["log_probs"]
    rec = eng.forward(mine, routing="record")[ROUTED_EXPERTS]
    replayed = eng.forward(_with_routing(mine, rec), routing="replay")["log_probs"]
    forced = eng.forward(_with_routing(mine, designed), routing="replay")["log_probs"]
    # the update's first forward, as one micro-batch like the recording forward
    eng.train_micro = eng.infer_micro = MicroBatching(size=share)
    old = eng.forward(mine, routing="record", with_entropy=True)
    got: list[torch.Tensor] = []

    def capture(mb: Batch, out: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        got.append(out["log_probs"].detach())
        return out["log_probs"].sum() * 0.0, {}

    eng.train_mini_batch(_with_routing(mine, old[ROUTED_EXPERTS]), capture)
    # the designed routing trained on (a zero step before left the weights as they were),
    # several micro-batches a rank: each replays its own rows, forward and backward
    eng.train_micro = micro
    norm = eng.train_mini_batch(_with_routing(mine, designed), _sum_loss)["grad_norm"]
    return {
        "dp": eng.dp_rank,
        "plain": plain,
        "record": rec,
        "replayed": replayed,
        "old": old["log_probs"],
        "train": got[0] if got else None,  # the loss runs on the last pipeline stage
        "forced": forced,
        "grad_norm": norm,
    }


def _sum_loss(mb: Batch, out: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
    return (out["log_probs"] * mb["response_mask"]).sum(), {}


def _joined(ranks: list[dict], key: str) -> torch.Tensor:
    seen: dict[int, torch.Tensor] = {}
    for r in ranks:  # the TP, PP and CP ranks of one DP rank agree: keep one
        seen.setdefault(r["dp"], r[key])
        assert torch.equal(r[key], seen[r["dp"]])
    return torch.cat([seen[d] for d in sorted(seen)])


@pytest.mark.parametrize(
    ("model", "tp", "ep", "pp", "cp", "vp"),
    [
        ("qwen3_moe", 1, 1, 1, 1, 1),
        ("qwen2_moe", 1, 1, 1, 1, 1),
        ("qwen3_moe", 2, 2, 1, 1, 1),
        ("qwen2_moe", 1, 1, 2, 1, 1),
        ("qwen3_moe", 1, 1, 2, 1, 1),
        ("qwen3_moe_4", 1, 1, 2, 1, 2),
        ("qwen3_moe", 1, 1, 1, 2, 1),
        ("qwen2_moe", 2, 1, 1, 2, 1),
        ("qwen2_moe", 1, 1, 2, 2, 1),
    ],
    ids=[
        "qwen3-tp1",
        "qwen2-tp1",
        "qwen3-tp2sp-ep2",
        "qwen2-pp2",
        "qwen3-pp2",
        "qwen3-4layers-pp2-vpp2",
        "qwen3-cp2",
        "qwen2-cp2-tp2sp",
        "qwen2-pp2-cp2",
    ],
)
def test_megatron_replay_matches_the_torch_engine(
    moe_models, model: str, tp: int, ep: int, pp: int, cp: int, vp: int
) -> None:
    path = moe_models[model]
    batch = make_batch()
    ref = torch_engine(path)
    designed = designed_routing(batch, ref.router_replay.num_layers)
    ref_rec = ref.forward(batch, routing="record")
    ref_forced = ref.forward(_with_routing(batch, designed), routing="replay")["log_probs"]
    ref_norm = ref.train_mini_batch(_with_routing(batch, designed), _sum_loss)["grad_norm"]
    batch["designed"] = designed

    # TP = 2 × DP = 2 (EP = 2 inside DP); with PP or CP, TP × PP × CP ranks of one DP rank
    world = tp * 2 if tp > 1 and pp * cp == 1 else tp * pp * cp
    ranks = spawn_ranks(_rank, world, path, batch, tp, ep, pp, cp, vp)
    record = _joined(ranks, "record")
    real = ref_rec[ROUTED_EXPERTS] >= 0
    assert torch.equal(record >= 0, real)  # -1 exactly where the torch engine's is
    assert torch.equal(record[real], ref_rec[ROUTED_EXPERTS][real])
    for r in ranks:
        assert torch.equal(r["replayed"], r["plain"])  # the record replayed: bitwise
        if r["train"] is not None:
            assert torch.equal(r["train"], r["old"])  # step 0 of the update: bitwise
    torch.testing.assert_close(_joined(ranks, "plain"), ref_rec["log_probs"], atol=2e-5, rtol=0)
    forced = _joined(ranks, "forced")
    assert (forced - _joined(ranks, "plain")).abs().max() > 1e-2  # the designed routing bites
    torch.testing.assert_close(forced, ref_forced, atol=2e-5, rtol=0)
    for r in ranks:  # the gradient of the replayed loss: the torch engine's
        assert r["grad_norm"] == pytest.approx(ref_norm, rel=1e-4)
