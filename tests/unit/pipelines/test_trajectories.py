"""Trajectories → training rows: tensors, objects, metrics (their rewards: test_shaping)."""

from __future__ import annotations

import pytest
import torch

from temper.pipelines.trajectories import episode_metrics

PAD = 0  # the pad id of the `episodes` fixture (conftest.py)


def test_rows_masks_and_objects(episodes):
    assert episodes["prompt_ids"].tolist() == [[1, 2, 3], [1, 2, 3], [PAD, 4, 5]]
    assert episodes["prompt_mask"].tolist() == [[1, 1, 1], [1, 1, 1], [0, 1, 1]]
    assert episodes["response_mask"][0].tolist() == [1, 1, 0, 0, 1, 1, 1, 0, 0]
    assert episodes["response_mask"][2].tolist() == [1, 1, 0, 0, 1, 1, 0, 0, 1]
    # observations are attended to (context), padding is not
    assert episodes["attention_mask"][0].tolist() == [1] * 3 + [1] * 7 + [0] * 2
    lp = episodes["rollout_log_probs"]
    assert torch.equal(lp != 0, episodes["response_mask"].bool())
    assert episodes["uid"] == ["g0", "g0", "g1"] and episodes["tag"] == ["A", "A", "B"]
    assert episodes["episode_return"] == [1.0, 0.0, 0.0]
    assert episodes["scores"].tolist() == [1.0, 0.0, 0.0]
    assert episodes["success"] == [True, False, False]
    assert episodes["num_turns"] == [2, 1, 3] and episodes["invalid_actions"] == [0, 1, 0]


def test_episode_metrics(episodes):
    m = episode_metrics(episodes, "train")
    assert m["train/success_rate"] == pytest.approx(1 / 3)
    assert m["env/A/success_rate"] == 0.5 and m["env/B/success_rate"] == 0.0
    assert m["env/num_turns_mean"] == 2.0 and m["env/invalid_action_rate"] == pytest.approx(1 / 6)
    v = episode_metrics(episodes, "val")
    assert "val/env/A/success_rate" in v and v["val/reward_mean"] == pytest.approx(1 / 3)
