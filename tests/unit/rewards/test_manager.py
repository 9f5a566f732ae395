"""The reward manager: decoding, routing, failures, penalties, placement, metrics."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from temper.config.errors import ConfigError
from temper.config.schema import CustomRewardFunctionConfig, RewardConfig, RewardRoute
from temper.rewards.manager import RewardScorer, normalize_result
from temper.rewards.placement import last_token_index, place_at_last_token

from .conftest import make_batch


def test_placement_last_token_and_empty_rows() -> None:
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    assert last_token_index(mask).tolist() == [2, 2, 0, 3]
    out = place_at_last_token(torch.tensor([1.0, 2.0, 3.0, 4.0]), mask)
    assert out.sum(-1).tolist() == [1.0, 2.0, 3.0, 4.0]
    assert out[0].tolist() == [0, 0, 1.0, 0] and out[2].tolist() == [3.0, 0, 0, 0]


def test_normalize_result() -> None:
    assert normalize_result(True) == (1.0, {})
    assert normalize_result({"score": 2, "acc": 1}) == (2.0, {"acc": 1})
    for bad in ("1.0", {"acc": 1}, float("nan"), None):
        with pytest.raises(ValueError):
            normalize_result(bad)


def test_scores_land_on_last_token_with_metrics(tokenizer) -> None:
    batch = make_batch(
        tokenizer,
        ["2+2?", "1+1?", "3*3?", "a?"],
        ["#### 4", "it is 3", "#### 9", ""],
        data_source=["arithmetic", "arithmetic", "openai/gsm8k", "arithmetic"],
        ground_truth=["4", "2", "9", "1"],
    )
    config = RewardConfig(num_workers=0, format_penalty=-0.5)
    with RewardScorer(config) as scorer:
        scores, token_level, metrics, failures = scorer.score_batch(batch, tokenizer)
    assert batch["response_text"] == ["#### 4", "it is 3", "#### 9", ""]  # special tokens skipped
    # row 3 is empty: no integer → format_ok False → penalty
    assert scores.tolist() == [1.0, 0.0, 1.0, -0.5]
    assert failures == []
    lengths = batch["response_mask"].sum(-1)
    for i in range(3):
        assert token_level[i, lengths[i] - 1] == scores[i]
    assert token_level[3, 0] == -0.5  # zero-length response: position 0
    assert torch.equal(token_level.sum(-1), scores)
    assert metrics["train/score_mean"] == pytest.approx(1.5 / 4)
    assert metrics["train/reward_failures"] == 0
    assert metrics["reward/arithmetic/mean"] == pytest.approx(0.5 / 3)
    assert metrics["reward/openai/gsm8k/mean"] == 1.0
    assert metrics["reward_extra/acc"] == pytest.approx(0.5)
    assert batch["reward_extra_info"][0]["acc"] == 1.0
    assert batch["reward_extra_info"][0]["reward_failure"] is None


def test_routes_by_tag(tokenizer, user_reward_file: Path) -> None:
    batch = make_batch(
        tokenizer,
        ["q"] * 3,
        ["<think>a</think><answer>1</answer>", "#### 7", "7"],
        data_source=["x", "x", "y"],
        ground_truth=[None, "7", "7"],
        tag=["fmt", "math", "other"],
    )
    config = RewardConfig(
        num_workers=0,
        custom_function=CustomRewardFunctionConfig(
            path=str(user_reward_file), kwargs={"bonus": 0.25}
        ),
        routes={
            "format": RewardRoute(function="format", tags=["fmt"], kwargs={"match_score": 0.5}),
            "math": RewardRoute(function="arithmetic", tags=["math"]),
            "rest": RewardRoute(function="custom"),
        },
    )
    with RewardScorer(config) as scorer:
        scores, _, metrics, failures = scorer.score_batch(batch, tokenizer, prefix="val")
    assert scores.tolist() == [0.5, 1.0, 1.25]
    assert not failures
    assert metrics["val/score_mean"] == pytest.approx(2.75 / 3)
    assert "val/reward/y/mean" in metrics and "val/reward_extra/length" in metrics


def test_failures_in_workers_score_failure_score(tokenizer, user_reward_file: Path) -> None:
    batch = make_batch(
        tokenizer, ["q"] * 3, ["slow", "boom", "fine"], ground_truth=["1"] * 3, tag=["s", "r", "s"]
    )
    config = RewardConfig(
        num_workers=2,
        timeout_s=1.0,
        failure_score=-1.0,
        custom_function=CustomRewardFunctionConfig(path=str(user_reward_file), name="sleeps"),
        routes={"raise": RewardRoute(function="format", tags=["r"], kwargs={"pattern": "("})},
    )
    with RewardScorer(config, preload=()) as scorer:
        scores, token_level, metrics, failures = scorer.score_batch(batch, tokenizer)
        assert scorer.score_batch(batch.slice(2, 3), tokenizer).scores.tolist() == [1.0]
    assert scores.tolist() == [-1.0, -1.0, 1.0]
    assert [(f.index, f.kind, f.function) for f in failures] == [
        (0, "timeout", "custom:sleeps"),
        (1, "error", "format"),
    ]
    assert failures[1].reason.startswith("error: missing )")  # re.error from the bad pattern
    assert metrics["train/reward_failures"] == 2 and metrics["train/reward_timeouts"] == 1
    assert batch["reward_extra_info"][0]["reward_failure"].startswith("TimeoutError")
    assert torch.equal(token_level.sum(-1), scores)


def test_invalid_return_is_a_failure(tokenizer, user_reward_file: Path) -> None:
    batch = make_batch(tokenizer, ["q"], ["a"], ground_truth=["1"])
    custom = CustomRewardFunctionConfig(path=str(user_reward_file), name="returns_text")
    with RewardScorer(RewardConfig(num_workers=0, custom_function=custom)) as scorer:
        scores, _, _, failures = scorer.score_batch(batch, tokenizer)
    assert scores.tolist() == [0.0]
    assert failures[0].kind == "invalid" and "not a number" in failures[0].reason


@pytest.mark.parametrize("workers", [0, 1])
def test_a_number_no_float_holds_is_a_failure(tokenizer, user_reward_file: Path, workers) -> None:
    """10**400 has no float (OverflowError), 1e300 none in float32 (the scores' dtype: it
    would train on inf), an object's ``__float__`` may raise anything: each scores
    failure_score with a recorded failure, in a worker and in process alike."""
    batch = make_batch(tokenizer, ["q"] * 3, ["a", "b", "c"], ground_truth=["1"] * 3)
    custom = CustomRewardFunctionConfig(path=str(user_reward_file), name="huge")
    config = RewardConfig(num_workers=workers, custom_function=custom, failure_score=-1.0)
    with RewardScorer(config, preload=()) as scorer:
        scores, token_level, metrics, failures = scorer.score_batch(batch, tokenizer)
    assert scores.tolist() == [-1.0, -1.0, -1.0]
    assert [(f.index, f.kind) for f in failures] == [(0, "invalid"), (1, "invalid"), (2, "invalid")]
    assert "too large for a float" in failures[0].reason
    assert "outside float32" in failures[1].reason
    assert torch.isfinite(token_level).all() and metrics["train/reward_failures"] == 3


def test_odd_numbers_in_results_fail_the_sample_or_drop_from_metrics(
    tokenizer, user_reward_file: Path
) -> None:
    """A score whose ``__float__`` raises fails its sample; an extra field no float holds
    is left out of the metrics (the score stands)."""
    batch = make_batch(tokenizer, ["q"], ["a"], ground_truth=["1"])
    scored = {}
    for name in ("stubborn", "huge_extra"):
        custom = CustomRewardFunctionConfig(path=str(user_reward_file), name=name)
        with RewardScorer(RewardConfig(num_workers=0, custom_function=custom)) as scorer:
            scored[name] = scorer.score_batch(batch, tokenizer)
    scores, _, _, failures = scored["stubborn"]
    assert scores.tolist() == [0.0] and "ArithmeticError('no float here')" in failures[0].reason
    scores, _, metrics, failures = scored["huge_extra"]
    assert scores.tolist() == [1.0] and failures == []
    assert "reward_extra/big" not in metrics


def test_unknown_data_source_is_a_sample_failure_and_a_warning(tokenizer, caplog) -> None:
    batch = make_batch(
        tokenizer,
        ["q", "q"],
        ["#### 1", "#### 1"],
        data_source=["my/set", "my/set"],
        ground_truth=["1", "1"],
    )
    with RewardScorer(RewardConfig(num_workers=0)) as scorer, caplog.at_level(logging.WARNING):
        scores, _, _, failures = scorer.score_batch(batch, tokenizer)
        with pytest.raises(ConfigError, match="auto has no reward for data_source 'my/set'"):
            scorer.check_data_sources(["openai/gsm8k", "my/set"])
        scorer.check_data_sources(["openai/gsm8k", "arithmetic"])
    assert scores.tolist() == [0.0, 0.0] and len(failures) == 2
    assert "UnknownDataSourceError" in failures[0].reason
    warnings = [r for r in caplog.records if "my/set" in r.getMessage()]
    assert len(warnings) == 1 and "openai/gsm8k" in warnings[0].getMessage()


def test_batch_manager_calls_the_batch_signature(tokenizer, user_reward_file: Path) -> None:
    batch = make_batch(tokenizer, ["q"] * 3, ["1", "2", "3"], ground_truth=["1", "0", "3"])
    config = RewardConfig(
        num_workers=2,
        reward_manager="batch",
        custom_function=CustomRewardFunctionConfig(
            path=str(user_reward_file), name="batched", kwargs={"scale": 2.0}
        ),
    )
    with RewardScorer(config, preload=()) as scorer:
        scores, _, _, failures = scorer.score_batch(batch, tokenizer)
    assert scores.tolist() == [2.0, 0.0, 2.0] and not failures


def test_config_errors(user_reward_file: Path) -> None:
    with pytest.raises(ConfigError, match="reward.reward_manager: 'prime'"):
        RewardScorer(RewardConfig(reward_manager="prime"))
    with pytest.raises(ConfigError, match=r"reward.routes.a.function: unknown value 'gsm'"):
        RewardScorer(RewardConfig(routes={"a": RewardRoute(function="gsm")}))
    with pytest.raises(ConfigError, match="reward.custom_function.path: is not set"):
        RewardScorer(RewardConfig(function="custom"))
    with pytest.raises(ConfigError, match="reward.custom_function.name: 'nope'"):
        RewardScorer(
            RewardConfig(
                custom_function=CustomRewardFunctionConfig(path=str(user_reward_file), name="nope")
            )
        )
    with pytest.raises(ConfigError, match="tag 'a' is already routed"):
        RewardScorer(
            RewardConfig(routes={"x": RewardRoute(tags=["a"]), "y": RewardRoute(tags=["a"])})
        )
