"""GDPO's inputs from the RLVR scorer: the reward function's named extra fields."""

from __future__ import annotations

import pytest
import torch

from temper.data.batch import Batch
from temper.pipelines.rlvr import reward_components


def scored(extras: list[dict], scores: list[float]) -> Batch:
    return Batch.from_dict(
        {"scores": torch.tensor(scores)},
        {"reward_extra_info": extras, "data_source": ["toy"] * len(scores)},
    )


def test_components_in_key_order_and_failures_keep_their_score():
    b = scored(
        [
            {"format_reward": 1, "accuracy_reward": 0.0, "reward_failure": None},
            {"accuracy_reward": 1.0, "format_reward": True, "other": "x", "reward_failure": None},
            {"reward_failure": "TimeoutError: 10s"},  # the call failed: scored failure_score
        ],
        [1.0, 2.0, -0.5],
    )
    out = reward_components(b, ["accuracy_reward", "format_reward"])
    torch.testing.assert_close(out, torch.tensor([[0.0, 1.0], [1.0, 1.0], [-0.5, -0.5]]))


@pytest.mark.parametrize("value", [None, "yes", float("nan")])
def test_a_missing_or_non_numeric_component_stops_with_the_fields_given(value):
    extra = {"accuracy_reward": 1.0, "reward_failure": None}
    if value is not None:
        extra["format_reward"] = value
    with pytest.raises(ValueError, match=r"format_reward=.*\['accuracy_reward'"):
        reward_components(scored([extra], [1.0]), ["accuracy_reward", "format_reward"])
