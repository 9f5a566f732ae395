"""Online DPO (pipeline spin): the pairs a step forms from its samples, and the
reference refreshed from the actor's weights — after the refresh its log-probs are the
actor's, and a checkpoint's copy rebuilds the same reference in a fresh run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from temper.algorithms.preference import PreferenceParams
from temper.config.errors import ConfigError
from temper.config.validate import validate
from temper.data.batch import Batch
from temper.pipelines.catalog import CATALOG
from temper.pipelines.spin import check, pair_rows
from temper.pipelines.spin_reference import ReferenceRefresh, refresh_due
from temper.roles import build_roles
from temper.roles.reference import Reference

from .conftest import make_batch, make_config


def _spin_config(path: str, freq: int = 2):
    cfg = make_config(path)
    cfg.pipeline = "spin"
    cfg.algorithm.adv_estimator = "grpo"
    cfg.data.train_files = ["task:arithmetic?n=8"]
    cfg.data.train_batch_size = 2
    cfg.rollout.n = 2
    cfg.spin.ref_update_freq = freq
    return cfg


def test_pair_rows_reorders_chosen_then_rejected_by_hand() -> None:
    """Samples of 2 prompts × 2 responses: prompt 0's second response scored higher, prompt
    1's tie keeps its first; the ``chosen`` column alternates 1, 0."""
    batch = make_batch([7, 3, 5, 1], [6, 2, 4, 1])
    batch["scores"] = torch.tensor([0.0, 1.0, 0.5, 0.5])
    batch.objects["uid"] = ["a", "a", "b", "b"]
    pairs, metrics = pair_rows(batch)
    assert pairs["chosen"].tolist() == [1, 0, 1, 0]
    assert pairs["scores"].tolist() == [1.0, 0.0, 0.5, 0.5]
    assert pairs["uid"] == ["a", "a", "b", "b"]
    assert torch.equal(pairs["response_ids"][0], batch["response_ids"][1])
    assert metrics == {"train/ties": 0.5}


def test_refresh_is_due_at_multiples_of_the_frequency() -> None:
    assert [g for g in range(1, 8) if refresh_due(g, 3)] == [3, 6]
    assert all(refresh_due(g, 1) for g in range(1, 4))
    assert not any(refresh_due(g, 0) for g in range(1, 4))


def test_refreshed_reference_scores_as_the_actor_and_restores_from_its_state(
    tiny_path: str, tmp_path: Path
) -> None:
    cfg = _spin_config(tiny_path)
    roles = build_roles(cfg, validate(cfg, CATALOG), "cpu")
    assert isinstance(roles.reference, Reference)
    batch = make_batch([7, 3, 5, 1], [6, 2, 4, 1])
    batch["chosen"] = torch.tensor([1, 0, 1, 0])
    batch = roles.reference.compute_ref_log_probs(batch)
    initial = batch["ref_log_probs"].clone()
    roles.actor.dpo_update(batch, "sigmoid", PreferenceParams(beta=0.5))
    actor = roles.actor.compute_log_probs(batch)["old_log_probs"]
    assert not torch.equal(actor, initial)  # the update moved the policy

    refresh = ReferenceRefresh(cfg, roles.actor, roles.reference, tmp_path)
    assert not refresh.maybe_refresh(1)  # 1 % 2: not due; the reference is the initial one
    assert torch.equal(roles.reference.compute_ref_log_probs(batch)["ref_log_probs"], initial)
    assert refresh.maybe_refresh(2)
    refreshed = roles.reference.compute_ref_log_probs(batch)["ref_log_probs"]
    assert torch.equal(refreshed, actor)

    # a fresh run's reference, loaded from the checkpointed state, is the refreshed one
    state = refresh.state_dict()
    assert state["refreshed_at"] == 2 and "model.safetensors" in state["files"]
    fresh = build_roles(cfg, validate(cfg, CATALOG), "cpu")
    assert isinstance(fresh.reference, Reference)
    again = ReferenceRefresh(cfg, fresh.actor, fresh.reference, tmp_path / "b")
    again.load_state_dict(state)
    assert torch.equal(fresh.reference.compute_ref_log_probs(batch)["ref_log_probs"], refreshed)
    # and a state from before any refresh leaves the initial reference
    fresh_too = build_roles(cfg, validate(cfg, CATALOG), "cpu")
    assert isinstance(fresh_too.reference, Reference)
    ReferenceRefresh(cfg, fresh_too.actor, fresh_too.reference, tmp_path / "c").load_state_dict(
        {"refreshed_at": 0}
    )
    assert torch.equal(fresh_too.reference.compute_ref_log_probs(batch)["ref_log_probs"], initial)


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"rollout.n": 1, "data.train_batch_size": 3}, "rollout.n"),
        ({"actor.mini_batch_size": 3}, "actor.mini_batch_size"),
        ({"model.lora.rank": 4}, "model.lora.rank"),
        ({"actor.use_kl_loss": True}, "actor.use_kl_loss"),
        ({"actor.clip_ratio": 0.3}, "actor.clip_ratio"),
        ({"experiment.critic_warmup": 2}, "experiment.critic_warmup"),
        ({"dpo.beta": 0.3}, "dpo.beta"),
        ({"algorithm.adv_estimator": "gae"}, "algorithm.adv_estimator"),
        ({"spin.loss_type": "hinge"}, "spin.loss_type"),
        ({"spin.loss_type": "ipo", "spin.label_smoothing": 0.1}, "spin.label_smoothing"),
        ({"spin.ref_update_freq": -1}, "spin.ref_update_freq"),
        ({"reference.enable": False}, "reference.enable"),
    ],
)
def test_check_refuses_what_online_dpo_cannot_honour(tiny_path: str, change, key) -> None:
    cfg = _spin_config(tiny_path)
    for dotted, value in change.items():
        *parents, leaf = dotted.split(".")
        node = cfg
        for part in parents:
            node = getattr(node, part)
        setattr(node, leaf, value)
    with pytest.raises(ConfigError) as err:
        check(cfg)
    assert err.value.key == key


def test_check_passes_lora_with_a_fixed_reference_and_rollout_n_1(tiny_path: str) -> None:
    cfg = _spin_config(tiny_path, freq=0)
    cfg.model.lora.rank = 4
    check(cfg)  # a fixed reference needs no reload: the LoRA base serves
    cfg = _spin_config(tiny_path)
    cfg.rollout.n = 1  # verl's run_spin.sh: pairs across two prompts (preflight notes it)
    check(cfg)


def test_pair_rows_keeps_every_tensor_aligned() -> None:
    batch = Batch.from_dict({"scores": torch.tensor([2.0, 1.0]), "x": torch.tensor([[1], [2]])})
    pairs, _ = pair_rows(batch)
    assert pairs["x"].tolist() == [[1], [2]] and pairs["chosen"].tolist() == [1, 0]
