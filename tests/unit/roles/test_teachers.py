"""On-policy distillation's teachers: frozen models on their own weights, each scoring
only the samples whose data tag routes to it."""

from __future__ import annotations

import pytest
import torch

from temper.config.schema import TeacherConfig
from temper.config.validate import validate
from temper.pipelines.catalog import CATALOG
from temper.roles import build_roles
from temper.utils.tiny import make_tiny_model

from .conftest import PROMPTS, RESPONSES, make_batch, make_config
from .test_roles import base_log_probs


@pytest.fixture(scope="module")
def other_tiny(tmp_path_factory) -> str:
    """A second tiny model with the same tokenizer and other weights (another seed, size)."""
    return str(make_tiny_model(tmp_path_factory.mktemp("teacher"), hidden_size=32, seed=7))


def test_each_sample_is_scored_by_the_teachers_its_tag_names(tiny_path, other_tiny) -> None:
    cfg = make_config(tiny_path)
    cfg.distill.teachers = {
        "math": TeacherConfig(model_path=tiny_path, tags=["math"]),
        "code": TeacherConfig(model_path=other_tiny, tags=["code"]),
        "all": TeacherConfig(model_path=other_tiny),  # no tags: every sample
    }
    roles = build_roles(cfg, validate(cfg, CATALOG), "cpu")
    assert roles.teachers is not None and roles.teachers.names == ["math", "code", "all"]
    batch = make_batch(PROMPTS, RESPONSES, seed=3)
    batch["tag"] = ["math", "code", "math", "chat"]
    out = roles.teachers.compute_teacher_log_probs(batch)
    routed = out["teacher_routed"]
    assert routed.tolist() == [
        [True, False, True],
        [False, True, True],
        [True, False, True],
        [False, False, True],
    ]
    scored = out["teacher_log_probs"]
    own = {"math": base_log_probs(tiny_path, batch), "code": base_log_probs(other_tiny, batch)}
    own["all"] = own["code"]
    assert not torch.allclose(own["math"], own["code"])  # two different models
    mask = batch["response_mask"].bool()
    for t, name in enumerate(["math", "code", "all"]):
        for b in range(len(batch)):
            if routed[b, t]:
                torch.testing.assert_close(
                    scored[b, t][mask[b]], own[name][b][mask[b]], atol=1e-5, rtol=0
                )
            else:
                assert not scored[b, t].any()  # a teacher not routed to it never ran on it


def test_teachers_give_their_top_k_log_probs_on_their_own_samples(tiny_path, other_tiny) -> None:
    """``topk`` (distill.topk): each routed teacher's top-k ids and log-probs, the
    log-softmax at the batch's temperature, top-k of it; zeros where not routed."""
    cfg = make_config(tiny_path)
    cfg.distill.teachers = {
        "math": TeacherConfig(model_path=tiny_path, tags=["math"]),
        "code": TeacherConfig(model_path=other_tiny, tags=["code"]),
    }
    roles = build_roles(cfg, validate(cfg, CATALOG), "cpu")
    assert roles.teachers is not None
    batch = make_batch(PROMPTS, RESPONSES, seed=3)
    batch["tag"] = ["math", "code", "math", "code"]
    batch.meta["temperature"] = 0.5
    out = roles.teachers.compute_teacher_log_probs(batch, topk=3, vocab=40)
    ids, lp = out["teacher_topk_ids"], out["teacher_topk_log_probs"]
    assert ids.shape == lp.shape == (4, 2, batch["response_ids"].shape[1], 3)
    mask = batch["response_mask"].bool()
    for b in range(4):
        t = 0 if b % 2 == 0 else 1
        assert not lp[b, 1 - t].any() and not ids[b, 1 - t].any()  # not routed: never ran
        got = lp[b, t][mask[b]]
        assert (got <= 0).all() and int(ids[b, t][mask[b]].max()) < 40
        assert (got[:, :-1] >= got[:, 1:]).all()  # most likely first
        # the top-k of a distribution of 40 ids holds at most all of its mass
        assert (got.exp().sum(-1) <= 1 + 1e-5).all()
