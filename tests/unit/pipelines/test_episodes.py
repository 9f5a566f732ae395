"""The agentic_rollout pipeline (pipelines.episodes): ROLL's rollout scores by hand, and
what a rollout that trains nothing refuses."""

from __future__ import annotations

import pytest

from temper.config.errors import ConfigError
from temper.pipelines.catalog import build_config
from temper.pipelines.episodes import score_metrics

LAKE = {"env_type": "frozen_lake", "max_turns": 2, "env_config": {"size": 3}}


def _cfg(**extra: dict) -> dict:
    cfg = {
        "pipeline": "agentic_rollout",
        "experiment": {"max_steps": 2},
        "model": {"path": "/m"},
        "agentic": {
            "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["T"]},
            "custom_envs": {"T": LAKE},
        },
    }
    for section, values in extra.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    return cfg


def test_score_metrics_by_hand():
    m = score_metrics([1.0, -0.5, 0.0, 2.0], ["a", "b", "a", "b"])
    assert m["val/score/mean"] == pytest.approx(0.625)
    assert (m["val/score/max"], m["val/score/min"]) == (2.0, -0.5)
    assert m["val/a/score/mean"] == pytest.approx(0.5) and m["val/a/score/min"] == 0.0
    assert m["val/b/score/mean"] == pytest.approx(0.75) and m["val/b/score/max"] == 2.0


def test_a_rollout_builds_and_runs_under_temper_generate():
    from temper.pipelines import command_pipeline

    cfg = build_config(_cfg())
    assert command_pipeline(cfg, "generate").main is not None
    with pytest.raises(ConfigError, match="runs with temper generate"):
        command_pipeline(cfg, "train")


@pytest.mark.parametrize(
    ("extra", "key", "words"),
    [
        ({"critic": {"enable": True}}, "critic.enable", "no critic"),
        ({"actor": {"optim": {"lr": 0.1}}}, "actor.optim.lr", "the policy is model.path's"),
        ({"data": {"train_files": ["x.jsonl"]}}, "data.train_files", "env_manager"),
        ({"experiment": {"save_freq": 5}}, "experiment.save_freq", "no checkpoints"),
        ({"experiment": {"max_steps": None}}, "experiment.max_steps", "number of steps"),
    ],
)
def test_what_a_rollout_reads_nothing_of_is_refused(extra, key, words):
    with pytest.raises(ConfigError) as err:
        build_config(_cfg(**extra))
    assert str(err.value).startswith(f"{key}") and words in str(err.value)


def test_only_the_train_env_managers_tags_are_checked_and_resolved():
    """The validation manager's default tag (not in custom_envs) is never read; a train tag
    that is not defined is refused by name, before any env or model loads."""
    from temper.pipelines.episodes import preflight

    preflight(build_config(_cfg()), [])
    bad = _cfg()
    bad["agentic"]["train_env_manager"]["tags"] = ["Nope"]
    with pytest.raises(ConfigError, match="agentic.train_env_manager.tags"):
        build_config(bad)
