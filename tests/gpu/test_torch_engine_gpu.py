"""TorchEngine on one GPU: bf16 autocast, device placement, reference param offload."""

from __future__ import annotations

import pytest
import torch
from gpu_common import tiny_batch  # same folder: pytest puts it on sys.path

from temper.algorithms.aggregation import LossAggregator
from temper.config.schema import ActorConfig, ModelConfig
from temper.data.batch import Batch
from temper.training import EngineSpec, MicroBatching, TorchEngine
from temper.utils.tiny import make_tiny_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_gpu_bf16_matches_cpu_fp32_and_trains(tmp_path) -> None:
    path = str(make_tiny_model(tmp_path / "tiny"))
    batch = tiny_batch(2)
    cpu = TorchEngine(EngineSpec(model=ModelConfig(path=path), device=torch.device("cpu")))
    gpu = TorchEngine(
        EngineSpec(model=ModelConfig(path=path), device=torch.device("cuda"), train=ActorConfig())
    )
    assert gpu.compute_dtype == torch.bfloat16
    exact = cpu.forward(batch)["log_probs"]
    got = gpu.forward(batch)["log_probs"]
    assert got.device.type == "cpu"
    torch.testing.assert_close(got, exact, atol=2e-2, rtol=0)

    agg = LossAggregator.from_mask("token-mean", batch["response_mask"])

    def loss_fn(mb: Batch, out: dict[str, torch.Tensor]):
        return agg(-mb["advantages"] * out["log_probs"], mb["response_mask"]), {}

    metrics = gpu.train_mini_batch(batch, loss_fn)
    assert metrics["grad_norm"] > 0


def test_gpu_reference_param_offload(tmp_path) -> None:
    path = str(make_tiny_model(tmp_path / "tiny"))
    ref = TorchEngine(
        EngineSpec(
            model=ModelConfig(path=path),
            device=torch.device("cuda"),
            param_offload=True,
            infer_micro=MicroBatching(size=1),
            role="reference",
        )
    )
    assert next(ref.model.parameters()).device.type == "cpu"
    out = ref.forward(tiny_batch(2))["log_probs"]
    assert torch.isfinite(out).all()
    assert next(ref.model.parameters()).device.type == "cpu"


def test_gpu_compiled_fused_log_probs_and_entropy_match_eager(tmp_path) -> None:
    """``use_torch_compile`` compiles the fused log-prob + entropy pass on CUDA: an update
    whose loss uses the entropy gives eager's gradient norm and weights."""
    path = str(make_tiny_model(tmp_path / "tiny"))
    batch = tiny_batch(2)
    agg = LossAggregator.from_mask("token-mean", batch["response_mask"])

    def loss_fn(mb: Batch, out: dict[str, torch.Tensor]):
        per_token = -mb["advantages"] * out["log_probs"] - 0.1 * out["entropy"]
        return agg(per_token, mb["response_mask"]), {}

    runs = []
    for compiled in (False, True):
        spec = EngineSpec(
            model=ModelConfig(path=path, dtype="fp32"),  # type: ignore[arg-type]
            device=torch.device("cuda"),
            train=ActorConfig(use_torch_compile=compiled),
        )
        engine = TorchEngine(spec)
        metrics = engine.train_mini_batch(batch, loss_fn, with_entropy=True)
        runs.append((metrics["grad_norm"], dict(engine.named_weights())))
    (eager_norm, eager_w), (norm, weights) = runs
    assert norm == pytest.approx(eager_norm, rel=1e-4)
    for name, w in weights.items():
        torch.testing.assert_close(w, eager_w[name], atol=1e-5, rtol=1e-4, msg=name)


def test_gpu_packed_shared_prompts_equal_padded(tmp_path) -> None:
    """Packing on CUDA (sdpa under the row's prefix-tree mask: the segment kernel is the
    CPU's): rows sharing a prompt, packed once, give the padded layout's log-probs,
    entropy and loss gradients (bf16 autocast)."""
    path = str(make_tiny_model(tmp_path / "tiny"))
    g = torch.Generator().manual_seed(3)
    prompts = torch.randint(0, 256, (2, 5), generator=g).repeat_interleave(3, dim=0)
    pm = torch.ones(6, 5, dtype=torch.long)
    pm[3:, :2] = 0  # the second group's prompt is 3 tokens, left-padded
    lengths = torch.tensor([4, 1, 6, 6, 2, 5])
    rm = (torch.arange(6)[None] < lengths[:, None]).long()
    batch = Batch.from_dict(
        {
            "prompt_ids": torch.where(pm > 0, prompts, 259),
            "prompt_mask": pm,
            "response_ids": torch.where(rm > 0, torch.randint(0, 256, (6, 6), generator=g), 259),
            "response_mask": rm,
            "advantages": torch.randn(6, 6, generator=g) * rm,
        }
    )
    runs = []
    for packed in (False, True):
        model = ModelConfig(path=path, use_remove_padding=packed)
        engine = TorchEngine(
            EngineSpec(model=model, device=torch.device("cuda"), train=ActorConfig())
        )
        engine.model.train()
        out = engine._run(batch, temperature=1.0, with_entropy=True)
        loss = (-batch["advantages"].cuda() * out["log_probs"] * rm.cuda()).sum()
        loss.backward()
        grads = {n: p.grad.float().cpu() for n, p in engine.model.named_parameters()}
        runs.append(({k: v.float().cpu() for k, v in out.items()}, grads))
        assert engine.layouts["packed"] == int(packed)
    (out_a, ga), (out_b, gb) = runs
    for key in ("log_probs", "entropy"):
        torch.testing.assert_close(out_b[key], out_a[key], atol=3e-2, rtol=0)
    for name in ga:
        torch.testing.assert_close(gb[name], ga[name], atol=3e-2, rtol=5e-2, msg=name)
