"""GiGPO against hand-computed values (arithmetic in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from temper.algorithms import ADV_ESTIMATORS, AdvantageInputs, AdvantageParams, compute_advantages
from temper.algorithms.advantages_gigpo import step_returns

T = torch.tensor
E = 1e-6

# Episode group "g" plays two episodes of one seed, group "h" one episode of another.
#   e1: anchors A, B       step rewards 0, 1          return 1.0
#   e2: anchors A, C, B    step rewards -0.1, 0, 1    return 0.9
#   e3 (group h): anchor A step reward 1              return 1.0
# Rows come out of order (e2's last step first) to check the episode ordering.
ROWS = [  # (group, episode, step, anchor, step reward, episode return, valid tokens)
    ("g", "e2", 2, "A-B", 1.0, 0.9, 2),
    ("g", "e1", 0, "A", 0.0, 1.0, 3),
    ("g", "e1", 1, "A-B", 1.0, 1.0, 1),
    ("g", "e2", 0, "A", -0.1, 0.9, 2),
    ("g", "e2", 1, "C", 0.0, 0.9, 3),
    ("h", "e3", 0, "A", 1.0, 1.0, 2),
]


def case() -> AdvantageInputs:
    width = 3
    mask = torch.zeros(len(ROWS), width)
    rewards = torch.zeros(len(ROWS), width)
    for i, row in enumerate(ROWS):
        n = row[6]
        mask[i, :n] = 1
        rewards[i, n - 1] = row[5]  # the episode return on the last valid token
    rewards[0, 2] = 5.0  # on a masked token: ignored
    return AdvantageInputs(
        rewards,
        mask,
        [r[0] for r in ROWS],
        step_rewards=T([r[4] for r in ROWS]),
        episode_index=[r[1] for r in ROWS],
        step_index=T([r[2] for r in ROWS]),
        anchor_index=[r[3] for r in ROWS],
    )


def per_row(adv: torch.Tensor) -> list[float]:
    """The scalar of each row, checking it fills the valid tokens and nothing else."""
    out = []
    for i, row in enumerate(ROWS):
        n = row[6]
        assert torch.all(adv[i, n:] == 0)
        assert torch.allclose(adv[i, :n], adv[i, 0].expand(n))
        out.append(float(adv[i, 0]))
    return out


def test_step_returns_discount_along_each_episode() -> None:
    inp = case()
    assert inp.step_rewards is not None and inp.step_index is not None
    assert inp.episode_index is not None
    got = step_returns(inp.step_rewards, inp.episode_index, inp.step_index, gamma=0.5)
    # e1: G1 = 1, G0 = 0 + 0.5·1 = 0.5; e2: G2 = 1, G1 = 0 + 0.5·1 = 0.5,
    # G0 = -0.1 + 0.5·0.5 = 0.15; e3: G0 = 1
    torch.testing.assert_close(got, T([1.0, 0.5, 1.0, 0.15, 0.5, 1.0]))
    undiscounted = step_returns(inp.step_rewards, inp.episode_index, inp.step_index, gamma=1.0)
    torch.testing.assert_close(undiscounted, T([1.0, 1.0, 1.0, 0.9, 1.0, 1.0]))


def test_step_returns_refuse_a_repeated_step() -> None:
    with pytest.raises(ValueError, match="same step index"):
        step_returns(T([1.0, 2.0]), ["e", "e"], T([0, 0]), gamma=1.0)


def test_gigpo_mean_normalization_roll_examples() -> None:
    # ROLL's gigpo examples: reward_normalization.method mean -> no division by the std
    params = AdvantageParams(norm_adv_by_std_in_grpo=False, step_gamma=0.5, step_weight=0.5)
    adv, ret = compute_advantages("gigpo", case(), params)
    # episode level, group g over its 5 step samples: scores 1, 1, .9, .9, .9, mean .94
    #   e1 rows +0.06, e2 rows -0.04; group h has one sample: 0
    # step level (returns as in the test above), within group g:
    #   anchor A: e1 step 0 (0.5) and e2 step 0 (0.15): mean 0.325 -> +0.175, -0.175
    #   anchor A-B: e1 step 1 and e2 step 2, both 1 -> 0, 0
    #   anchor C: e2 step 1 alone -> 0
    #   group h's anchor A is not group g's: e3 alone -> 0
    # A = 1·episode + 0.5·step
    expected = [-0.04, 0.06 + 0.5 * 0.175, 0.06, -0.04 - 0.5 * 0.175, -0.04, 0.0]
    assert per_row(adv) == pytest.approx(expected, abs=1e-6)
    torch.testing.assert_close(ret, adv)


def test_gigpo_mean_std_normalization() -> None:
    params = AdvantageParams(norm_adv_by_std_in_grpo=True, step_gamma=0.5)
    adv, _ = compute_advantages("gigpo", case(), params)
    # episode, group g: deviations .06, .06, -.04, -.04, -.04; Σd² = .012, /4 -> std √.003
    sd = math.sqrt(0.003)
    up, down = 0.06 / (sd + E), -0.04 / (sd + E)
    # step, anchor A: [0.5, 0.15], std = 0.35/√2, ±0.175/std = ±(1/√2)
    k = 0.175 / (0.35 / math.sqrt(2) + E)
    # anchor A-B: std 0 -> 0 (not a division by ε); lone states and group h: 0
    expected = [down, up + k, up, down - k, down, 0.0]
    assert per_row(adv) == pytest.approx(expected, abs=1e-5)


def test_gigpo_weights_separate_the_two_levels() -> None:
    inp = case()
    only_episode = AdvantageParams(norm_adv_by_std_in_grpo=False, step_weight=0.0)
    only_step = AdvantageParams(
        norm_adv_by_std_in_grpo=False, episode_weight=0.0, step_gamma=0.5, step_weight=2.0
    )
    episode = per_row(compute_advantages("gigpo", inp, only_episode)[0])
    step = per_row(compute_advantages("gigpo", inp, only_step)[0])
    assert episode == pytest.approx([-0.04, 0.06, 0.06, -0.04, -0.04, 0.0], abs=1e-6)
    assert step == pytest.approx([0.0, 0.35, 0.0, -0.35, 0.0, 0.0], abs=1e-6)


def test_gigpo_declares_and_checks_its_inputs() -> None:
    assert ADV_ESTIMATORS.get("gigpo").needs == {
        "step_rewards",
        "episode_index",
        "step_index",
        "anchor_index",
    }
    inp = case()
    inp.anchor_index = None
    with pytest.raises(ValueError, match="anchor_index"):
        compute_advantages("gigpo", inp)
