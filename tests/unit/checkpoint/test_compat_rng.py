"""Config-change judgement on resume, and the RNG round trip."""

from __future__ import annotations

import random

import numpy as np
import torch

from temper.checkpoint import capture_rng, config_changes, restore_rng, rule_for
from temper.config.schema import TemperConfig
from temper.config.typed import from_dict, to_dict


def _cfg(**over):
    base = {"model": {"path": "m"}, "data": {"train_files": ["t.jsonl"]}}
    for section, values in over.items():
        base.setdefault(section, {}).update(values)
    return to_dict(from_dict(TemperConfig, base))


def test_logging_changes_are_harmless():
    changes = config_changes(
        _cfg(), _cfg(experiment={"trackers": ["console", "tensorboard"], "logging_steps": 5})
    )
    assert {c.key for c in changes} == {"experiment.trackers", "experiment.logging_steps"}
    assert all(c.rule.kind == "harmless" for c in changes)


def test_model_batch_and_algorithm_changes_change_the_meaning():
    changes = config_changes(
        _cfg(),
        _cfg(
            model={"path": "other"},
            data={"train_batch_size": 16},
            algorithm={"adv_estimator": "rloo"},
            actor={"micro_batch_size_per_device": 4, "mini_batch_size": 32},
        ),
    )
    kinds = {c.key: c.rule.kind for c in changes}
    assert kinds == {
        "model.path": "meaning",
        "data.train_batch_size": "meaning",
        "algorithm.adv_estimator": "meaning",
        "actor.mini_batch_size": "meaning",
        "actor.micro_batch_size_per_device": "harmless",
    }


def test_rules_match_by_longest_prefix_and_default_to_meaning():
    assert rule_for("data.val_files").kind == "harmless"
    assert rule_for("data.train_files").kind == "meaning"
    assert rule_for("rollout.val.temperature").kind == "harmless"
    assert rule_for("rollout.n").kind == "meaning"
    assert rule_for("reference.enable").kind == "meaning"
    assert rule_for("reference.param_offload").kind == "harmless"
    assert rule_for("brand_new_section.key").kind == "meaning"


def test_rng_round_trip_reproduces_every_stream():
    state = capture_rng()
    first = (random.random(), np.random.rand(), torch.rand(3))
    restore_rng(state)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert first[0] == again[0] and first[1] == again[1] and torch.equal(first[2], again[2])


def test_rng_state_loads_with_weights_only(tmp_path):
    torch.save(capture_rng(), tmp_path / "rng.pt")
    expected = (random.random(), np.random.rand(), torch.rand(2))
    restore_rng(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert (random.random(), np.random.rand()) == expected[:2]
    assert torch.equal(torch.rand(2), expected[2])
