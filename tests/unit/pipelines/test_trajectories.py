"""Trajectories → training rows: tensors, reward placement, normalization, discounting."""

from __future__ import annotations

import pytest
import torch

from temper.config.schema import AgenticConfig, AlgorithmConfig, RewardNormalizationConfig
from temper.pipelines.experience import ShapingState
from temper.pipelines.trajectories import (
    agentic_experience,
    episode_metrics,
    place_rewards,
    trajectory_batch,
)
from temper.rollout.multiturn import Trajectory

PAD = 0


def traj(uid, tag, prompt, turns, rewards, success=False, invalid=0):
    """A trajectory whose model turns have the given lengths, 2 observation tokens between."""
    t = Trajectory({"uid": uid, "tag": tag}, [], list(prompt))
    for k, (n, r) in enumerate(zip(turns, rewards)):
        if k:
            t.append([7, 7], 0)
        t.append(list(range(10, 10 + n)), 1, [-0.5] * n)
        t.turn_ends.append(len(t.response_ids) - 1)
        t.turn_rewards.append(r)
        last = k == len(turns) - 1
        t.infos.append({"success": success and last, "format_ok": k >= invalid})
    t.stop_reason = "done"
    return t


@pytest.fixture
def batch():
    return trajectory_batch(
        [
            traj("g0", "A", [1, 2, 3], [2, 3], [0.0, 1.0], success=True),
            traj("g0", "A", [1, 2, 3], [1], [0.0], invalid=1),
            traj("g1", "B", [4, 5], [2, 2, 1], [0.5, 0.5, -1.0]),
        ],
        PAD,
    )


def test_rows_masks_and_objects(batch):
    assert batch["prompt_ids"].tolist() == [[1, 2, 3], [1, 2, 3], [PAD, 4, 5]]
    assert batch["prompt_mask"].tolist() == [[1, 1, 1], [1, 1, 1], [0, 1, 1]]
    assert batch["response_mask"][0].tolist() == [1, 1, 0, 0, 1, 1, 1, 0, 0]
    assert batch["response_mask"][2].tolist() == [1, 1, 0, 0, 1, 1, 0, 0, 1]
    # observations are attended to (context), padding is not
    assert batch["attention_mask"][0].tolist() == [1] * 3 + [1] * 7 + [0] * 2
    lp = batch["rollout_log_probs"]
    assert torch.equal(lp != 0, batch["response_mask"].bool())
    assert batch["uid"] == ["g0", "g0", "g1"] and batch["tag"] == ["A", "A", "B"]
    assert batch["episode_return"] == [1.0, 0.0, 0.0]
    assert batch["success"] == [True, False, False]
    assert batch["num_turns"] == [2, 1, 3] and batch["invalid_actions"] == [0, 1, 0]


def cfg(grouping="batch", method="identity", turns=False):
    return AgenticConfig(
        reward_normalization=RewardNormalizationConfig(grouping=grouping, method=method),
        use_turn_rewards=turns,
    )


def test_trajectory_return_on_the_last_model_token(batch):
    scores = place_rewards(batch, cfg(), gamma=1.0)
    assert scores[0, 6] == 1.0 and scores[0].abs().sum() == 1.0
    assert scores.abs().sum() == 1.0  # the two 0-return episodes add nothing


@pytest.mark.parametrize(
    ("grouping", "method", "expected"),
    [
        ("state", "mean", [0.5, -0.5, 0.0]),  # g0: returns 1, 0; g1 alone
        ("state", "mean_std", [0.7071, -0.7071, 0.0]),  # singleton → 0 (ROLL)
        ("batch", "mean", [2 / 3, -1 / 3, -1 / 3]),
        ("tag", "identity", [1.0, 0.0, 0.0]),
        ("inductive", "mean", [0.5, -0.5, 0.0]),  # same first prompt ⇔ same group here
    ],
)
def test_grouping_times_method(batch, grouping, method, expected):
    scores = place_rewards(batch, cfg(grouping, method), gamma=1.0)
    got = [scores[k].sum().item() for k in range(3)]
    assert got == pytest.approx(expected, abs=1e-3)


def test_turn_rewards_are_discounted_per_turn(batch):
    gamma = 0.5
    scores = place_rewards(batch, cfg(turns=True), gamma=gamma)
    # episode 2: r = (0.5, 0.5, -1) at turn ends 1, 5, 8; G = (0.5+0.5*0.0, 0.5-0.5, -1)
    g3 = -1.0
    g2 = 0.5 + gamma * g3
    g1 = 0.5 + gamma * g2
    row = scores[2]
    assert row[1].item() == pytest.approx(g1 - g2)
    assert row[5].item() == pytest.approx(g2 - g3)
    assert row[8].item() == pytest.approx(g3)
    # reward-to-go over model tokens equals the per-turn discounted return
    mask = batch["response_mask"][2].bool()
    to_go = row.flip(0).cumsum(0).flip(0)
    assert to_go[0].item() == pytest.approx(g1) and to_go[4].item() == pytest.approx(g2)
    assert not row[~mask].any()


def test_agentic_experience_with_reinforce_and_grpo(batch):
    algo = AlgorithmConfig(adv_estimator="reinforce", whiten_advantages=False)
    out, metrics = agentic_experience(batch, algo, cfg(turns=True), ShapingState.from_config(algo))
    adv, mask = out["advantages"], out["response_mask"].bool()
    assert not adv[~mask].any()
    assert adv[2, 0].item() == pytest.approx(0.0) and adv[2, 8].item() == pytest.approx(-1.0)
    algo = AlgorithmConfig(adv_estimator="grpo")
    out, _ = agentic_experience(batch, algo, cfg(), ShapingState.from_config(algo))
    a = out["advantages"]
    assert a[0, 0] > 0 > a[1, 0] and a[0, 0] == a[0, 6]  # broadcast over model tokens
    assert "train/advantage_mean" in metrics


def test_episode_metrics(batch):
    m = episode_metrics(batch, "train")
    assert m["train/success_rate"] == pytest.approx(1 / 3)
    assert m["env/A/success_rate"] == 0.5 and m["env/B/success_rate"] == 0.0
    assert m["env/num_turns_mean"] == 2.0 and m["env/invalid_action_rate"] == pytest.approx(1 / 6)
    v = episode_metrics(batch, "val")
    assert "val/env/A/success_rate" in v and v["val/reward_mean"] == pytest.approx(1 / 3)
