"""PRIME's implicit PRM on a tiny model: at the start it is its reference (q = 0, the loss
log 2); ``update: none`` never moves it, ``after`` scores with the weights the update
starts from, ``before`` with the trained ones; a cross-entropy step moves every weight and
raises the sequence score of the correct responses relative to the wrong ones."""

from __future__ import annotations

import math

import pytest
import torch

from temper.roles.builder import build_prm
from temper.roles.prm import ACC, LOGP, REF, score_and_update

from .conftest import PROMPTS, RESPONSES, make_batch, make_config


def _setup(path: str, update: str, lr: float = 1e-2):
    cfg = make_config(path)
    cfg.pipeline = "prime"
    cfg.rollout.n = 2
    cfg.prime.prm.update = update  # type: ignore[assignment]
    cfg.prime.prm.optim.lr = lr
    cfg.prime.prm.micro_batch_size_per_device = 2
    cfg.prime.prm.beta_train = 0.5
    prm = build_prm(cfg, torch.device("cpu"))
    prm.set_total_steps(10)
    batch = make_batch(PROMPTS, RESPONSES)
    batch["scores"] = torch.tensor([1.0, 0.0, 1.0, 0.0])
    return cfg, prm, batch


def _weights(prm) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in prm.engine.named_weights()}


def test_none_scores_zero_against_its_reference_and_never_moves(tiny_path) -> None:
    cfg, prm, batch = _setup(tiny_path, "none")
    before = _weights(prm)
    out, metrics = score_and_update(prm, cfg.prime, batch, 2)
    assert out["rm_scores"].abs().max().item() == pytest.approx(0.0, abs=1e-6)
    assert "reward_model/dpo_loss" not in metrics and prm.updates == 0
    after = _weights(prm)
    assert all(torch.equal(before[n], after[n]) for n in before)


def test_after_scores_with_the_starting_weights_before_with_the_trained(tiny_path) -> None:
    cfg, prm, batch = _setup(tiny_path, "after")
    out, metrics = score_and_update(prm, cfg.prime, batch, 2)
    assert out["rm_scores"].abs().max().item() == pytest.approx(0.0, abs=1e-6)
    assert metrics["reward_model/dpo_loss"] == pytest.approx(math.log(2), abs=1e-5)
    cfg, prm, batch = _setup(tiny_path, "before")
    before = _weights(prm)
    out, metrics = score_and_update(prm, cfg.prime, batch, 2)
    assert metrics["reward_model/dpo_loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert out["rm_scores"].abs().max().item() > 0  # the trained PRM differs from π_ref
    after = _weights(prm)
    unchanged = [n for n in before if torch.equal(before[n], after[n])]
    assert not unchanged, unchanged


def test_training_separates_correct_from_wrong_responses(tiny_path) -> None:
    cfg, prm, batch = _setup(tiny_path, "before", lr=1e-3)
    work = prm.compute_ref_log_probs(batch)
    work[ACC] = batch["scores"]
    for _ in range(5):
        prm.update(work)
    q = (prm.compute_log_probs(work)[LOGP] - work[REF]) * batch["response_mask"]
    seq = q.sum(-1)
    assert seq[[0, 2]].mean() > seq[[1, 3]].mean()
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        batch["scores"] = torch.tensor([2.0, 0.0, 1.0, 0.0])
        score_and_update(prm, cfg.prime, batch, 2)
