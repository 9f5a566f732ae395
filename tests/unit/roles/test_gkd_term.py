"""The actor's direct-gradient (GKD) term: the student's ids for the update's forward,
and the term of a micro-batch against a full-vocabulary computation, value and gradient."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from temper.algorithms.aggregation import LossAggregator
from temper.config.schema import TeacherConfig
from temper.config.validate import validate
from temper.data.batch import Batch
from temper.pipelines.catalog import CATALOG
from temper.roles import build_roles
from temper.roles.gkd_term import DirectDistill, direct_distill_loss, with_student_ids
from temper.roles.teacher import TOPK_IDS, TOPK_LOG_PROBS
from temper.training.micro_batching import KD_INDICES, KD_LOGITS

from .conftest import PROMPTS, RESPONSES, make_batch, make_config


def test_student_ids_are_every_teachers_top_k_then_the_sampled_token() -> None:
    ids = torch.tensor([[[[1, 2], [3, 4]], [[5, 6], [7, 8]]]])  # (B=1, T=2, R=2, k=2)
    batch = Batch.from_dict({TOPK_IDS: ids, "response_ids": torch.tensor([[9, 0]])})
    out = with_student_ids(batch, DirectDistill(coefs=(1.0, 1.0), topk=2))
    assert out[KD_INDICES].tolist() == [[[1, 2, 5, 6, 9], [3, 4, 7, 8, 0]]]
    plain = Batch.from_dict({"response_ids": torch.tensor([[9, 0]])})
    assert KD_INDICES not in with_student_ids(plain, DirectDistill(coefs=(1.0,)))


def _case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b, r, v, k, temperature = 2, 3, 7, 3, 0.5
    logits = torch.randn(b, r, v, generator=g, requires_grad=True)
    sampled = torch.randint(0, v, (b, r), generator=g)
    teacher = torch.log_softmax(torch.randn(b, 2, r, v, generator=g) / temperature, -1)
    top_lp, top_ids = teacher.topk(k, dim=-1)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    routed = torch.tensor([[True, False], [True, True]])
    return logits, sampled, teacher, top_lp, top_ids, mask, routed, temperature


def test_top_k_term_equals_the_full_softmax_forward_kl_with_its_gradient() -> None:
    logits, sampled, _, top_lp, top_ids, mask, routed, temperature = _case()
    spec = DirectDistill(coefs=(0.5, 2.0), topk=3, max_value=10.0)
    batch = Batch.from_dict(
        {
            TOPK_IDS: top_ids,
            TOPK_LOG_PROBS: top_lp,
            "response_ids": sampled,
            "response_mask": mask,
            "teacher_routed": routed,
        }
    )
    batch = with_student_ids(batch, spec)
    full = torch.log_softmax(logits / temperature, -1)
    out = {
        "log_probs": full.gather(-1, sampled.unsqueeze(-1)).squeeze(-1),
        KD_LOGITS: logits.gather(-1, batch[KD_INDICES]),
    }
    agg = LossAggregator.from_mask("token-mean", mask)
    loss, metrics = direct_distill_loss(spec, batch, out, agg, temperature)
    want = torch.zeros(2, 3)
    for t, coef in enumerate(spec.coefs):
        student = full.gather(-1, top_ids[:, t])
        fkl = (top_lp[:, t].exp() * (top_lp[:, t] - student)).sum(-1).clamp(min=0)
        want = want + coef * routed[:, t, None].float() * fkl
    want = (want * mask).sum() / mask.sum()
    torch.testing.assert_close(loss, want)
    assert metrics["distill_loss"] == loss.detach()
    (g_loss,) = torch.autograd.grad(loss, logits, retain_graph=True)
    (g_want,) = torch.autograd.grad(want, logits)
    torch.testing.assert_close(g_loss, g_want)


def test_sampled_k3_term_routes_weights_and_masks() -> None:
    log_probs = torch.tensor([[math.log(0.5), -1.0]], requires_grad=True)
    teacher = torch.tensor([[[math.log(0.25), -1.0]], [[0.0, 0.0]]]).transpose(0, 1)
    batch = Batch.from_dict(
        {
            "teacher_log_probs": teacher,  # (1, T=2, R=2); teacher 1 is not routed
            "response_mask": torch.tensor([[1.0, 1.0]]),
            "teacher_routed": torch.tensor([[True, False]]),
        }
    )
    spec = DirectDistill(coefs=(3.0, 100.0), estimator="k3")
    agg = LossAggregator.from_mask("token-mean", batch["response_mask"])
    loss, _ = direct_distill_loss(spec, batch, {"log_probs": log_probs}, agg, 1.0)
    # 3 · (k3 = 0.5 + log 2 − 1 on the first token, 0 on the second) / 2 tokens
    torch.testing.assert_close(loss, torch.tensor(3.0 * (math.log(2.0) - 0.5) / 2))
    loss.backward()
    assert log_probs.grad is not None
    torch.testing.assert_close(log_probs.grad, torch.tensor([[3.0 * 0.5 / 2, 0.0]]))


def test_actor_gkd_update_is_micro_batch_invariant(tiny_path: str) -> None:
    """The term uses the mini-batch's normalizers: 1×4, 4×1 and a token budget agree on
    the loss, the term and the updated weights (top-k mode, two teachers, one routed to
    half the samples)."""
    batch = make_batch(PROMPTS, RESPONSES, seed=1)
    b, r = batch["response_ids"].shape
    g = torch.Generator().manual_seed(0)
    teacher = torch.log_softmax(torch.randn(b, 2, r, 64, generator=g), -1)
    top_lp, top_ids = teacher.topk(4, dim=-1)
    results = []
    for micro, budget in ((4, None), (1, None), (1, 11)):
        cfg = make_config(tiny_path)
        cfg.actor.loss_agg_mode = "seq-mean-token-mean"
        cfg.actor.micro_batch_size_per_device = micro
        cfg.actor.optim.eps = 1.0  # update linear in the gradient (see engine test)
        cfg.distill.teachers = {"a": TeacherConfig(tiny_path, 0.5), "b": TeacherConfig(tiny_path)}
        cfg.distill.direct_gradient, cfg.distill.topk = True, 4
        plan = dataclasses.replace(validate(cfg, CATALOG), use_reference=False)
        cfg.actor.use_dynamic_bsz = budget is not None
        cfg.actor.max_token_len_per_device = budget or 16384
        actor = build_roles(cfg, plan, "cpu").actor
        work = actor.compute_log_probs(batch)
        work[TOPK_IDS], work[TOPK_LOG_PROBS] = top_ids, top_lp
        work["teacher_routed"] = torch.tensor([[True, True], [True, False]] * (b // 2))
        work["advantages"] = torch.zeros(b, r)
        metrics = actor.update(work)
        assert metrics["actor/distill_loss"] > 0
        results.append((metrics, dict(actor.engine.model.named_parameters())))
    m0, w0 = results[0]
    for m, w in results[1:]:
        for key in ("actor/loss", "actor/distill_loss", "actor/grad_norm"):
            assert m[key] == pytest.approx(m0[key], rel=1e-5, abs=1e-7), key
        for name, p in w.items():
            torch.testing.assert_close(p, w0[name], atol=1e-8, rtol=0, msg=name)
