"""FSDP2 over two gloo ranks computes what the single-process torch engine computes.

Each test spawns fresh rank processes (``spawn_ranks``: loopback, free port) on the tiny
model. The single-process reference runs in the test process.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from temper.cluster.process_group import spawn_ranks
from temper.config.schema import ActorConfig, FSDPConfig, LoraConfig, ModelConfig, OptimConfig
from temper.data.batch import Batch
from temper.roles.actor import Actor
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec
from temper.training.torch_engine import TorchEngine

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytestmark = pytest.mark.slow

PAD = 259
PROMPTS = [7, 3, 5, 1]
RESPONSES = [6, 2, 4, 1]


def make_batch(seed: int = 0) -> Batch:
    """4 left/right-padded samples of different lengths, advantages ±1, KL targets."""
    g = torch.Generator().manual_seed(seed)
    B, P, R = len(PROMPTS), 7, 6
    pl, rl = torch.tensor(PROMPTS), torch.tensor(RESPONSES)
    pm = (torch.arange(P)[None] >= P - pl[:, None]).long()
    rm = (torch.arange(R)[None] < rl[:, None]).long()
    return Batch.from_dict(
        {
            "prompt_ids": torch.where(pm > 0, torch.randint(0, 256, (B, P), generator=g), PAD),
            "prompt_mask": pm,
            "response_ids": torch.where(rm > 0, torch.randint(0, 256, (B, R), generator=g), PAD),
            "response_mask": rm,
            "advantages": (torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * rm).float(),
        }
    )


def actor_config(ulysses: int = 1, **fsdp: Any) -> ActorConfig:
    """Token-budget micro-batches (12 tokens): rank 0 gets 2, rank 1 gets 1 micro-batch,
    so the padding micro-batch path runs; a small grad_clip makes clipping bite."""
    return ActorConfig(
        ulysses_sequence_parallel_size=ulysses,
        strategy="fsdp2",
        use_dynamic_bsz=True,
        max_token_len_per_device=12,
        grad_clip=0.05,
        use_kl_loss=True,
        kl_loss_coef=0.1,
        entropy_coeff=0.01,
        fsdp=FSDPConfig(**fsdp),
        # a decaying LR: a resumed run must continue the schedule, not restart it
        optim=OptimConfig(
            lr=1e-3, weight_decay=0.01, lr_scheduler="linear", total_training_steps=4
        ),
    )


def make_actor(
    path: str, strategy: str, model: ModelConfig | None = None, ulysses: int = 1, **fsdp: Any
) -> Actor:
    cfg = actor_config(ulysses, **fsdp)
    spec = EngineSpec(
        model=model or ModelConfig(path=path),
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=MicroBatching(size=1),
        entropy_chunk_size=0,
        total_steps=4,
    )
    return Actor(cfg, build_engine(strategy, spec))


def with_log_probs(actor: Actor, batch: Batch) -> Batch:
    batch = actor.compute_log_probs(batch)
    noise = torch.randn(batch["old_log_probs"].shape, generator=torch.Generator().manual_seed(3))
    batch["ref_log_probs"] = (batch["old_log_probs"] + 0.1 * noise) * batch["response_mask"]
    return batch


def shard(batch: Batch, rank: int, world: int) -> Batch:
    n = len(batch) // world
    return batch.slice(rank * n, (rank + 1) * n)


def weights(actor: Actor) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in actor.engine.named_weights()}


# ----------------------------------------------------------------------- rank functions


def _step_rank(rank: int, world: int, path: str, batch: Batch, fsdp: dict) -> dict:
    model = fsdp.pop("_model", None)
    actor = make_actor(path, "fsdp2", model=model, **fsdp)
    mine = shard(batch, rank, world)
    old = actor.compute_log_probs(mine, with_sum_pi_squared=True)
    metrics = actor.update(mine)
    full = weights(actor)  # a collective: every rank gathers
    return {
        "old": old["old_log_probs"],
        "spq": old["sum_pi_squared"],
        "metrics": metrics,
        "weights": full if rank == 0 else None,
    }


def _checkpoint_rank(rank: int, world: int, path: str, b1: Batch, b2: Batch, ckpt: str, mode: str):
    actor = make_actor(path, "fsdp2")
    out: dict[str, Any] = {}
    if mode == "train":
        actor.update(shard(b1, rank, world))
        actor.engine.save_checkpoint(f"{ckpt}/a")  # type: ignore[attr-defined]
    else:
        actor.engine.load_checkpoint(f"{ckpt}/{mode}")  # type: ignore[attr-defined]
    out["w1"] = weights(actor)
    if mode == "a":
        actor.engine.save_checkpoint(f"{ckpt}/b")  # type: ignore[attr-defined]
    if mode != "b":
        actor.update(shard(b2, rank, world))
        out["w2"] = weights(actor)
    return out if rank == 0 else None


# ----------------------------------------------------------------------- tests


def assert_weights_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=2e-6, rtol=1e-5, msg=k)


@pytest.mark.parametrize(
    ("fsdp", "checkpointing"),
    [({}, False), ({"fsdp_size": 1}, False), ({"reshard_after_forward": False}, True)],
    ids=["fsdp", "hsdp-1x2", "no-reshard+grad-ckpt"],
)
def test_two_ranks_match_single_process(tiny_path: str, fsdp: dict, checkpointing: bool) -> None:
    if checkpointing:
        fsdp = {**fsdp, "_model": ModelConfig(path=tiny_path, enable_gradient_checkpointing=True)}
    single = make_actor(tiny_path, "torch")
    batch = with_log_probs(single, make_batch())
    spq = single.compute_log_probs(batch, with_sum_pi_squared=True)["sum_pi_squared"]
    before = weights(single)
    ref_metrics = single.update(batch)
    ref_weights = weights(single)

    ranks = spawn_ranks(_step_rank, 2, tiny_path, batch, fsdp)

    old = torch.cat([r["old"] for r in ranks])
    torch.testing.assert_close(old, batch["old_log_probs"], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(torch.cat([r["spq"] for r in ranks]), spq, atol=1e-6, rtol=1e-6)
    got = ranks[0]["metrics"]
    assert got.keys() == ref_metrics.keys()
    for k, v in ref_metrics.items():
        if k == "actor/packed_fraction":  # a layout choice: 2 rows packed vs 1 row per rank
            continue
        assert got[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k
        assert ranks[1]["metrics"][k] == got[k], k  # every rank reports the global value
    assert ref_metrics["actor/grad_norm"] > 0.05  # clipping was active
    assert_weights_close(ranks[0]["weights"], ref_weights)
    moved = [k for k in before if not torch.equal(before[k], ref_weights[k])]
    assert len(moved) == len(before)


def test_checkpoint_reshards_between_two_and_one_ranks(tiny_path: str, tmp_path: Path) -> None:
    """2 ranks: step, save A, step → W2. 1 rank: load A, save B, step → W2 again (model,
    Adam moments and warmup schedule resumed). 2 ranks: load B → the weights of A."""
    single = make_actor(tiny_path, "torch")
    b1 = with_log_probs(single, make_batch(seed=1))
    b2 = with_log_probs(single, make_batch(seed=2))
    ckpt = str(tmp_path)

    (trained, _) = spawn_ranks(_checkpoint_rank, 2, tiny_path, b1, b2, ckpt, "train")
    w1, w2 = trained["w1"], trained["w2"]
    (resumed,) = spawn_ranks(_checkpoint_rank, 1, tiny_path, b1, b2, ckpt, "a")
    assert_weights_close(resumed["w1"], w1)
    assert_weights_close(resumed["w2"], w2)
    (back, _) = spawn_ranks(_checkpoint_rank, 2, tiny_path, b1, b2, ckpt, "b")
    assert_weights_close(back["w1"], w1)
    assert not torch.equal(w1["lm_head.weight"], w2["lm_head.weight"])


def _export_rank(rank: int, world: int, path: str, batch: Batch, out: str) -> dict | None:
    lora = ModelConfig(path=path, lora=LoraConfig(rank=4, alpha=8))
    torch.manual_seed(0)  # LoRA A matrices are drawn from the global RNG
    actor = make_actor(path, "fsdp2", model=lora)
    actor.update(shard(batch, rank, world))
    merged = weights(actor)
    actor.engine.save_hf(f"{out}/actor")
    spec = EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cpu"),
        kind="value",
        train=actor_config(),
        seed=5,
    )
    critic = build_engine("fsdp2", spec)
    critic.save_hf(f"{out}/critic")
    values = critic.forward(shard(batch, rank, world), with_values=True)["values"]
    return {"merged": merged, "values": values}


def test_lora_and_value_models_export_gathered_weights(tiny_path: str, tmp_path: Path) -> None:
    """LoRA merged on the shards = the torch engine's merge; save_hf on rank 0 loads in
    transformers; a sharded value model saves its backbone + head and reloads."""
    from transformers import AutoModelForCausalLM

    lora = ModelConfig(path=tiny_path, lora=LoraConfig(rank=4, alpha=8))
    torch.manual_seed(0)
    single = make_actor(tiny_path, "torch", model=lora)
    batch = with_log_probs(single, make_batch())
    single.update(batch)
    ranks = spawn_ranks(_export_rank, 2, tiny_path, batch, str(tmp_path))

    assert_weights_close(ranks[0]["merged"], weights(single))
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "actor").state_dict()
    assert_weights_close({k: saved[k] for k in ranks[0]["merged"]}, ranks[0]["merged"])
    assert (tmp_path / "actor" / "lora_adapter" / "adapter_config.json").is_file()
    # the sharded value model's export reloads (backbone + head) and gives its values
    spec = EngineSpec(
        model=ModelConfig(path=str(tmp_path / "critic")), device=torch.device("cpu"), kind="value"
    )
    again = TorchEngine(spec).forward(batch, with_values=True)["values"]
    torch.testing.assert_close(torch.cat([r["values"] for r in ranks]), again, atol=1e-6, rtol=1e-5)
