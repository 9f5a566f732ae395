"""``actor.router_replay``: the native field, its checks, and the verl / ROLL spellings
(verl ``actor.router_replay.mode`` and, verl 0.9, ``actor.megatron.router_replay.mode``;
ROLL ``<worker>.router_replay.mode``)."""

from __future__ import annotations

import pytest
from test_roll_dialect import nest, run
from test_verl_v09 import composed, native

from temper.config.errors import ConfigError
from temper.pipelines.catalog import build_config


def config(actor: dict) -> dict:
    out = {"model": {"path": "m"}, "data": {"train_files": ["d.parquet"]}, "actor": actor}
    if actor.get("strategy") == "megatron":  # two ranks: two pipeline stages or CP ranks
        out["resources"] = {"backend": "ray", "devices_per_node": 2}
    return out


@pytest.mark.parametrize("mode", ["none", "R2"])
def test_native_modes_load(mode: str) -> None:
    assert build_config(config({"router_replay": mode})).actor.router_replay == mode


def test_megatron_replay_loads_with_pipeline_and_context_parallelism() -> None:
    for megatron in ({"pipeline_model_parallel_size": 2}, {"context_parallel_size": 2}):
        actor = {"router_replay": "R2", "strategy": "megatron", "megatron": megatron}
        assert build_config(config(actor)).actor.router_replay == "R2"


@pytest.mark.parametrize(
    ("actor", "words"),
    [
        ({"router_replay": "R3"}, "rollout engines (hf, vllm) do not return them"),
        ({"router_replay": "R2", "recompute_old_log_prob": False}, "old-log-prob forward"),
        ({"router_replay": "R5"}, "R2"),
        ({"router_replay": "R2", "pipeline": "sft"}, "pipeline sft generates none"),
    ],
)
def test_native_refusals_name_the_key(actor: dict, words: str) -> None:
    pipeline = actor.pop("pipeline", None)
    data = config(actor)
    if pipeline is not None:
        data = {**data, "pipeline": pipeline}
    with pytest.raises(ConfigError) as err:
        build_config(data)
    assert err.value.key == "actor.router_replay" and words in str(err.value)


def test_verl09_megatron_spelling_maps_and_the_legacy_one_agrees() -> None:
    data = composed(
        "ppo_megatron_trainer.yaml", "actor_rollout_ref.actor.megatron.router_replay.mode=R2"
    )
    assert native(data)["actor"]["router_replay"] == "R2"
    both = composed(
        "ppo_megatron_trainer.yaml",
        "actor_rollout_ref.actor.megatron.router_replay.mode=R2",
        "actor_rollout_ref.actor.router_replay.mode=R2",
    )
    assert native(both)["actor"]["router_replay"] == "R2"
    off = composed("ppo_megatron_trainer.yaml")
    assert native(off)["actor"].get("router_replay", "none") == "none"


def test_verl09_reference_replay_is_refused() -> None:
    data = composed(
        "ppo_megatron_trainer.yaml", "actor_rollout_ref.ref.megatron.router_replay.mode=R2"
    )
    with pytest.raises(ConfigError, match="only the actor"):
        native(data)


@pytest.mark.parametrize(("mode", "want"), [("R2", "R2"), ("disable", "none")])
def test_roll_actor_train_mode_maps(mode: str, want: str) -> None:
    cfg, _ = run(nest("actor_train.router_replay.mode", mode))
    assert cfg.actor.router_replay == want


@pytest.mark.parametrize("role", ["actor_infer", "reference"])
def test_roll_other_workers_must_stay_off(role: str) -> None:
    with pytest.raises(ConfigError) as err:
        run(nest(f"{role}.router_replay.mode", "R3"))
    assert f"{role}.router_replay.mode" in str(err.value)
    assert "only actor_train replays" in str(err.value)
