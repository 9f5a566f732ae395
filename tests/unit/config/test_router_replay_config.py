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


@pytest.mark.parametrize("mode", ["none", "R2", "R3"])
def test_native_modes_load(mode: str) -> None:
    assert build_config(config({"router_replay": mode})).actor.router_replay == mode


def test_megatron_replay_loads_with_pipeline_and_context_parallelism() -> None:
    for megatron in ({"pipeline_model_parallel_size": 2}, {"context_parallel_size": 2}):
        actor = {"router_replay": "R2", "strategy": "megatron", "megatron": megatron}
        assert build_config(config(actor)).actor.router_replay == "R2"


@pytest.mark.parametrize(
    ("actor", "words"),
    [
        ({"router_replay": "R2", "recompute_old_log_prob": False}, "old-log-prob forward"),
        ({"router_replay": "R3", "pipeline": "agentic"}, "producer does not keep it"),
        ({"router_replay": "R3", "rollout": {"multi_turn": {"enable": True}}}, "multi-turn"),
        (
            {"router_replay": "R3", "async_training": {"partial_rollout_segment": 4}},
            "partial rollout",
        ),
        ({"router_replay": "R5"}, "R2"),
        ({"router_replay": "R2", "pipeline": "sft"}, "pipeline sft generates none"),
    ],
)
def test_native_refusals_name_the_key(actor: dict, words: str) -> None:
    sections = {k: actor.pop(k) for k in ("pipeline", "rollout", "async_training") if k in actor}
    data = {**config(actor), **sections}
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


def test_r3_needs_no_recomputed_old_log_probs() -> None:
    """R3's routing comes with the samples: without an old-log-prob forward the update
    still replays it (the old log-probs are the rollout's)."""
    actor = {"router_replay": "R3", "recompute_old_log_prob": False}
    assert build_config(config(actor)).actor.router_replay == "R3"


@pytest.mark.parametrize(
    "override",
    [
        "actor_rollout_ref.actor.megatron.router_replay.mode=R3",
        "actor_rollout_ref.actor.router_replay.mode=R3",
    ],
)
def test_verl_r3_maps_with_the_rollout_flag(override: str) -> None:
    flag = "actor_rollout_ref.rollout.enable_rollout_routing_replay"
    data = composed("ppo_megatron_trainer.yaml", override, f"{flag}=true")
    assert native(data)["actor"]["router_replay"] == "R3"
    with pytest.raises(ConfigError) as err:  # verl's R3 needs the rollout to return routing
        native(composed("ppo_megatron_trainer.yaml", override))
    assert "enable_rollout_routing_replay" in str(err.value)
    with pytest.raises(ConfigError):  # and the rollout returns it only for R3
        native(composed("ppo_megatron_trainer.yaml", f"{flag}=true"))


def test_verl09_reference_replay_is_refused() -> None:
    data = composed(
        "ppo_megatron_trainer.yaml", "actor_rollout_ref.ref.megatron.router_replay.mode=R2"
    )
    with pytest.raises(ConfigError, match="only the actor"):
        native(data)


@pytest.mark.parametrize(("mode", "want"), [("R2", "R2"), ("R3", "R3"), ("disable", "none")])
def test_roll_actor_train_mode_maps(mode: str, want: str) -> None:
    cfg, _ = run(nest("actor_train.router_replay.mode", mode))
    assert cfg.actor.router_replay == want


def test_roll_r3_on_actor_infer_goes_with_actor_train() -> None:
    both = nest(
        "actor_infer.router_replay.mode", "R3", nest("actor_train.router_replay.mode", "R3")
    )
    cfg, _ = run(both)
    assert cfg.actor.router_replay == "R3"
    with pytest.raises(ConfigError) as err:
        run(nest("actor_infer.router_replay.mode", "R3"))
    assert "actor_infer.router_replay.mode" in str(err.value)
    assert "actor_train's router_replay.mode is R3" in str(err.value)


def test_roll_reference_must_stay_off() -> None:
    with pytest.raises(ConfigError) as err:
        run(nest("reference.router_replay.mode", "R3"))
    assert "reference.router_replay.mode" in str(err.value)
    assert "only actor_train replays" in str(err.value)
