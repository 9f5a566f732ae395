"""``model.use_liger`` on CUDA: Liger's RMSNorm, SwiGLU and rotary kernels go into the
torch engine's model, its log-probs equal HF's modules' (bf16 autocast, to rounding), and
an update through them moves every parameter.

Liger patches the modeling module for the whole process, so the check runs in a child
process and leaves this one's Llama classes as transformers ships them. Written for a
GPU machine; skipped without CUDA or liger-kernel (not run on the CPU CI)."""

from __future__ import annotations

import importlib.util
import multiprocessing
from pathlib import Path

import pytest
import torch
from gpu_common import tiny_batch  # same folder: pytest puts it on sys.path

from temper.config.schema import ActorConfig, ModelConfig, OptimConfig
from temper.data.batch import Batch
from temper.roles.actor import Actor
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec
from temper.utils.tiny import make_tiny_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
    pytest.mark.skipif(
        importlib.util.find_spec("liger_kernel") is None, reason="needs liger-kernel"
    ),
]


def _actor(path: str, liger: bool) -> Actor:
    cfg = ActorConfig(
        strategy="torch",
        micro_batch_size_per_device=2,
        grad_clip=1.0,
        optim=OptimConfig(lr=1e-3, weight_decay=0.0),
    )
    spec = EngineSpec(
        model=ModelConfig(path=path, use_liger=liger),
        device=torch.device("cuda"),
        train=cfg,
        infer_micro=MicroBatching(size=2),
    )
    return Actor(cfg, build_engine("torch", spec))


def _child(path: str, out: str) -> None:
    batch = tiny_batch()
    plain = _actor(path, liger=False).compute_log_probs(batch)["old_log_probs"].cpu()
    actor = _actor(path, liger=True)
    kinds = sorted({m._get_name() for m in actor.engine.model.modules()})  # Liger renames
    got = actor.compute_log_probs(batch)["old_log_probs"]
    before = {k: v.detach().float().cpu().clone() for k, v in actor.engine.named_weights()}
    metrics = actor.update(batch.union(Batch.from_dict({"old_log_probs": got})))
    after = {k: v.detach().float().cpu() for k, v in actor.engine.named_weights()}
    still = [k for k in before if torch.equal(before[k], after[k])]
    torch.save(
        {"plain": plain, "liger": got.cpu(), "kinds": kinds, "still": still, "m": metrics}, out
    )


def test_liger_kernels_go_in_and_keep_the_log_probs(tmp_path: Path) -> None:
    path = str(make_tiny_model(tmp_path / "m"))
    out = str(tmp_path / "out.pt")
    proc = multiprocessing.get_context("spawn").Process(target=_child, args=(path, out))
    proc.start()
    proc.join(timeout=300)
    assert proc.exitcode == 0
    res = torch.load(out)
    assert "LigerRMSNorm" in res["kinds"], res["kinds"]
    real = tiny_batch()["response_mask"] > 0
    torch.testing.assert_close(res["liger"][real], res["plain"][real], atol=2e-2, rtol=0)
    assert res["m"]["actor/grad_norm"] > 0
    assert res["still"] == []
