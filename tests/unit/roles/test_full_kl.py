"""The exact KL over the vocabulary (``kl_loss_type`` / ``kl_penalty: full``) end to end in
the roles: what the actor's engine computes equals ``torch.distributions.kl_divergence``
of the two models' next-token distributions, and the KL loss trains."""

from __future__ import annotations

import pytest
import torch
from torch.distributions import Categorical, kl_divergence

from temper.config.errors import ConfigError
from temper.config.schema import LoraConfig
from temper.config.validate import validate
from temper.data.batch import Batch
from temper.pipelines.catalog import CATALOG
from temper.roles import build_roles

from .conftest import PROMPTS, RESPONSES, make_batch, make_config

TEMPERATURE = 0.8


def response_logits(model: torch.nn.Module, batch: Batch, i: int) -> torch.Tensor:
    """Row ``i``'s logits at the positions that score its response tokens, unpadded."""
    prompt = batch["prompt_ids"][i][batch["prompt_mask"][i] > 0]
    n = int(batch["response_mask"][i].sum())
    ids = torch.cat([prompt, batch["response_ids"][i][:n]])[None]
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    return logits[len(prompt) - 1 : len(prompt) - 1 + n]


@pytest.mark.parametrize("lora", [False, True], ids=["own-reference", "lora-reference"])
def test_actor_full_kl_matches_torch_distributions_and_the_loss_trains(tiny_path, lora):
    cfg = make_config(tiny_path)
    cfg.rollout.temperature = TEMPERATURE
    cfg.actor.use_kl_loss, cfg.actor.kl_loss_type, cfg.actor.kl_loss_coef = True, "full", 0.5
    if lora:
        cfg.model.lora = LoraConfig(rank=4, alpha=8)
    roles = build_roles(cfg, validate(cfg, CATALOG), "cpu")
    assert roles.reference is not None
    batch = make_batch(PROMPTS, RESPONSES, seed=5)
    batch.meta["temperature"] = TEMPERATURE
    first = roles.reference.compute_ref_log_probs(roles.actor.compute_log_probs(batch))
    assert first["full_kl"].abs().max() < 1e-5  # the actor starts as the reference
    roles.actor.update(first)  # the policy moves away
    moved = roles.reference.compute_ref_log_probs(roles.actor.compute_log_probs(batch))
    actor_model = roles.actor.engine.model
    assert actor_model is not None
    for i in range(len(batch)):
        mine = response_logits(actor_model, batch, i)
        if lora:
            with actor_model.disable_adapter():  # type: ignore[operator]
                ref = response_logits(actor_model, batch, i)
        else:
            ref_model = roles.reference.engine.model
            assert ref_model is not None
            ref = response_logits(ref_model, batch, i)
        want = kl_divergence(
            Categorical(logits=mine / TEMPERATURE), Categorical(logits=ref / TEMPERATURE)
        )
        n = len(want)
        torch.testing.assert_close(moved["full_kl"][i, :n], want, atol=1e-5, rtol=1e-4)
        assert (moved["full_kl"][i, n:] == 0).all()
    assert moved["full_kl"].sum() > 0
    metrics = roles.actor.update(moved)  # the exact KL is now a loss with a gradient
    assert metrics["actor/kl_loss"] > 0 and torch.isfinite(torch.tensor(metrics["actor/loss"]))
    assert metrics["actor/kl"] == pytest.approx(
        (moved["full_kl"] * batch["response_mask"]).sum().item()
        / batch["response_mask"].sum().item(),
        rel=0.2,  # the first optimizer step of this update moves it a little
    )


def test_full_kl_in_the_reward_comes_with_the_old_log_probs(tiny_path):
    cfg = make_config(tiny_path)
    cfg.algorithm.use_kl_in_reward, cfg.algorithm.kl_penalty = True, "full"
    roles = build_roles(cfg, validate(cfg, CATALOG), "cpu")
    out = roles.actor.compute_log_probs(make_batch(PROMPTS, RESPONSES, seed=6))
    assert out["full_kl"].shape == out["old_log_probs"].shape


def test_full_kl_needs_an_engine_that_compares_logits(tiny_path, monkeypatch):
    from temper.training.torch_engine import TorchEngine

    monkeypatch.setattr(TorchEngine, "supports_full_kl", False)
    cfg = make_config(tiny_path)
    cfg.actor.use_kl_loss, cfg.actor.kl_loss_type = True, "full"
    with pytest.raises(ConfigError, match="actor.kl_loss_type"):
        build_roles(cfg, validate(cfg, CATALOG), "cpu")
