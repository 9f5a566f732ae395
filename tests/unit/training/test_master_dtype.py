"""``<role>.master_dtype``: trained weights, their gradients and AdamW's state stored in
bf16; what it costs (updates below bf16's precision are lost); which engines refuse it."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
import torch

from temper.algorithms.aggregation import LossAggregator
from temper.config.errors import ConfigError
from temper.config.schema import ActorConfig
from temper.data.batch import Batch
from temper.pipelines.catalog import build_config, plan
from temper.training.deepspeed_config import (
    BF16_MASTER,
    DeepSpeedFill,
    resolve_deepspeed_config,
)
from temper.training.models import trained_compute_dtype
from temper.training.registry import check_engines, check_master_dtype

from .conftest import make_batch, make_engine

PROMPTS = [7, 3, 5, 1]
RESPONSES = [6, 2, 4, 1]
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


def _pg_loss_fn(mini: Batch):
    agg = LossAggregator.from_mask("token-mean", mini["response_mask"])

    def loss_fn(mb: Batch, out: dict[str, torch.Tensor]):
        loss = agg(-mb["advantages"] * out["log_probs"], mb["response_mask"])
        return loss, {"pg_loss": loss.detach()}

    return loss_fn


def _weights(engine) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in engine.model.named_parameters()}


@pytest.mark.parametrize(
    ("master", "compute", "runs_in"),
    [
        (FP32, FP32, FP32),
        (FP32, BF16, BF16),
        (BF16, FP32, BF16),  # bf16 weights hold only bf16 values: the forward is bf16
        (BF16, BF16, BF16),
        (FP16, FP32, FP16),
        (BF16, FP16, FP16),  # autocast lowers bf16 weights to fp16
    ],
)
def test_compute_dtype_of_a_trained_model(master, compute, runs_in) -> None:
    assert trained_compute_dtype(master, compute) == runs_in


def test_bf16_master_weights_train_every_parameter_in_bf16(tiny_path: str) -> None:
    """Weights, gradients and AdamW's moments are bf16; one update moves every weight
    (lr 1e-2: above half of bf16's spacing at 1.0, so norm weights move too); the
    log-probs agree with fp32 weights to bf16's precision."""
    engine = make_engine(tiny_path, micro=2, lr=1e-2, master_dtype="bf16")
    assert engine.compute_dtype == BF16  # model.dtype auto is fp32 on CPU
    assert {p.dtype for p in engine.model.parameters()} == {BF16}
    batch = make_batch(PROMPTS, RESPONSES)
    exact = make_engine(tiny_path, train=False).forward(batch)["log_probs"]
    got = engine.forward(batch)["log_probs"]
    assert got.dtype == FP32
    torch.testing.assert_close(got, exact, atol=5e-2, rtol=0)

    before = _weights(engine)
    metrics = engine.train_mini_batch(batch, _pg_loss_fn(batch))
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    assert 0 < metrics["grad_norm"] < float("inf")
    for name, p in engine.model.named_parameters():
        assert p.dtype == BF16 and not torch.equal(p.detach(), before[name]), name
    assert engine.optimizer is not None
    moments = [s for s in engine.optimizer.state.values()]
    assert len(moments) == len(before)
    assert {s["exp_avg"].dtype for s in moments} == {BF16}
    assert {s["exp_avg_sq"].dtype for s in moments} == {BF16}


def test_a_bf16_critic_trains_its_value_head_too(tiny_path: str) -> None:
    """A value model (critic.master_dtype bf16): backbone and scalar head in bf16, and
    a value-regression step moves every weight."""
    engine = make_engine(tiny_path, micro=2, lr=1e-2, kind="value", master_dtype="bf16")
    assert {p.dtype for p in engine.model.parameters()} == {BF16}
    batch = make_batch(PROMPTS, RESPONSES)
    before = _weights(engine)

    def loss_fn(mb: Batch, out: dict[str, torch.Tensor]):
        mask = mb["response_mask"]
        loss = ((out["values"] - mb["advantages"]) ** 2 * mask).sum() / mask.sum()
        return loss, {}

    metrics = engine.train_mini_batch(batch, loss_fn)
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    assert all(not torch.equal(p.detach(), before[n]) for n, p in engine.model.named_parameters())


def test_an_update_below_bf16_precision_is_lost(tiny_path: str) -> None:
    """The cost the field's doc names: Adam's first step moves a weight by lr (1e-3);
    norm weights sit at 1.0, where bf16's spacing is 2^-8 below, so in bf16 they stay
    put while fp32 master weights move."""
    batch = make_batch(PROMPTS, RESPONSES)
    moved = {}
    for master in ("fp32", "bf16"):
        engine = make_engine(tiny_path, micro=4, lr=1e-3, master_dtype=master)
        before = _weights(engine)
        engine.train_mini_batch(batch, _pg_loss_fn(batch))
        norms = [n for n in before if "norm" in n]
        assert norms and all(torch.all(before[n] == 1) for n in norms)
        moved[master] = [
            not torch.equal(p.detach(), before[n])
            for n, p in engine.model.named_parameters()
            if n in norms
        ]
    assert all(moved["fp32"]) and not any(moved["bf16"])


def test_bf16_state_round_trip_resumes_identically(tiny_path: str) -> None:
    """Saving after step 1 and loading into a fresh engine gives step 2 bit for bit."""
    batch = make_batch(PROMPTS, RESPONSES, seed=3)
    a = make_engine(tiny_path, lr=1e-2, master_dtype="bf16")
    a.train_mini_batch(batch, _pg_loss_fn(batch))
    saved = copy.deepcopy(a.state_dict())
    m_a = a.train_mini_batch(batch, _pg_loss_fn(batch))
    b = make_engine(tiny_path, lr=1e-2, master_dtype="bf16")
    b.load_state_dict(saved)
    m_b = b.train_mini_batch(batch, _pg_loss_fn(batch))
    assert m_a["loss"] == m_b["loss"] and m_a["grad_norm"] == m_b["grad_norm"]
    for (name, x), (_, y) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(x, y), name


def test_save_hf_writes_bf16_that_transformers_loads(tiny_path: str, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    engine = make_engine(tiny_path, micro=4, lr=1e-2, master_dtype="bf16")
    batch = make_batch(PROMPTS, RESPONSES)
    engine.train_mini_batch(batch, _pg_loss_fn(batch))
    engine.save_hf(str(tmp_path / "hf"))
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    assert {p.dtype for p in reloaded.parameters()} == {BF16}
    mine = dict(engine.model.named_parameters())
    for name, p in reloaded.named_parameters():
        assert torch.equal(p, mine[name]), name


BASE = {"model": {"path": "unused"}, "data": {"train_files": ["task:arithmetic?n=8"]}}


def check(actor: dict[str, Any]) -> None:
    cfg = build_config({**BASE, "actor": actor})
    check_engines(cfg, plan(cfg))


def test_megatron_refuses_half_master_weights_at_load() -> None:
    with pytest.raises(ConfigError) as err:
        check({"strategy": "megatron", "master_dtype": "bf16"})
    assert err.value.key == "actor.master_dtype" and "fp32 main parameters" in err.value.reason
    assert "strategy: fsdp2 or torch" in err.value.fix
    check({"strategy": "megatron", "master_dtype": "fp32"})
    prime = {
        "pipeline": "prime",
        "prime": {"prm": {"strategy": "megatron", "master_dtype": "bf16"}},
    }
    cfg = build_config({**BASE, **prime, "rollout": {"n": 2}})
    with pytest.raises(ConfigError) as err:
        check_engines(cfg, plan(cfg))
    assert err.value.key == "prime.prm.master_dtype"


def test_the_prm_deepspeed_section_is_checked_at_load_too() -> None:
    """PRIME's PRM on DeepSpeed: bf16 master weights at ZeRO stage 0 are refused at check,
    as for the actor (before, only its engine's build refused them)."""
    prime = {"pipeline": "prime", "rollout": {"n": 2}}
    prm = {"strategy": "deepspeed", "master_dtype": "bf16"}
    cfg = build_config({**BASE, **prime, "prime": {"prm": {**prm, "deepspeed": {}}}})
    with pytest.raises(ConfigError) as err:
        check_engines(cfg, plan(cfg))
    assert err.value.key == "prime.prm.master_dtype" and "stage 0" in str(err.value)
    ok = build_config({**BASE, **prime, "prime": {"prm": {**prm, "deepspeed": ZERO2}}})
    check_engines(ok, plan(ok))


ZERO2 = {"zero_optimization": {"stage": 2}}
DS_FILL = DeepSpeedFill(
    role="actor", micro_batch=1, grad_accum=1, world=2, grad_clip=1.0, precision="bf16"
)


def test_deepspeed_bf16_master_weights_are_its_zero_bf16_mode() -> None:
    """master_dtype bf16 turns on DeepSpeed's two switches (off otherwise); a CPU run
    (model.dtype auto = fp32) computes in bf16 with them, so check passes."""
    on = resolve_deepspeed_config(ZERO2, replace(DS_FILL, master="bf16")).config["bf16"]
    off = resolve_deepspeed_config(ZERO2, DS_FILL).config["bf16"]
    for name in BF16_MASTER:
        assert on[name] is True and off.get(name, False) is False
    check({"strategy": "deepspeed", "master_dtype": "bf16", "deepspeed": ZERO2})


@pytest.mark.parametrize(
    ("section", "fill", "key", "words"),
    [
        ({}, {"master": "bf16"}, "actor.master_dtype", "stage 0"),
        (ZERO2, {"master": "fp16"}, "actor.master_dtype", "fp16 master weights"),
        (ZERO2, {"master": "bf16", "precision": "fp16"}, "actor.master_dtype", "bf16 mode"),
        (
            {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
            {"master": "bf16"},
            "actor.master_dtype",
            "DeepSpeedCPUAdam",
        ),
        (
            {**ZERO2, "bf16": {"bf16_master_weights_and_grads": True}},
            {},
            "actor.deepspeed.bf16.bf16_master_weights_and_grads",
            "actor.master_dtype",
        ),
    ],
    ids=["stage0", "fp16", "fp16-compute", "offload", "written-switch"],
)
def test_deepspeed_refuses_what_its_bf16_masters_cannot_do(
    section: dict[str, Any], fill: dict[str, Any], key: str, words: str
) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_deepspeed_config(section, replace(DS_FILL, **fill))
    assert err.value.key == key and words in str(err.value)


def test_torch_and_fsdp2_take_bf16_master_weights() -> None:
    for strategy in ("torch", "fsdp2"):
        check_master_dtype("actor", ActorConfig(master_dtype="bf16"), strategy)
