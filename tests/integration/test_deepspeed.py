"""DeepSpeed over two gloo ranks computes what the single-process torch engine computes.

One pair of rank processes (``spawn_ranks``) runs every case in turn — DeepSpeed's
import and first ``initialize`` dominate, so the process group and the import are
shared; each case builds its own engine. The single-process references run in the test
process. Cases: one actor update on ZeRO-1/2/3 and ZeRO-3 with optimizer and parameter
offload; ZeRO-3 with LoRA and gradient checkpointing; a frozen ZeRO-3 reference; a ZeRO-3
value model exported and reloaded; DeepSpeed checkpoints and in-memory state resuming
exactly; a non-finite loss or gradient stopping the step with the weights unchanged.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from test_fsdp2 import make_batch, shard, with_log_probs  # next to this file

from temper.algorithms.aggregation import LossAggregator
from temper.cluster.process_group import spawn_ranks
from temper.config.schema import ActorConfig, LoraConfig, ModelConfig, OptimConfig
from temper.data.batch import Batch
from temper.roles.actor import Actor
from temper.training.base import NonFiniteError
from temper.training.micro_batching import MicroBatching
from temper.training.registry import build_engine
from temper.training.spec import EngineSpec
from temper.training.torch_engine import TorchEngine

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow

STAGES: dict[str, dict[str, Any]] = {
    # ROLL's deepspeed_zero.yaml as written: DeepSpeed steps the client optimizer itself
    "zero0": {
        "train_micro_batch_size_per_gpu": "auto",
        "bf16": {"enabled": True},
        "fp16": {
            "enabled": False,
            "loss_scale": 0,
            "initial_scale_power": 16,
            "loss_scale_window": 1000,
            "hysteresis": 2,
            "min_loss_scale": 1,
        },
        "zero_optimization": {"stage": 0},
        "checkpoint": {"tag_validation": "IGNORE"},
    },
    "zero1": {"zero_optimization": {"stage": 1}},
    # ROLL's deepspeed_zero2.yaml as written (its bf16 follows model.dtype: fp32 here)
    "zero2": {
        "train_micro_batch_size_per_gpu": "auto",
        "bf16": {"enabled": True},
        "zero_optimization": {
            "stage": 2,
            "allgather_partitions": True,
            "allgather_bucket_size": 1.0e9,
            "overlap_comm": True,
            "reduce_scatter": True,
            "reduce_bucket_size": 5.0e8,
            "contiguous_gradients": True,
        },
    },
    "zero3": {
        "train_micro_batch_size_per_gpu": "auto",
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
            "stage3_gather_16bit_weights_on_model_save": True,
        },
    },
    "zero3_offload": {
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "offload_param": {"device": "cpu", "pin_memory": True},
        }
    },
}


def actor_config(strategy: str, deepspeed: dict[str, Any] | None = None) -> ActorConfig:
    """Token-budget micro-batches (12 tokens): rank 0 gets 2, rank 1 gets 1 micro-batch,
    so the padding micro-batch path runs; a small grad_clip makes clipping bite; a KL
    loss and an entropy bonus use every output."""
    return ActorConfig(
        strategy=strategy,  # type: ignore[arg-type]
        use_dynamic_bsz=True,
        max_token_len_per_device=12,
        grad_clip=0.05,
        use_kl_loss=True,
        kl_loss_coef=0.1,
        entropy_coeff=0.01,
        deepspeed=deepspeed or {},
        optim=OptimConfig(
            lr=1e-3, weight_decay=0.01, lr_scheduler="linear", total_training_steps=4
        ),
    )


def make_actor(
    path: str, strategy: str, ds: dict[str, Any] | None = None, model: ModelConfig | None = None
) -> Actor:
    cfg = actor_config(strategy, ds)
    spec = EngineSpec(
        model=model or ModelConfig(path=path),
        device=torch.device("cpu"),
        train=cfg,
        infer_micro=MicroBatching(size=1),
        total_steps=4,
    )
    return Actor(cfg, build_engine(strategy, spec))


def frozen_spec(path: str, role: str, ds: dict[str, Any] | None = None) -> EngineSpec:
    return EngineSpec(
        model=ModelConfig(path=path),
        device=torch.device("cpu"),
        infer_micro=MicroBatching(size=2),
        role=role,
        deepspeed=ds,
    )


def value_spec(path: str, ds: dict[str, Any] | None = None) -> EngineSpec:
    cfg = actor_config("deepspeed" if ds is not None else "torch", ds)
    return EngineSpec(
        model=ModelConfig(path=path), device=torch.device("cpu"), kind="value", train=cfg, seed=5
    )


def weights(engine: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.named_weights()}


def pg_loss(engine: Any, mini: Batch, bad: str | None = None):
    """A policy-gradient loss from the global normalizers; ``bad``: the second call
    returns a NaN loss (``nan``), or a finite loss with non-finite gradients (``inf``)."""
    agg = LossAggregator.from_normalizers(
        "token-mean", engine.global_normalizers(mini["response_mask"])
    )
    calls = [0]

    def loss_fn(mb: Batch, out: dict[str, torch.Tensor]):
        calls[0] += 1
        loss = agg(-mb["advantages"] * out["log_probs"], mb["response_mask"])
        if bad == "nan" and calls[0] == 2:
            loss = loss * float("nan")
        if bad == "inf" and calls[0] == 2:  # forward 0, backward 0·(1e30·1e30 = inf)
            big = torch.tensor(1e30)
            loss = loss + (out["log_probs"] * 0.0).sum() * big * big
        return loss, {}

    return loss_fn


def snapshot(state: Any) -> Any:
    """A copy of ``state`` that training on does not change (a torch.save round trip)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


# ----------------------------------------------------------------------- the ranks


def _ranks(rank: int, world: int, path: str, batch: Batch, b2: Batch, tmp: str) -> dict:
    out: dict[str, Any] = {}
    mine, mine2 = shard(batch, rank, world), shard(b2, rank, world)
    first = rank == 0
    for name, ds in STAGES.items():
        actor = make_actor(path, "deepspeed", ds)
        old = actor.compute_log_probs(mine)["old_log_probs"]
        metrics = actor.update(mine)
        out[name] = {"old": old, "metrics": metrics, "weights": weights(actor.engine)}

    # LoRA + gradient checkpointing on ZeRO-3 (adapters gathered with their base layer)
    torch.manual_seed(0)  # LoRA A matrices are drawn from the global RNG
    lora = ModelConfig(
        path=path, lora=LoraConfig(rank=4, alpha=8), enable_gradient_checkpointing=True
    )
    actor = make_actor(path, "deepspeed", STAGES["zero3"], model=lora)
    actor.update(mine)
    out["lora"] = weights(actor.engine)
    actor.engine.save_hf(f"{tmp}/lora")

    # a frozen ZeRO-3 reference (ROLL deepspeed_infer) and a ZeRO-3 value model
    ref = build_engine("deepspeed", frozen_spec(path, "reference", STAGES["zero3"]))
    out["ref"] = ref.forward(mine, with_entropy=True)
    critic = build_engine("deepspeed", value_spec(path, STAGES["zero3"]))
    out["values"] = critic.forward(mine, with_values=True)["values"]
    critic.save_hf(f"{tmp}/critic")

    # DeepSpeed checkpoints (ZeRO-3 + offload) and in-memory state (ZeRO-2): a second
    # engine resumes the first after step 1 and makes the same step 2
    for name, save in (("zero3_offload", "checkpoint"), ("zero2", "state")):
        a = make_actor(path, "deepspeed", STAGES[name])
        a.update(mine)
        state = None
        if save == "checkpoint":
            a.engine.save_checkpoint(f"{tmp}/{name}")
        else:  # live tensors, like nn.Module.state_dict: serialized before training on
            state = snapshot(a.engine.state_dict())
        a.update(mine2)
        b = make_actor(path, "deepspeed", STAGES[name])
        if save == "checkpoint":
            b.engine.load_checkpoint(f"{tmp}/{name}")
        else:
            b.engine.load_state_dict(state)  # type: ignore[arg-type]
        b.update(mine2)
        out[f"resume_{name}"] = (weights(a.engine), weights(b.engine))

    # a non-finite loss in the second micro-batch (gradients of the first already
    # reduced into ZeRO's buffers), or infinite gradients: the step stops, the weights
    # stay, and the next step is the clean one
    for name in ("zero0", "zero2", "zero3"):
        engine = make_actor(path, "deepspeed", STAGES[name]).engine
        before = weights(engine)
        raised = []
        for bad in ("nan", "inf"):
            try:
                engine.train_mini_batch(mine, pg_loss(engine, mine, bad))
            except NonFiniteError as err:
                raised.append(str(err))
        unchanged = weights(engine)
        engine.train_mini_batch(mine, pg_loss(engine, mine))
        out[f"nonfinite_{name}"] = (raised, before, unchanged, weights(engine))
    return out if first else {k: out[k] for k in ("zero1", "ref", "values")}


# ----------------------------------------------------------------------- tests


def assert_weights_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-5, rtol=0, msg=k)


def test_two_deepspeed_ranks_match_the_torch_engine(tiny_path: str, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    single = make_actor(tiny_path, "torch")
    batch = with_log_probs(single, make_batch())
    b2 = with_log_probs(single, make_batch(seed=2))
    before = weights(single.engine)
    ref_metrics = single.update(batch)
    ref_weights = weights(single.engine)
    assert ref_metrics["actor/grad_norm"] > 0.05  # clipping was active

    r0, r1 = spawn_ranks(_ranks, 2, tiny_path, batch, b2, str(tmp_path))

    for name in STAGES:
        got = r0[name]
        old = torch.cat([got["old"], r1[name]["old"]]) if name in r1 else None
        if old is not None:
            torch.testing.assert_close(old, batch["old_log_probs"], atol=1e-6, rtol=1e-6)
        assert got["metrics"].keys() == ref_metrics.keys(), name
        for k, v in ref_metrics.items():
            if k == "actor/packed_fraction":  # a layout choice: the ranks hold fewer rows
                continue
            assert got["metrics"][k] == pytest.approx(v, rel=1e-5, abs=1e-6), (name, k)
        assert_weights_close(got["weights"], ref_weights)
    assert all(not torch.equal(before[k], ref_weights[k]) for k in before)

    # LoRA + checkpointing: the merged weights are the torch engine's; the export loads
    lora = ModelConfig(path=tiny_path, lora=LoraConfig(rank=4, alpha=8))
    torch.manual_seed(0)
    single_lora = make_actor(tiny_path, "torch", model=lora)
    single_lora.update(batch)
    assert_weights_close(r0["lora"], weights(single_lora.engine))
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "lora").state_dict()
    assert_weights_close({k: saved[k] for k in r0["lora"]}, r0["lora"])
    assert (tmp_path / "lora" / "lora_adapter" / "adapter_config.json").is_file()

    # the frozen ZeRO-3 reference = a frozen torch engine
    frozen = TorchEngine(frozen_spec(tiny_path, "reference")).forward(batch, with_entropy=True)
    for key in ("log_probs", "entropy"):
        got = torch.cat([r0["ref"][key], r1["ref"][key]])
        torch.testing.assert_close(got, frozen[key], atol=1e-5, rtol=1e-5)

    # the ZeRO-3 value model's export reloads (backbone + head) with the same values
    again = TorchEngine(
        EngineSpec(
            model=ModelConfig(path=str(tmp_path / "critic")),
            device=torch.device("cpu"),
            kind="value",
        )
    ).forward(batch, with_values=True)["values"]
    torch.testing.assert_close(torch.cat([r0["values"], r1["values"]]), again, atol=1e-6, rtol=1e-5)

    for name in ("zero3_offload", "zero2"):
        straight, resumed = r0[f"resume_{name}"]
        assert all(torch.equal(straight[k], resumed[k]) for k in straight), name

    clean = make_actor(tiny_path, "torch").engine
    clean.train_mini_batch(batch, pg_loss(clean, batch))
    for name in ("zero0", "zero2", "zero3"):
        raised, start, unchanged, after = r0[f"nonfinite_{name}"]
        assert len(raised) == 2, (name, raised)
        assert "loss is nan in micro-batch 1" in raised[0] and "gradient norm" in raised[1]
        assert all(torch.equal(start[k], unchanged[k]) for k in start), name
        assert_weights_close(after, weights(clean))  # nothing of the failed steps left
