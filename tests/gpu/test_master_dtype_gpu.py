"""bf16 master weights (``actor.master_dtype: bf16``) on one GPU: weights and AdamW's
moments in bf16 on the device, torch's fused CUDA AdamW steps them, every weight moves,
and the Hugging Face export is bf16."""

from __future__ import annotations

import pytest
import torch
from gpu_common import tiny_batch  # same folder: pytest puts it on sys.path

from temper.algorithms.aggregation import LossAggregator
from temper.config.schema import ActorConfig, ModelConfig, OptimConfig
from temper.data.batch import Batch
from temper.training import EngineSpec, TorchEngine
from temper.utils.tiny import make_tiny_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_gpu_bf16_master_weights_train_every_weight(tmp_path) -> None:
    from safetensors.torch import load_file

    path = str(make_tiny_model(tmp_path / "tiny"))
    actor = ActorConfig(master_dtype="bf16", optim=OptimConfig(lr=1e-2, weight_decay=0.0))
    engine = TorchEngine(
        EngineSpec(model=ModelConfig(path=path), device=torch.device("cuda"), train=actor)
    )
    params = dict(engine.model.named_parameters())
    assert {(p.dtype, p.device.type) for p in params.values()} == {(torch.bfloat16, "cuda")}
    before = {n: p.detach().clone() for n, p in params.items()}
    batch = tiny_batch(2)
    agg = LossAggregator.from_mask("token-mean", batch["response_mask"])

    def loss_fn(mb: Batch, out: dict[str, torch.Tensor]):
        return agg(-mb["advantages"] * out["log_probs"], mb["response_mask"]), {}

    metrics = engine.train_mini_batch(batch, loss_fn)
    assert 0 < metrics["grad_norm"] < float("inf")
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    assert [n for n, p in params.items() if torch.equal(p.detach(), before[n])] == []
    assert engine.optimizer is not None
    state = list(engine.optimizer.state.values())
    assert len(state) == len(params)
    assert {s["exp_avg"].dtype for s in state} == {torch.bfloat16}
    engine.save_hf(str(tmp_path / "hf"))
    saved = load_file(str(tmp_path / "hf" / "model.safetensors"))
    assert {w.dtype for w in saved.values()} == {torch.bfloat16}
