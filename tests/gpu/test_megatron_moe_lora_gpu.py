"""LoRA on a mixture-of-experts model on the megatron engine on CUDA (nccl): the tiny
Qwen2-MoE (attention, every expert and the shared expert adapted). On one GPU in bf16
the base model's log-probs at init, only adapters trained, and the merged export's HF
forward (fp32, CPU) equal to the GPU's; on two GPUs (fp32) TP = 2 with whole experts on
each GPU (ETP = 1: sequence parallelism with temper's collectives around the TP layers,
so the adapters see whole sequences) and TP = ETP = 2 give the one-GPU update (EP is
tested on CPU). Written for a
GPU machine; skipped without CUDA (not run on the CPU CI)."""

from __future__ import annotations

import datetime
import os
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch
from gpu_common import tiny_batch  # same folder: pytest puts it on sys.path

from temper.cluster.process_group import free_port
from temper.config.schema import ActorConfig, LoraConfig, MegatronConfig, ModelConfig, OptimConfig
from temper.data.batch import Batch
from temper.roles.actor import Actor
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec
from temper.utils.tiny import make_tiny_moe_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(
        __import__("importlib").util.find_spec("megatron") is None, reason="needs megatron-core"
    ),
]

LORA = LoraConfig(rank=4, alpha=8)


def _actor(
    path: str, strategy: str, device: str, dtype: str, lora: LoraConfig, **megatron: Any
) -> Actor:
    cfg = ActorConfig(
        strategy=strategy,
        micro_batch_size_per_device=2,
        grad_clip=1.0,
        megatron=MegatronConfig(**megatron),
        optim=OptimConfig(lr=1e-3, weight_decay=0.0),
    )
    spec = EngineSpec(
        model=ModelConfig(path=path, dtype=dtype, lora=lora),  # type: ignore[arg-type]
        device=torch.device(device),
        train=cfg,
        infer_micro=MicroBatching(size=2),
    )
    return Actor(cfg, build_engine(strategy, spec))


def _seeded_adapters(engine: Any) -> None:
    """Every adapter tensor from a generator keyed by its peft name (the same whole
    tensors at any layout), each rank taking its shard."""
    params = dict(engine.model.named_parameters())
    full = {}
    for r in engine.lora.rows:
        shape = list(params[r.name].shape)
        if r.kind != "rep":
            shape[0 if r.kind == "col" else 1] *= r.tp
        gen = torch.Generator().manual_seed(zlib.crc32(r.peft.encode()))
        full[r.peft] = torch.randn(shape, generator=gen) * 0.2
    engine.lora.load_peft(full)


def test_one_gpu_moe_lora_bf16_matches_cpu_and_exports(tmp_path: Path) -> None:
    path = make_tiny_moe_model(tmp_path / "qwen2_moe", "qwen2_moe")
    batch = tiny_batch()
    cpu = _actor(path, "torch", "cpu", "auto", LoraConfig()).compute_log_probs(batch)
    actor = _actor(path, "megatron", "cuda", "auto", LORA)
    engine: Any = actor.engine
    init = actor.compute_log_probs(batch)["old_log_probs"]
    torch.testing.assert_close(init, cpu["old_log_probs"], atol=5e-2, rtol=0)
    _seeded_adapters(engine)
    got = actor.compute_log_probs(batch)["old_log_probs"]
    before = {n: p.detach().float().cpu().clone() for n, p in engine.model.named_parameters()}
    trainable = {n for n, p in engine.model.named_parameters() if p.requires_grad}
    metrics = actor.update(batch.union(Batch.from_dict({"old_log_probs": got})))
    assert metrics["actor/grad_norm"] > 0
    moved = {
        n
        for n, p in engine.model.named_parameters()
        if not torch.equal(p.detach().float().cpu(), before[n])
    }
    assert trainable and all(".lora." in n for n in trainable)
    assert any(".local_experts." in n for n in trainable) and moved == trainable
    after = actor.compute_log_probs(batch)["old_log_probs"]
    engine.save_hf(str(tmp_path / "hf"))
    merged = _actor(str(tmp_path / "hf"), "torch", "cpu", "fp32", LoraConfig())
    want = merged.compute_log_probs(batch)["old_log_probs"]
    torch.testing.assert_close(after.float().cpu(), want, atol=5e-2, rtol=0)


def _ranks(rank: int, world: int, path: str, batch: Batch, port: int, out: str, m: dict) -> None:
    import torch.distributed as dist

    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE=str(world))
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(minutes=5),
    )
    try:
        actor = _actor(path, "megatron", "cuda", "fp32", LORA, **m)
        engine: Any = actor.engine
        _seeded_adapters(engine)
        log_probs = actor.compute_log_probs(batch)["old_log_probs"].cpu()
        metrics = actor.update(batch)
        peft = {k: v.detach().cpu() for k, v in engine.checkpointer.peft_named_weights()}
        if rank == 0:
            torch.save({"log_probs": log_probs, "metrics": metrics, "peft": peft}, out)
    finally:
        dist.destroy_process_group()


def _run(world: int, path: str, batch: Batch, out: str, m: dict) -> dict:
    import torch.multiprocessing as mp

    mp.start_processes(
        _ranks,
        args=(world, path, batch, free_port(), out, m),
        nprocs=world,
        join=True,
        start_method="spawn",
    )
    return torch.load(out, weights_only=False)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize(
    "layout",
    [
        {"tensor_model_parallel_size": 2, "expert_tensor_parallel_size": 1},
        {"tensor_model_parallel_size": 2, "expert_tensor_parallel_size": 2},
    ],
    ids=["tp2-etp1", "tp2-etp2"],
)
def test_two_gpus_moe_lora_update_matches_one(tmp_path: Path, layout: dict) -> None:
    path = make_tiny_moe_model(tmp_path / "qwen2_moe", "qwen2_moe")
    batch = tiny_batch()
    cpu = _actor(path, "torch", "cpu", "fp32", LoraConfig())
    batch = cpu.compute_log_probs(batch)
    one = _run(1, path, batch, str(tmp_path / "one.pt"), {})
    two = _run(2, path, batch, str(tmp_path / "two.pt"), layout)
    torch.testing.assert_close(two["log_probs"], one["log_probs"], atol=1e-4, rtol=1e-4)
    for k in ("actor/pg_loss", "actor/grad_norm"):
        assert two["metrics"][k] == pytest.approx(one["metrics"][k], rel=1e-3, abs=1e-6), k
    assert two["peft"].keys() == one["peft"].keys()
    for k, v in one["peft"].items():
        torch.testing.assert_close(two["peft"][k], v, atol=1e-4, rtol=1e-3, msg=k)
