"""Seeded, epoch-aware sampling; exact resume; drop_last; weighted sampling by tag."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.data import DataError, PromptSampler, build_sampler


def _take(sampler, n):
    return [sampler.next() for _ in range(n)]


def test_seeded_and_epoch_permutations():
    a = _take(PromptSampler(10, 5, seed=1), 4)
    b = _take(PromptSampler(10, 5, seed=1), 4)
    c = _take(PromptSampler(10, 5, seed=2), 4)
    assert a == b and a != c
    assert sorted(a[0].indices + a[1].indices) == list(range(10))  # epoch 0: each once
    assert sorted(a[2].indices + a[3].indices) == list(range(10))  # epoch 1: each once
    assert a[0].indices + a[1].indices != a[2].indices + a[3].indices  # reshuffled
    assert [d.epoch for d in a] == [0, 0, 1, 1]
    assert a[2].uids == [f"1-{i}" for i in a[2].indices]


def test_no_shuffle_is_dataset_order():
    draws = _take(PromptSampler(6, 3, shuffle=False), 3)
    assert [d.indices for d in draws] == [[0, 1, 2], [3, 4, 5], [0, 1, 2]]


def test_drop_last():
    s = PromptSampler(10, 4, seed=0, drop_last=True)
    assert s.batches_per_epoch == 2
    draws = _take(s, 2)
    assert all(len(d.indices) == 4 for d in draws) and s.epoch == 1
    assert len(set(draws[0].indices + draws[1].indices)) == 8
    keep = PromptSampler(10, 4, seed=0, drop_last=False)
    assert keep.batches_per_epoch == 3
    assert [len(d.indices) for d in _take(keep, 4)] == [4, 4, 2, 4]
    assert keep.epoch == 1
    with pytest.raises(DataError, match="fewer than one batch"):
        PromptSampler(3, 4, drop_last=True)


@pytest.mark.parametrize("weights", [None, {"a": 0.7, "b": 0.3}])
def test_resume_continues_exactly(weights):
    tags = ["a"] * 7 + ["b"] * 4
    first = PromptSampler(11, 4, seed=3, tags=tags, source_weights=weights)
    _take(first, 3)
    state = json.loads(json.dumps(first.state_dict()))  # survives a JSON checkpoint
    expected = _take(first, 3)
    resumed = PromptSampler(11, 4, seed=3, tags=tags, source_weights=weights)
    resumed.load_state_dict(state)
    assert _take(resumed, 3) == expected
    assert resumed.epoch == first.epoch and resumed.batches_drawn == 6


def test_resume_refuses_other_data():
    state = PromptSampler(10, 2, seed=0).state_dict()
    with pytest.raises(DataError, match="num_prompts"):
        PromptSampler(12, 2, seed=0).load_state_dict(state)


def test_source_weights():
    tags = ["a"] * 50 + ["b"] * 50 + ["c"] * 10
    s = PromptSampler(110, 20, seed=0, tags=tags, source_weights={"a": 0.8, "b": 0.2, "c": 0})
    draws = _take(s, 20)
    counts = Counter(tags[i] for d in draws for i in d.indices)
    assert counts["c"] == 0 and 0.72 < counts["a"] / 400 < 0.88
    assert all(len(d.indices) == 20 and len(set(d.uids)) == 20 for d in draws)
    again = PromptSampler(110, 20, seed=0, tags=tags, source_weights={"a": 0.8, "b": 0.2, "c": 0})
    assert _take(again, 20) == draws
    assert s.epoch == 400 // 110
    with pytest.raises(ConfigError, match="'?z'? do not occur|z do not occur"):
        PromptSampler(110, 20, tags=tags, source_weights={"a": 1, "b": 1, "c": 1, "z": 1})
    with pytest.raises(ConfigError, match="c have prompts but no weight"):
        PromptSampler(110, 20, tags=tags, source_weights={"a": 1, "b": 1})


def test_build_sampler_from_config():
    cfg = TemperConfig()
    cfg.experiment.seed = 5
    cfg.data.train_batch_size = 2
    s = build_sampler(cfg, 6)
    assert s.batch_size == 2 and s.seed == 5 and s.drop_last and not s.weighted
