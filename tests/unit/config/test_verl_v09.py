"""verl 0.9's trainer config (the 2026-08 snapshot): the ``model_engine`` defaults group,
the V1 trainer's ``trainer.v1`` section, and the ``reward`` section that replaces
``reward_model`` / ``custom_reward_function`` / ``sandbox_fusion``.

The snapshot's composed ``ppo_trainer.yaml`` still holds keys of verl 0.9 that other
items of issue 27 translate; :func:`known` drops those (and only those) so that each
test reads the sections it is about through the real composition.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
import torch
from reference_paths import UPSTREAM  # next to this file

from temper.config.dialects.verl.translate import PPO, TABLE, translate_verl
from temper.config.errors import ConfigError
from temper.config.loader import RawConfig, load_yaml
from temper.config.schema import OptimConfig
from temper.pipelines.catalog import CATALOG, load_config
from temper.training.schedule import LRSchedule

V2608 = UPSTREAM / "verl-2026-08-1dda039"
CONFIG = V2608 / "verl/trainer/config"


def known(node: dict[str, Any], parent: str = "") -> dict[str, Any]:
    """``node`` without the keys the verl table does not know yet."""
    out: dict[str, Any] = {}
    for k, v in node.items():
        path = f"{parent}.{k}" if parent else str(k)
        if k == "_target_" or path in TABLE:
            out[k] = v
        elif PPO.keys.children(tuple(path.split("."))) and isinstance(v, dict):
            out[k] = known(v, path)
    return out


def composed(name: str, *overrides: str) -> dict[str, Any]:
    return known(load_yaml(CONFIG / name, list(overrides)).data)


def native(data: dict[str, Any]) -> dict[str, Any]:
    return translate_verl(RawConfig(data=data, source="<test>"), CATALOG).native


def strategies(data: dict[str, Any]) -> tuple[str, str, str]:
    out = native(data)
    return out["actor"]["strategy"], out["critic"]["strategy"], out["reference"]["strategy"]


# ------------------------------------------------------------------ model_engine


def test_model_engine_dp_is_the_default_and_runs_fsdp2():
    data = composed("ppo_trainer.yaml")
    assert data["model_engine"] == "dp"
    assert strategies(data) == ("fsdp2", "fsdp2", "fsdp2")


@pytest.mark.parametrize(
    ("name", "overrides"),
    [("ppo_megatron_trainer.yaml", ()), ("ppo_trainer.yaml", ("model_engine=megatron",))],
)
def test_model_engine_megatron_composes_the_megatron_role_files(name, overrides):
    """``ppo_megatron_trainer.yaml`` is ``ppo_trainer`` + ``override model_engine:
    megatron``; the command-line group override composes the same."""
    data = composed(name, *overrides)
    assert data["model_engine"] == "megatron"
    assert "megatron" in data["actor_rollout_ref"]["actor"]  # megatron_actor.yaml's section
    assert strategies(data) == ("megatron", "megatron", "megatron")


def test_model_engine_veomni_composes_its_role_files_and_runs_fsdp2():
    """VeOmni's engine is FSDP2 with Ulysses: its ``veomni`` sections and its optimizer
    (cosine to ``lr_min``) translate onto temper's fsdp2 engine."""
    data = composed(
        "ppo_trainer.yaml",
        "model_engine=veomni",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.optim.lr_min=1e-7",
        "actor_rollout_ref.actor.veomni.param_offload=true",
        "actor_rollout_ref.actor.veomni.ulysses_parallel_size=2",
    )
    assert "veomni" in data["actor_rollout_ref"]["actor"]  # veomni_actor.yaml's section
    assert "fsdp_config" not in data["actor_rollout_ref"]["actor"]
    assert strategies(data) == ("fsdp2", "fsdp2", "fsdp2")
    actor = native(data)["actor"]
    assert actor["fsdp"]["param_offload"] is True
    assert actor["ulysses_sequence_parallel_size"] == 2
    assert actor["optim"]["lr_scheduler"] == "cosine"  # optim/veomni.yaml's default
    assert actor["optim"]["min_lr_ratio"] == pytest.approx(0.1)


def test_veomni_schedule_is_temper_schedule_step_for_step():
    """VeOmni's cosine schedule (``veomni.optim.lr_scheduler``), written out by hand: ``W =
    int(T · warmup_ratio)`` steps of ``lr · s / W`` (``lr_start`` 0), then ``lr_min + (lr -
    lr_min) · ½(1 + cos(π (s - W) / (T - W)))``, counted from step 0. The translated
    optimizer gives the same learning rate at every step."""
    lr, lr_min, total, ratio = 1e-6, 1e-7, 10, 0.2
    data = composed(
        "ppo_trainer.yaml",
        "model_engine=veomni",
        f"actor_rollout_ref.actor.optim.lr={lr}",
        f"actor_rollout_ref.actor.optim.lr_min={lr_min}",
        f"actor_rollout_ref.actor.optim.lr_warmup_steps_ratio={ratio}",
        f"actor_rollout_ref.actor.optim.total_training_steps={total}",
    )
    optim = OptimConfig(**native(data)["actor"]["optim"])
    schedule = LRSchedule(torch.optim.SGD([torch.zeros(1)], lr=lr), optim)
    warmup = int(total * ratio)
    for step in range(total + 1):
        if step < warmup:
            want = lr * step / warmup
        else:
            cosine = 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))
            want = lr_min + (lr - lr_min) * cosine
        assert schedule.apply() == pytest.approx(want, rel=1e-9, abs=1e-15), step
        schedule.step()


def test_model_engine_torchtitan_composes_its_role_files_and_runs_fsdp2():
    """TorchTitan's engine is FSDP2 over ``shard × replicate`` ranks: its ``torchtitan``
    sections (HSDP here) and its optimizer translate onto temper's fsdp2 engine, with
    what verl's engine takes from torchtitan's defaults (the schedule's total, the clip)."""
    data = composed(
        "ppo_trainer.yaml",
        "model_engine=torchtitan",
        "algorithm.adv_estimator=grpo",  # verl's TorchTitan engine has no value model
        "trainer.n_gpus_per_node=4",
        "actor_rollout_ref.actor.torchtitan.data_parallel_shard_size=2",
        "actor_rollout_ref.actor.torchtitan.data_parallel_replicate_size=2",
        "actor_rollout_ref.actor.torchtitan.param_offload=true",
        "actor_rollout_ref.actor.optim.clip_grad=0.5",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=5",
    )
    assert "torchtitan" in data["actor_rollout_ref"]["actor"]  # torchtitan_actor.yaml's
    assert strategies(data) == ("fsdp2", "fsdp2", "fsdp2")
    actor = native(data)["actor"]
    assert actor["fsdp"]["fsdp_size"] == 2 and actor["fsdp"]["param_offload"] is True
    assert actor["grad_clip"] == 1.0  # torchtitan's training.max_norm, not clip_grad
    optim = actor["optim"]
    assert optim["lr_scheduler"] == "linear" and optim["total_training_steps"] == 10000
    assert optim["warmup_steps"] == 5 and optim["warmup_from_one"] is True


def test_torchtitan_critic_is_refused_where_verl_builds_one():
    data = composed("ppo_trainer.yaml", "model_engine=torchtitan", "trainer.n_gpus_per_node=1")
    with pytest.raises(ConfigError) as err:  # ppo_trainer.yaml's gae builds a critic
        native(data)
    assert str(err.value).startswith("critic.torchtitan.strategy: ")
    assert "language models only" in str(err.value)


@pytest.mark.parametrize("decay", ["linear", "sqrt", "cosine"])
def test_torchtitan_schedule_is_temper_schedule_step_for_step(decay):
    """torchtitan's ``LambdaLR`` (``linear_warmup_stable_decay``) written out by hand for
    verl's engine, which leaves ``training.steps`` at T = 10000 and ``decay_ratio`` unset:
    at update ``s`` (from 0), ``(s + 1) / W`` while ``s < W``, 1 at ``s = W`` (its one
    stable step), then ``m + (1 - m)·f((s - W) / (T - W))`` with ``f`` linear ``1 - p``,
    sqrt ``1 - √p`` or cosine ``½(1 + cos πp)``. The translated optimizer gives the same
    learning rate at every update (early ones, and the last ones of the decay)."""
    lr, warmup, floor, total = 1e-6, 4, 0.1, 10000
    data = composed(
        "ppo_trainer.yaml",
        "model_engine=torchtitan",
        "algorithm.adv_estimator=grpo",
        "trainer.n_gpus_per_node=1",
        f"actor_rollout_ref.actor.optim.lr={lr}",
        f"actor_rollout_ref.actor.optim.lr_warmup_steps={warmup}",
        f"actor_rollout_ref.actor.optim.decay_type={decay}",
        f"actor_rollout_ref.actor.optim.min_lr_factor={floor}",
    )
    optim = OptimConfig(**native(data)["actor"]["optim"])
    schedule = LRSchedule(torch.optim.SGD([torch.zeros(1)], lr=lr), optim)
    shapes = {
        "linear": lambda p: 1 - p,
        "sqrt": lambda p: 1 - math.sqrt(p),
        "cosine": lambda p: 0.5 * (1 + math.cos(math.pi * p)),
    }
    for step in [*range(12), 5000, 9998, 9999, 10000]:
        if step < warmup:
            factor = (step + 1) / warmup
        elif step == warmup:
            factor = 1.0
        else:
            p = (step + 1 - (warmup + 1)) / (total - warmup)
            factor = floor + (1 - floor) * shapes[decay](p)
        schedule.step_count = step
        assert schedule.apply() == pytest.approx(lr * factor, rel=1e-9, abs=1e-15), step


def test_a_short_file_naming_only_the_group_gets_its_strategy():
    data = {"model_engine": "megatron", "actor_rollout_ref": {"model": {"path": "/m"}}}
    assert native(data)["actor"]["strategy"] == "megatron"


def test_a_strategy_that_contradicts_model_engine_is_refused():
    data = composed("ppo_trainer.yaml")  # model_engine: dp
    data["actor_rollout_ref"]["actor"]["strategy"] = "megatron"
    with pytest.raises(ConfigError, match="role files"):
        native(data)


# ------------------------------------------------------------------ trainer.use_v1, trainer.v1


def notes(data: dict[str, Any]) -> list[str]:
    return translate_verl(RawConfig(data=data, source="<test>"), CATALOG).notes


def test_the_v1_sync_trainer_is_temper_loop_and_its_async_options_are_noted():
    data = composed("ppo_trainer.yaml")
    assert data["trainer"]["use_v1"] is True and data["trainer"]["v1"]["trainer_mode"] == "sync"
    text = "\n".join(notes(data))
    assert "V1 sync trainer" in text
    for key in (
        "trainer.v1.separate_async.parameter_sync_step",
        "trainer.v1.separate_async.hybrid_rollout.enable_switch",
        "trainer.v1.colocate_async.num_warmup_batches",
        "trainer.v1.sampler.max_off_policy_threshold",
    ):
        assert key in text


POOL = (
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=2",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
)


def translated(data: dict[str, Any]) -> tuple[dict[str, Any], str]:
    out = translate_verl(RawConfig(data=data, source="<test>"), CATALOG)
    return out.native, "\n".join(out.notes)


def test_colocate_async_runs_num_warmup_batches_versions_ahead_and_says_what_differs():
    out, text = translated(composed("ppo_trainer.yaml", "trainer.v1.trainer_mode=colocate_async"))
    assert out["async_training"]["staleness"] == 1  # verl's default num_warmup_batches
    assert "resources" not in out or "actor_infer" not in out["resources"]  # colocated
    assert "partial rollout" in text and "in finish order" in text
    assert "generates each batch whole" in text and "bit-identical resume" in text
    assert "holds its own copy of the weights rather than time-sharing" in text


@pytest.mark.parametrize(("warmup", "threshold", "k"), [(0, 8, 0), (3, 8, 3), (5, 3, 2)])
def test_the_staleness_is_num_warmup_batches_capped_at_the_off_policy_threshold(
    warmup, threshold, k
):
    """verl's replay buffer trains no sample more than max_off_policy_threshold − 1
    versions old (span = step − tag + 1 ≤ T)."""
    out, text = translated(
        composed(
            "ppo_trainer.yaml",
            "trainer.v1.trainer_mode=colocate_async",
            f"trainer.v1.colocate_async.num_warmup_batches={warmup}",
            f"trainer.v1.sampler.max_off_policy_threshold={threshold}",
        )
    )
    assert out["async_training"]["staleness"] == k
    capped = f"num_warmup_batches {warmup} runs as async_training.staleness {k}"
    assert (capped in text) == (warmup > threshold - 1)


def test_separate_async_places_the_rollout_on_its_own_pool():
    out, text = translated(
        composed(
            "ppo_trainer.yaml",
            "trainer.v1.trainer_mode=separate_async",
            "trainer.n_gpus_per_node=6",
            *POOL,
        )
    )
    assert out["async_training"]["staleness"] == 1
    res = out["resources"]
    assert (res["nnodes"], res["devices_per_node"], res["backend"]) == (1, 8, "ray")
    assert res["actor_train"] == list(range(6)) and res["actor_infer"] == [6, 7]
    assert "pushes the weights once per step: so does temper's step" in text
    assert "so no group reaches that point" in text  # max_off_policy_strategy


@pytest.mark.parametrize(
    ("strategy", "words"),
    [
        ("drop", "verl evicts a finished group that spans more than T versions"),
        ("wait", "verl stops sampling while a group in flight spans T versions"),
    ],
)
def test_the_v1_off_policy_strategy_is_noted_with_why_the_fixed_schedule_never_needs_it(
    strategy, words
):
    """verl's V1 replay buffer drops or waits for a group at its bound T; temper's fixed
    schedule (staleness min(W, T - 1)) never produces one, so either runs the same."""
    data = composed(
        "ppo_trainer.yaml",
        "trainer.v1.trainer_mode=colocate_async",
        "trainer.v1.colocate_async.num_warmup_batches=5",
        "trainer.v1.sampler.max_off_policy_threshold=3",
        f"trainer.v1.sampler.max_off_policy_strategy={strategy}",
    )
    out, text = translated(data)
    assert out["async_training"] == {"staleness": 2}  # fixed: min(5, 3 - 1)
    line = next(n for n in text.splitlines() if "trainer.v1.sampler.max_off_policy_strategy" in n)
    assert line.startswith(
        f"trainer.v1.sampler.max_off_policy_strategy: no effect here ({strategy}: {words}"
    )
    assert "a span of at most T" in line


@pytest.mark.parametrize(
    ("overrides", "key", "words"),
    [
        ((), "actor_rollout_ref.rollout.nnodes", "pool of its own"),
        (
            (*POOL, "trainer.v1.separate_async.parameter_sync_step=2"),
            "trainer.v1.separate_async.parameter_sync_step",
            "data.train_batch_size (1024) = parameter_sync_step (2) ×",
        ),
        (POOL[:2], "actor_rollout_ref.rollout.checkpoint_engine.backend", "other than naive"),
        (
            (*POOL, "trainer.v1.separate_async.hybrid_rollout.enable_switch=true"),
            "trainer.v1.separate_async.hybrid_rollout.enable_switch",
            "hybrid rollout",
        ),
    ],
)
def test_separate_async_refuses_what_verl_asserts_or_temper_lacks(overrides, key, words):
    data = composed("ppo_trainer.yaml", "trainer.v1.trainer_mode=separate_async", *overrides)
    with pytest.raises(ConfigError) as err:
        native(data)
    text = str(err.value)
    assert text.startswith(f"{key}: ") and words in text and "\n" not in text


@pytest.mark.parametrize("mode", ["sync", "colocate_async", "separate_async"])
def test_the_weight_sync_backend_is_read_by_separate_async_only(mode):
    """A Use row that its derivation reads in one mode: separate_async checks the backend
    (no note on it); any other mode notes it has no effect."""
    pool = POOL if mode == "separate_async" else POOL[2:]  # the others have no pool
    data = composed("ppo_trainer.yaml", f"trainer.v1.trainer_mode={mode}", *pool)
    _, text = translated(data)
    key = "actor_rollout_ref.rollout.checkpoint_engine.backend"
    idle = f"{key}: no effect here (weights sync in buckets over temper's own transport)"
    assert (idle in text.splitlines()) == (mode != "separate_async")
    assert (key in text) == (mode != "separate_async")


def test_an_async_modes_options_are_noted_when_another_mode_runs():
    _, text = translated(composed("ppo_trainer.yaml", "trainer.v1.trainer_mode=colocate_async"))
    line = next(n for n in text.splitlines() if "separate_async.num_warmup_batches" in n)
    assert line.startswith("trainer.v1.separate_async.num_warmup_batches, ")
    assert line.endswith(
        ": no effect here (read by verl's separate_async trainer only; trainer_mode is "
        "colocate_async)"
    )


ONE_STEP = V2608 / "verl/experimental/one_step_off_policy"


def test_the_one_step_off_recipe_runs_one_version_behind_on_its_own_pool():
    data = known(load_yaml(ONE_STEP / "config/one_step_off_ppo_trainer.yaml").data)
    data["actor_rollout_ref"]["hybrid_engine"] = False  # its scripts set it (verl asserts)
    data["trainer"]["n_gpus_per_node"] = 6
    data["rollout"] = {"nnodes": 1, "n_gpus_per_node": 2}
    out, text = translated(data)
    assert out["async_training"]["staleness"] == 1
    assert out["actor"]["recompute_old_log_prob"] is False  # its bypass_mode: true
    res = out["resources"]
    assert res["actor_train"] == list(range(6)) and res["actor_infer"] == [6, 7]
    assert "max(0, s-2) updates" in text
    assert "OneStepOffRayTrainer) never reads trainer.v1" in text


def test_the_one_step_off_config_alone_is_refused_as_verl_asserts():
    data = known(load_yaml(ONE_STEP / "config/one_step_off_ppo_trainer.yaml").data)
    with pytest.raises(ConfigError) as err:  # hybrid_engine: true, verl's default
        native(data)
    assert str(err.value).startswith("actor_rollout_ref.hybrid_engine: verl's one-step-off")


def test_the_one_step_off_script_translates():
    from upstream_scripts import script_commands  # next to this file

    (cmd,) = script_commands(ONE_STEP / "shell/grpo_0.6b_gsm8k_fsdp2_2_6.sh", V2608)
    assert cmd.config == ONE_STEP / "config/one_step_off_ppo_trainer.yaml"
    cfg = load_config(cmd.config, list(cmd.overrides)).config
    assert cfg.async_training.staleness == 1 and not cfg.actor.recompute_old_log_prob
    assert cfg.resources.actor_train == list(range(6)) and cfg.resources.actor_infer == [6, 7]


def test_bypass_mode_trains_on_the_rollouts_log_probs_without_is_weights():
    """verl's compute_policy_loss_bypass_mode (ppo_clip): the vanilla loss with
    old = rollout log-probs and rollout_is_weights=None (computed for metrics only)."""
    data = composed(
        "ppo_trainer.yaml",
        "algorithm.rollout_correction.bypass_mode=true",
        "algorithm.rollout_correction.rollout_is=token",
    )
    out, text = translated(data)
    assert out["actor"]["recompute_old_log_prob"] is False
    assert out["actor"]["rollout_is"] == "none"
    assert "computes these IS weights for metrics only" in text


@pytest.mark.parametrize(
    ("override", "key", "words"),
    [
        (
            "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
            "algorithm.rollout_correction.bypass_mode",
            "replaces policy_loss.loss_mode ('gspo')",
        ),
    ],
)
def test_bypass_mode_refuses_a_loss_it_would_replace(override, key, words):
    data = composed(
        "ppo_trainer.yaml",
        "algorithm.rollout_correction.bypass_mode=true",
        "algorithm.rollout_correction.loss_type=reinforce",
        "algorithm.rollout_correction.rollout_is=token",
        override,
    )
    with pytest.raises(ConfigError) as err:
        native(data)
    text = str(err.value)
    assert text.startswith(f"{key}: ") and words in text and "\n" not in text


def test_bypass_mode_reinforce_is_the_reinforce_is_loss_with_rollout_is_settings():
    """verl's compute_policy_loss_bypass_mode (reinforce): -w·A·log π with w the IS
    weights of rollout_is / rollout_is_threshold, from the current policy."""
    data = composed(
        "ppo_trainer.yaml",
        "algorithm.rollout_correction.bypass_mode=true",
        "algorithm.rollout_correction.loss_type=reinforce",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold='0.5_4.0'",
    )
    out, text = translated(data)
    actor = out["actor"]
    assert (actor["policy_loss"], actor["recompute_old_log_prob"]) == ("reinforce_is", False)
    assert actor["rollout_is"] == "none"  # applied inside the loss, not before it
    kwargs = actor["policy_loss_kwargs"]
    assert kwargs["reinforce_is_level"] == "token"
    assert (kwargs["reinforce_is_threshold_low"], kwargs["reinforce_is_threshold"]) == (0.5, 4.0)
    assert "computed in the loss from the current policy" in text
    assert "reinforce_is_batch_normalize" not in kwargs and not actor["rollout_is_batch_normalize"]


def test_bypass_mode_rejects_against_the_current_policy_for_any_estimator():
    """In bypass mode verl rejects inside the loss, after the advantages (as temper
    always does): any estimator, and the note says what the filters compare."""
    data = composed(
        "ppo_trainer.yaml",
        "algorithm.adv_estimator=gae",
        "algorithm.rollout_correction.bypass_mode=true",
        "algorithm.rollout_correction.rollout_rs=token_k1",
        "algorithm.rollout_correction.rollout_rs_threshold=2.0",
    )
    out, text = translated(data)
    assert out["actor"]["recompute_old_log_prob"] is False
    assert out["actor"]["rollout_rs"] == [
        {"stat": "ratio", "level": "token", "low": 0.5, "high": 2.0}
    ]
    assert "compare the current policy with the rollout's" in text


def test_bypass_mode_reinforce_normalizes_its_weights_over_the_mini_batch():
    """rollout_is_batch_normalize in bypass mode (reinforce) is the loss's own option;
    the actor's pre-loss IS weights stay off, so nothing normalizes them twice."""
    data = composed(
        "ppo_trainer.yaml",
        "algorithm.rollout_correction.bypass_mode=true",
        "algorithm.rollout_correction.loss_type=reinforce",
        "algorithm.rollout_correction.rollout_is=sequence",
        "algorithm.rollout_correction.rollout_is_batch_normalize=true",
    )
    out, text = translated(data)
    actor = out["actor"]
    assert actor["policy_loss_kwargs"]["reinforce_is_batch_normalize"] is True
    assert (actor["rollout_is"], actor["rollout_is_batch_normalize"]) == ("none", False)
    assert "over each whole mini-batch" in text


def test_the_legacy_trainer_never_reads_trainer_v1():
    data = composed(
        "ppo_trainer.yaml", "trainer.use_v1=false", "trainer.v1.trainer_mode=separate_async"
    )
    assert any("trainer.v1.trainer_mode" in n and "use_v1 is false" in n for n in notes(data))


# ------------------------------------------------------------------ the reward section


def migrate_legacy_reward_impl(config: dict[str, Any]) -> dict[str, Any]:
    """verl's ``migrate_legacy_reward_impl`` (verl/experimental/reward_loop/reward_loop.py at
    the snapshot's commit), step by step on plain data: what verl 0.9 runs a config with
    legacy reward sections as."""
    config = copy.deepcopy(config)
    legacy, reward = config["reward_model"], config["reward"]
    if legacy.get("num_workers") is not None:  # 1. reward workers
        reward["num_workers"] = legacy["num_workers"]
    if legacy.get("reward_manager") is not None:  # 2. reward manager
        reward["reward_manager"]["name"] = legacy["reward_manager"]
    if legacy.get("reward_loop_source") is not None:
        reward["reward_manager"]["source"] = legacy["reward_loop_source"]
        reward["reward_manager"]["module"]["path"] = legacy["reward_loop_module_path"]
        reward["reward_manager"]["module"]["name"] = legacy["reward_loop_class_name"]
    custom = config["custom_reward_function"]  # 3. custom reward function
    if not all(v is None for v in custom.values()):
        reward["custom_reward_function"] = custom
    for key in ("enable", "enable_resource_pool", "n_gpus_per_node", "nnodes"):  # 4.
        if legacy.get(key) is not None:
            reward["reward_model"][key] = legacy[key]
    if legacy["model"]["path"] is not None:
        reward["reward_model"]["model_path"] = legacy["model"]["path"]
    if legacy.get("reward_kwargs") is not None:
        reward["reward_kwargs"] = legacy["reward_kwargs"]
    for key, value in legacy["rollout"].items():
        if value is not None:
            reward["reward_model"]["rollout"][key] = value
    if not all(v is None for v in config["sandbox_fusion"].values()):  # 5. sandbox_fusion
        reward["sandbox_fusion"] = config["sandbox_fusion"]
    for key in ("reward_model", "custom_reward_function", "sandbox_fusion"):  # 6.
        del config[key]
    return config


RULE_REWARD = {  # legacy key -> the reward section's key, with the value both are given
    "reward_model.reward_manager": ("reward.reward_manager.name", "dapo"),
    "reward_model.num_workers": ("reward.num_workers", 4),
    "custom_reward_function.path": ("reward.custom_reward_function.path", "/r/score.py"),
    "custom_reward_function.name": ("reward.custom_reward_function.name", "my_score"),
    "+reward_model.reward_kwargs.overlong_buffer_cfg.enable": (
        "+reward.reward_kwargs.overlong_buffer_cfg.enable",
        True,
    ),
    "+reward_model.reward_kwargs.overlong_buffer_cfg.len": (
        "+reward.reward_kwargs.overlong_buffer_cfg.len",
        256,
    ),
    "sandbox_fusion.url": ("reward.sandbox_fusion.url", "http://sandbox:8080"),
    "sandbox_fusion.memory_limit_mb": ("reward.sandbox_fusion.memory_limit_mb", 512),
}
MODEL_REWARD = {  # a sequence-classification reward model served by vLLM
    "reward_model.enable": ("reward.reward_model.enable", True),
    "reward_model.model.path": ("reward.reward_model.model_path", "/m/rm"),
    "reward_model.rollout.name": ("reward.reward_model.rollout.name", "vllm"),
    "reward_model.rollout.tensor_model_parallel_size": (
        "reward.reward_model.rollout.tensor_model_parallel_size",
        1,
    ),
}


@pytest.mark.parametrize("keys", [RULE_REWARD, MODEL_REWARD], ids=["rule", "model"])
def test_legacy_and_new_reward_sections_translate_to_the_same_native_config(keys):
    """The legacy spelling, verl's migration of it, and the ``reward`` section: one run."""
    legacy = composed("ppo_trainer.yaml", *(f"{k}={v}" for k, (_, v) in keys.items()))
    new = composed("ppo_trainer.yaml", *(f"{k}={v}" for k, v in keys.values()))
    want = native(legacy)
    assert native(new) == want
    assert native(migrate_legacy_reward_impl(legacy)) == want
    reward = want["reward"]
    if keys is RULE_REWARD:
        assert reward["reward_manager"] == "dapo" and reward["num_workers"] == 4
        assert reward["function"] == "custom"
        assert reward["custom_function"] == {"path": "/r/score.py", "name": "my_score"}
        assert reward["sandbox"] == "sandbox_fusion"
        assert reward["sandbox_url"] == "http://sandbox:8080"
        assert reward["sandbox_limits"] == {"memory_mb": 512}
        assert want["algorithm"]["overlong_buffer"] == {"enable": True, "len": 256}
    else:
        assert reward["model"]["enable"] is True and reward["model"]["path"] == "/m/rm"


def test_a_legacy_reward_key_that_is_set_wins_over_the_new_one():
    """As the migration copies it over: the new key yields, with a note."""
    data = composed(
        "ppo_trainer.yaml", "reward_model.reward_manager=prime", "reward.reward_manager.name=dapo"
    )
    assert native(data)["reward"]["reward_manager"] == "prime"
    assert native(migrate_legacy_reward_impl(data))["reward"]["reward_manager"] == "prime"
    assert any(
        "overridden by reward_model.reward_manager" in n and "reward.reward_manager.name" in n
        for n in notes(data)
    )


# ------------------------------------------------------------------ token budgets and SP

V2601_PPO = UPSTREAM / "verl-2026-01-b178a3c/verl/trainer/config/ppo_trainer.yaml"
LONG = (  # run_qwen3_next_80b_a3b_fsdp.sh's lengths and budget: 2048 + 20480 tokens
    "actor_rollout_ref.model.path=/m",
    "data.train_files=/d.parquet",
    "data.max_prompt_length=2048",
    "data.max_response_length=20480",
    "actor_rollout_ref.actor.use_dynamic_bsz=true",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=5632",
    "trainer.n_gpus_per_node=8",
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.model.use_remove_padding=true",
)


@pytest.mark.parametrize(
    "sp",
    [
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=4",
        # 2026-08's key, read by verl's engine workers (not by 2026-01's default legacy ones)
        "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=4 "
        "trainer.use_legacy_worker_impl=disable",
    ],
)
def test_a_budget_per_sequence_parallel_rank_holds_one_long_sample(sp):
    """5632 tokens per rank × SP 4 = 22528 = one sample: verl runs it, so does temper."""
    config = load_config(V2601_PPO, [*LONG, *sp.split()]).config
    assert config.actor.ulysses_sequence_parallel_size == 4
    assert config.actor.max_token_len_per_device == 22528
    assert config.rollout.log_prob_max_token_len_per_device == 22528  # inherits the budget
    assert config.reference.log_prob_max_token_len_per_device == 22528


def test_a_budget_too_small_is_refused_in_tokens_per_rank():
    with pytest.raises(ConfigError) as err:
        load_config(V2601_PPO, [*LONG, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"])
    text = str(err.value)
    assert text.startswith("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    assert "11264 tokens = 5632 tokens per sequence-parallel rank" in text
    assert text.endswith("Fix: raise it to ≥ 11264")  # × 2 = 22528: what the user writes


def test_verl_09_reads_the_sequence_parallel_size_of_fsdp_config():
    """0.9 has no legacy workers: the role-level size (deprecated, 1) leaves it to
    fsdp_config's, and the budget follows."""
    data = composed(
        "ppo_trainer.yaml",
        "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=4",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=5632",
    )
    assert "use_legacy_worker_impl" not in data["trainer"]
    actor = native(data)["actor"]
    assert actor["ulysses_sequence_parallel_size"] == 4
    assert actor["max_token_len_per_device"] == 22528


# ------------------------------------------------------------------ pkg:// search paths


def test_a_pkg_search_path_is_the_checkouts_package_directory():
    """verl's fully-async config composes ``ppo_trainer`` through
    ``hydra.searchpath: [pkg://verl.trainer.config]``: the checkout's verl/trainer/config."""
    path = V2608 / "verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml"
    raw = load_yaml(path)
    assert raw.data["model_engine"] == "dp"  # ppo_trainer.yaml's, through the search path
    assert raw.data["actor_rollout_ref"]["actor"]["strategy"] == "fsdp"
    assert raw.data["async_training"]["trigger_parameter_sync_step"] == 4  # the file's own
    assert any(
        "pkg://verl.trainer.config" in n and n.endswith(str(CONFIG.resolve())) for n in raw.notes
    )


# ------------------------------------------------------ engine, optimizer and rollout keys

AOPT = "actor_rollout_ref.actor.optim"


def test_zero_indexed_step_false_counts_verls_cosine_schedule_from_one():
    cosine = native(
        composed(
            "ppo_trainer.yaml",
            f"{AOPT}.lr_scheduler_type=cosine",
            f"{AOPT}.zero_indexed_step=false",
        )
    )
    assert cosine["actor"]["optim"]["zero_indexed_step"] is False
    constant = composed("ppo_trainer.yaml", f"{AOPT}.zero_indexed_step=false")
    assert "zero_indexed_step" not in native(constant)["actor"].get("optim", {})
    assert any("zero_indexed_step" in n and "constant schedule" in n for n in notes(constant))


def test_the_critics_v09_fsdp_section_sets_the_critics_engine():
    data = composed(
        "ppo_trainer.yaml",
        "algorithm.adv_estimator=gae",
        "critic.fsdp.param_offload=true",
        "critic.fsdp.optimizer_offload=true",
    )
    critic = native(data)["critic"]
    assert critic["fsdp"]["param_offload"] is True and critic["fsdp"]["optimizer_offload"] is True


def test_entropy_chunking_reads_verl_09s_chunk_size():
    data = composed(
        "ppo_trainer.yaml",
        "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true",
        "actor_rollout_ref.actor.entropy_from_logits_chunk_size=512",
    )
    assert native(data)["actor"]["entropy_chunk_size"] == 512


def test_the_adam_epsilon_of_verl_09_arrives():
    assert native(composed("ppo_trainer.yaml", f"{AOPT}.eps=1e-6"))["actor"]["optim"]["eps"] == 1e-6


@pytest.mark.parametrize(
    ("override", "words"),
    [
        (f"{AOPT}.use_precision_aware_optimizer=true", "precision-aware optimizer"),
        ("actor_rollout_ref.actor.fsdp_config.qat.enable=true", "quantization-aware"),
        ("actor_rollout_ref.rollout.full_determinism=true", "per-request seeded"),
        ("actor_rollout_ref.rollout.nnodes=2", "separate_async trainer only"),
        ("actor_rollout_ref.rollout.disaggregation.enabled=true", "disaggregation"),
        ("actor_rollout_ref.actor.policy_loss.tau_pos=1.0", "actor_rollout_ref.actor.tau_pos"),
        ("data.mm_processor_kwargs={max_pixels:1024}", "processor keyword"),
        ("skip.rollout.enable=true", "dumped rollouts"),
        ("algorithm.filter_groups.max_inflight_gen_batches=2", "in flight"),
        ("critic.loss_scale_factor=2.0", "loss_scale_factor"),
    ],
)
def test_verl_09_settings_temper_cannot_honour_are_refused_in_one_line(override, words):
    with pytest.raises(ConfigError) as err:
        native(composed("ppo_trainer.yaml", override))
    text = str(err.value)
    assert text.startswith(override.split("=")[0].rsplit(".enable", 1)[0]) and words in text
    assert "\n" not in text


def test_the_v09_optimizer_and_engine_keys_are_noted_at_their_off_values():
    text = "\n".join(notes(composed("ppo_trainer.yaml")))
    for key in (
        "actor_rollout_ref.actor.fsdp_config.pad_to_length",
        "actor_rollout_ref.actor.fsdp_config.qat.enable",
        "actor_rollout_ref.rollout.disaggregation.enabled",
        "critic.fsdp.qat.enable",
    ):
        assert key in text, key


def test_non_strict_loading_is_noted_as_temper_loading_strictly():
    data = composed("ppo_trainer.yaml", "actor_rollout_ref.actor.checkpoint.strict=false")
    assert any("checkpoint.strict" in n and "loads checkpoints strictly" in n for n in notes(data))


def test_audio_rows_have_a_column_name():
    assert (
        native(composed("ppo_trainer.yaml", "data.audio_key=speech"))["data"]["audio_key"]
        == "speech"
    )


@pytest.mark.parametrize(
    ("override", "words"),
    [
        (f"{AOPT}.use_precision_aware_optimizer=true", "precision-aware optimizer"),
        ("actor_rollout_ref.actor.megatron.use_megatron_fsdp=true", "Megatron-FSDP"),
        ("actor_rollout_ref.actor.megatron.dynamic_context_parallel=true", "dynamic context"),
    ],
)
def test_verl_09_megatron_settings_temper_cannot_honour_are_refused(override, words):
    with pytest.raises(ConfigError) as err:
        native(composed("ppo_megatron_trainer.yaml", override))
    assert str(err.value).startswith(override.split("=")[0]) and words in str(err.value)


def test_the_muon_options_are_inert_while_adam_is_the_optimizer():
    text = "\n".join(notes(composed("ppo_megatron_trainer.yaml", f"{AOPT}.muon_momentum=0.9")))
    assert f"{AOPT}.muon_momentum" in text and "Muon optimizer only" in text


def test_the_gdpo_reward_manager_scores_as_naive_and_icepop_thresholds_arrive():
    data = composed(
        "ppo_trainer.yaml",
        "reward.reward_manager.name=gdpo",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=0.5_4.0",
    )
    out = native(data)
    assert out["reward"]["reward_manager"] == "naive"
    assert (out["actor"]["rollout_is_threshold_low"], out["actor"]["rollout_is_threshold"]) == (
        0.5,
        4.0,
    )
    assert any("gdpo scores as naive" in n for n in notes(data))


# ------------------------------------------------------------------ rollout.enable_sleep_mode


@pytest.mark.parametrize(
    ("sleep", "free", "expected"), [(False, True, False), (True, True, True), (True, False, False)]
)
def test_an_engine_built_without_sleep_mode_never_frees_its_cache(sleep, free, expected):
    """verl 0.9 builds vLLM with ``enable_sleep_mode`` and sleeps it when
    ``free_cache_engine``: an engine without sleep mode keeps its memory."""
    data = composed("ppo_trainer.yaml")
    data["actor_rollout_ref"]["rollout"]["enable_sleep_mode"] = sleep
    data["actor_rollout_ref"]["rollout"]["free_cache_engine"] = free
    assert native(data)["rollout"]["free_cache_engine"] is expected


def test_a_logger_list_quoted_into_one_string_is_refused_as_a_string():
    data = composed("ppo_trainer.yaml")
    data["trainer"]["logger"] = "[console,wandb]"
    with pytest.raises(ConfigError, match="not a list") as err:
        native(data)
    assert "trainer.logger=[console,wandb]" in str(err.value)
