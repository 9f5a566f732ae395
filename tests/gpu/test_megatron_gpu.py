"""The megatron engine on CUDA (nccl): TransformerEngine's layer spec when TE is
installed, bf16 autocast over fp32 master weights, and TP=2 or PP=2 over two GPUs
matching the torch engine (and an MoE model at TP=2 × expert TP=1). Written for a GPU
machine; skipped without CUDA (not run on the CPU CI)."""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from gpu_common import tiny_batch  # same folder: pytest puts it on sys.path

from temper.cluster.process_group import free_port
from temper.config.schema import (
    ActorConfig,
    LoraConfig,
    MegatronConfig,
    ModelConfig,
    OptimConfig,
)
from temper.data.batch import Batch
from temper.roles.actor import Actor
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec
from temper.utils.tiny import make_tiny_model, make_tiny_moe_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(
        __import__("importlib").util.find_spec("megatron") is None, reason="needs megatron-core"
    ),
]


def _actor(
    path: str,
    strategy: str,
    device: str,
    tp: int = 1,
    dtype: str = "auto",
    pp: int = 1,
    extra: dict | None = None,
    lora: LoraConfig | None = None,
    etp: int | None = None,
) -> Actor:
    cfg = ActorConfig(
        strategy=strategy,
        micro_batch_size_per_device=2,
        grad_clip=1.0,
        megatron=MegatronConfig(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            expert_tensor_parallel_size=etp,
            extra=dict(extra or {}),
        ),
        optim=OptimConfig(lr=1e-3, weight_decay=0.0),
    )
    spec = EngineSpec(
        model=ModelConfig(path=path, dtype=dtype, lora=lora or LoraConfig()),  # type: ignore[arg-type]
        device=torch.device(device),
        train=cfg,
        infer_micro=MicroBatching(size=2),
    )
    return Actor(cfg, build_engine(strategy, spec))


def test_one_gpu_bf16_matches_cpu_and_uses_transformer_engine(tmp_path: Path) -> None:
    path = str(make_tiny_model(tmp_path / "tiny"))
    batch = tiny_batch()
    cpu = _actor(path, "torch", "cpu").compute_log_probs(batch)["old_log_probs"]
    actor = _actor(path, "megatron", "cuda")  # a one-rank nccl world in this process
    engine: Any = actor.engine
    got = actor.compute_log_probs(batch)["old_log_probs"]
    torch.testing.assert_close(got, cpu, atol=3e-2, rtol=0)
    if __import__("importlib").util.find_spec("transformer_engine") is not None:
        assert engine.built.use_te
        assert any("TE" in type(m).__name__ for m in engine.model.modules())
    metrics = actor.update(batch.union(Batch.from_dict({"old_log_probs": got})))
    assert metrics["actor/grad_norm"] > 0
    engine.save_checkpoint(str(tmp_path / "ckpt"))
    engine.load_checkpoint(str(tmp_path / "ckpt"))


def test_one_gpu_lora_bf16_matches_cpu_and_trains_adapters_only(tmp_path: Path) -> None:
    """Megatron LoRA on CUDA (the local layer spec: TE fuses the norm into linear_qkv)
    with the torch engine's peft adapters (random A and B) gives its fp32 CPU log-probs,
    with adapters and without (the reference); an update moves the adapters and nothing
    else (frozen base weights under gradient-accumulation fusion, where it is on)."""
    path = str(make_tiny_model(tmp_path / "tiny"))
    batch = tiny_batch()
    lora = LoraConfig(rank=4, alpha=8)
    cpu = _actor(path, "torch", "cpu", lora=lora)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in cpu.engine.model.named_parameters():  # type: ignore[attr-defined]
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    from peft import get_peft_model_state_dict

    adapters = {
        k: v.detach().clone()
        for k, v in get_peft_model_state_dict(cpu.engine.model).items()  # type: ignore[attr-defined]
    }
    want = cpu.compute_log_probs(batch)["old_log_probs"]
    with cpu.engine.adapters_disabled():  # type: ignore[attr-defined]
        want_base = cpu.compute_log_probs(batch)["old_log_probs"]
    actor = _actor(path, "megatron", "cuda", lora=lora)
    engine: Any = actor.engine
    engine.lora.load_peft(adapters)
    got = actor.compute_log_probs(batch)["old_log_probs"]
    with engine.adapters_disabled():
        base = actor.compute_log_probs(batch)["old_log_probs"]
    torch.testing.assert_close(got, want, atol=3e-2, rtol=0)
    torch.testing.assert_close(base, want_base, atol=3e-2, rtol=0)
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
    assert moved == trainable
    engine.save_hf(str(tmp_path / "hf"))
    assert (tmp_path / "hf" / "lora_adapter" / "adapter_model.safetensors").is_file()


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral"])
def test_one_gpu_moe_bf16_matches_cpu_and_trains_with_router_losses(
    tmp_path: Path, model_type: str
) -> None:
    """A mixture-of-experts model (Megatron-Core's MoE layer, EP = 1) on CUDA in bf16
    gives the torch engine's fp32 CPU log-probs, and an update with the auxiliary and
    z losses moves the router."""
    path = make_tiny_moe_model(tmp_path / model_type, model_type)
    batch = tiny_batch()
    cpu = _actor(path, "torch", "cpu").compute_log_probs(batch)["old_log_probs"]
    losses = {"moe_aux_loss_coeff": 0.01, "moe_z_loss_coeff": 0.001}
    actor = _actor(path, "megatron", "cuda", extra=losses)
    got = actor.compute_log_probs(batch)["old_log_probs"]
    torch.testing.assert_close(got, cpu, atol=5e-2, rtol=0)
    before = {k: v.detach().float().cpu().clone() for k, v in actor.engine.named_weights()}
    metrics = actor.update(batch.union(Batch.from_dict({"old_log_probs": got})))
    assert metrics["actor/grad_norm"] > 0
    after = dict(actor.engine.named_weights())
    router = [k for k in before if k.endswith(".gate.weight")]
    assert router, sorted(before)
    for k in router:
        assert not torch.equal(after[k].detach().float().cpu(), before[k]), k


def _two_rank(
    rank: int, path: str, batch: Batch, port: int, out: str, tp: int, etp: int | None = None
) -> None:
    import torch.distributed as dist

    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE="2")
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(minutes=5),
    )
    try:
        actor = _actor(path, "megatron", "cuda", tp=tp, dtype="fp32", pp=2 // tp, etp=etp)
        metrics = actor.update(batch)
        weights = {k: v.detach().cpu() for k, v in actor.engine.named_weights()}
        if rank == 0:
            torch.save({"metrics": metrics, "weights": weights}, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
@pytest.mark.parametrize("tp", [2, 1], ids=["tp2", "pp2"])
def test_two_gpus_tensor_or_pipeline_parallel_update_matches_the_torch_engine(
    tmp_path: Path, tp: int
) -> None:
    """TP=2, or two pipeline stages (temper's schedule over nccl send/recv)."""
    import torch.multiprocessing as mp

    path = str(make_tiny_model(tmp_path / "tiny"))
    single = _actor(path, "torch", "cpu", dtype="fp32")
    batch = single.compute_log_probs(tiny_batch())
    ref = single.update(batch)
    ref_w = {k: v.detach() for k, v in single.engine.named_weights()}
    out = str(tmp_path / "rank0.pt")
    mp.start_processes(
        _two_rank,
        args=(path, batch, free_port(), out, tp),
        nprocs=2,
        join=True,
        start_method="spawn",
    )
    got = torch.load(out, weights_only=False)
    assert got["metrics"]["actor/grad_norm"] == pytest.approx(ref["actor/grad_norm"], rel=1e-3)
    for k, v in got["weights"].items():
        torch.testing.assert_close(v, ref_w[k], atol=1e-4, rtol=1e-3, msg=k)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_two_gpus_moe_tp2_expert_tp1_update_matches_the_torch_engine(tmp_path: Path) -> None:
    """An MoE model at TP = 2 with whole experts on each GPU (expert_tensor_parallel_size
    1): Megatron's own sequence-parallel collectives over nccl, the experts' gradients
    summed over the expert-data-parallel group (the TP pair)."""
    import torch.multiprocessing as mp
    from safetensors.torch import load_file

    path = make_tiny_moe_model(tmp_path / "qwen3_moe", "qwen3_moe")
    single = _actor(path, "torch", "cpu", dtype="fp32")
    batch = single.compute_log_probs(tiny_batch())
    ref = single.update(batch)
    single.engine.save_hf(str(tmp_path / "torch"))  # one tensor per expert, as megatron's
    ref_w = load_file(str(tmp_path / "torch" / "model.safetensors"))
    out = str(tmp_path / "rank0.pt")
    mp.start_processes(
        _two_rank,
        args=(path, batch, free_port(), out, 2, 1),
        nprocs=2,
        join=True,
        start_method="spawn",
    )
    got = torch.load(out, weights_only=False)
    assert got["metrics"]["actor/grad_norm"] == pytest.approx(ref["actor/grad_norm"], rel=1e-3)
    assert set(got["weights"]) == set(ref_w)
    for k, v in got["weights"].items():
        torch.testing.assert_close(v, ref_w[k], atol=1e-4, rtol=1e-3, msg=k)
