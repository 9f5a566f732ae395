"""What ``temper check`` / ``temper train`` refuse before loading anything, beyond the
config layer: combinations the driver cannot honour, each in one line with its key."""

from __future__ import annotations

from typing import Any

import pytest

from temper.config.errors import ConfigError
from temper.pipelines.catalog import build_config

RLVR = {"model": {"path": "m"}, "data": {"train_files": ["t.parquet"]}}
LAKE = {"env_type": "frozen_lake", "env_config": {"size": 4}}
AGENTIC = {
    "pipeline": "agentic",
    "model": {"path": "m"},
    "experiment": {"max_steps": 2},
    "actor": {"mini_batch_size": 4},
    "agentic": {
        "train_env_manager": {"num_env_groups": 2, "group_size": 2, "tags": ["T"]},
        "val_env_manager": {"num_env_groups": 1, "group_size": 1, "tags": ["T"]},
        "custom_envs": {"T": LAKE},
    },
}


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


TEACHER = {"distill": {"teachers": {"big": {"model_path": "teacher"}}}}
# one Ulysses group of 2 ranks
SP = {
    "actor": {"strategy": "fsdp2", "ulysses_sequence_parallel_size": 2},
    "resources": {"backend": "ray", "devices_per_node": 2},
}
SP_RLVR = merged(RLVR, SP)
REFUSED = [
    # what compares whole sequences' logits, and a reference of odd devices
    (
        SP_RLVR,
        {"distill": {**TEACHER["distill"], "direct_gradient": True, "kl_penalty": "low_var_kl"}},
        "actor.ulysses_sequence_parallel_size",
    ),
    (
        SP_RLVR,
        {
            "actor": {"use_kl_loss": True},
            "reference": {"strategy": "fsdp2"},
            "resources": {"devices_per_node": 4, "actor_train": [0, 1], "reference": [1, 2, 3]},
        },
        "actor.ulysses_sequence_parallel_size",
    ),
    (
        merged({**RLVR, "pipeline": "distill"}, SP),
        {"distill": {"teachers": {"default": {"model_path": "t"}}}},
        "actor.ulysses_sequence_parallel_size",
    ),
    (RLVR, {"distill": {**TEACHER["distill"], "kl_penalty": "full"}}, "distill.kl_penalty"),
    (RLVR, {**TEACHER, "algorithm": {"adv_estimator": "gae"}}, "distill.pure"),
    # direct gradient (GKD): k1's gradient does not see the teacher; top-k only so
    (RLVR, {"distill": {**TEACHER["distill"], "direct_gradient": True}}, "distill.kl_penalty"),
    (RLVR, {"distill": {**TEACHER["distill"], "topk": 8}}, "distill.topk"),
    (
        RLVR,
        {"distill": {**TEACHER["distill"], "direct_gradient": True, "topk": -1}},
        "distill.topk",
    ),
    ({**RLVR, "pipeline": "sft"}, TEACHER, "distill"),
    (RLVR, {"algorithm": {"use_reward_norm": True}}, "algorithm.use_reward_norm"),
    (
        RLVR,
        {"algorithm": {"use_reward_scaling": True, "reward_norm": "batch"}},
        "algorithm.use_reward_scaling",
    ),
    (RLVR, {"algorithm": {"filter_groups": {"metric": "acc"}}}, "algorithm.filter_groups.metric"),
    (RLVR, {"data": {"gen_batch_size": 16}}, "data.gen_batch_size"),  # no filter
    (
        RLVR,
        {"data": {"gen_batch_size": 4}, "algorithm": {"filter_groups": {"enable": True}}},
        "data.gen_batch_size",  # fewer than train_batch_size (8)
    ),
    (
        RLVR,
        {"actor": {"use_kl_loss": True, "kl_loss_type": "full"}, "resources": {"backend": "ray"}},
        "actor.kl_loss_type",
    ),
    (
        RLVR,
        {"actor": {"use_kl_loss": True, "kl_loss_type": "full", "strategy": "megatron"}},
        "actor.kl_loss_type",
    ),
    (
        RLVR,
        {
            "algorithm": {"use_kl_in_reward": True, "kl_penalty": "full"},
            "reference": {"strategy": "megatron"},
        },
        "algorithm.kl_penalty",
    ),
    (RLVR, {"resources": {"ray": {"timeline_json_file": "t.json"}}}, "timeline_json_file"),
    (RLVR, {"agentic": {"use_turn_rewards": True}}, "agentic"),
    (RLVR, {"experiment": {"render_save_dir": "r"}}, "experiment.render_save_dir"),
    (RLVR, {"reward": {"launch_async": True}}, "reward.launch_async"),
    (AGENTIC, {"experiment": {"max_steps": None}}, "experiment.max_steps"),
    (
        AGENTIC,
        {"algorithm": {"overlong_buffer": {"enable": True, "len": 4}}},
        "algorithm.overlong_buffer.enable",
    ),
    (
        AGENTIC,
        {"algorithm": {"add_len_reward": True}, "agentic": {"use_turn_rewards": True}},
        "algorithm.add_len_reward",
    ),
    # estimators whose inputs the run cannot provide (Σπ² turned off, or asked for an
    # estimator that does not read it); GDPO's components and what would shape a reward it
    # does not read; a policy loss without its parameter
    (
        RLVR,
        {
            "algorithm": {"adv_estimator": "optimal_token_baseline"},
            "actor": {"calculate_sum_pi_squared": False},
        },
        "actor.calculate_sum_pi_squared",
    ),
    (RLVR, {"actor": {"calculate_sum_pi_squared": True}}, "actor.calculate_sum_pi_squared"),
    (
        RLVR,
        {
            "algorithm": {"adv_estimator": "optimal_token_baseline"},
            "actor": {"recompute_old_log_prob": False},
            "rollout": {"calculate_log_probs": True},
        },
        "actor.recompute_old_log_prob",
    ),
    (AGENTIC, {"algorithm": {"adv_estimator": "remax"}}, "baseline_rewards"),
    (
        AGENTIC,
        {"algorithm": {"adv_estimator": "gdpo", "gdpo_reward_keys": ["acc"]}},
        "reward_components",
    ),
    (RLVR, {"algorithm": {"adv_estimator": "gdpo"}}, "algorithm.gdpo_reward_keys"),
    # an estimator's own parameter set while another estimator runs: read by nothing
    (RLVR, {"algorithm": {"sppo_beta": 0.5}}, "algorithm.sppo_beta"),
    (RLVR, {"algorithm": {"gdpo_reward_keys": ["acc"]}}, "algorithm.gdpo_reward_keys"),
    (
        RLVR,
        {"algorithm": {"adv_estimator": "gdpo", "gdpo_reward_keys": ["acc", "acc"]}},
        "algorithm.gdpo_reward_keys",
    ),
    (
        RLVR,
        {
            "algorithm": {
                "adv_estimator": "gdpo",
                "gdpo_reward_keys": ["a", "f"],
                "gdpo_reward_weights": [1.0],
            }
        },
        "algorithm.gdpo_reward_weights",
    ),
    *[
        (
            RLVR,
            merged({"algorithm": {"adv_estimator": "gdpo", "gdpo_reward_keys": ["a"]}}, over),
            key,
        )
        for over, key in (
            ({"algorithm": {"use_kl_in_reward": True}}, "algorithm.use_kl_in_reward"),
            ({"algorithm": {"whiten_rewards": True}}, "algorithm.whiten_rewards"),
            ({"algorithm": {"reward_norm": "group"}}, "algorithm.reward_norm"),
            ({"algorithm": {"use_reward_scaling": True}}, "algorithm.use_reward_scaling"),
            ({"algorithm": {"reward_clip": 1.0}}, "algorithm.reward_clip"),
            (
                {"algorithm": {"overlong_buffer": {"enable": True, "len": 4}}},
                "algorithm.overlong_buffer.enable",
            ),
            ({"algorithm": {"add_len_reward": True}}, "algorithm.add_len_reward"),
            ({"reward": {"format_penalty": -1.0}}, "reward.format_penalty"),
            ({"reward": {"model": {"enable": True, "path": "rm"}}}, "reward.model.enable"),
        )
    ],
    (RLVR, {"actor": {"policy_loss": "dro"}}, "actor.policy_loss_kwargs.dro_beta"),
    (
        RLVR,
        {"actor": {"policy_loss": "dro", "policy_loss_kwargs": {"dro_beta": -0.1}}},
        "actor.policy_loss_kwargs.dro_beta",
    ),
    (RLVR, {"actor": {"policy_loss_kwargs": {"dro_bta": 0.1}}}, "actor.policy_loss_kwargs.dro_bta"),
    (AGENTIC, {"rollout": {"n": 4}}, "rollout.n"),
    (AGENTIC, {"data": {"train_files": ["t.parquet"]}}, "data.train_files"),
    (AGENTIC, {"data": {"gen_batch_size": 8}}, "data.gen_batch_size"),
    # an agentic run's rewards are its environments': a reward model would score nothing
    (AGENTIC, {"reward": {"model": {"enable": True, "path": "rm"}}}, "reward.model.enable"),
    # IS weights to normalize: none without rollout_is; reinforce_is's own at a level only
    (RLVR, {"actor": {"rollout_is_batch_normalize": True}}, "actor.rollout_is_batch_normalize"),
    (
        RLVR,
        {"actor": {"policy_loss_kwargs": {"reinforce_is_batch_normalize": True}}},
        "actor.policy_loss_kwargs.reinforce_is_batch_normalize",
    ),
]


@pytest.mark.parametrize(("base", "over", "key"), REFUSED, ids=[r[2] for r in REFUSED])
def test_refused_with_the_key(base, over, key):
    with pytest.raises(ConfigError) as err:
        build_config(merged(base, over))
    assert key in str(err.value) and err.value.fix and "\n" not in str(err.value)


ACCEPTED = [
    (SP_RLVR, {}),
    (SP_RLVR, {"actor": {"router_replay": "R2"}}),  # routing splits as the columns do
    (SP_RLVR, {"actor": {"use_kl_loss": True}, "reference": {"strategy": "fsdp2"}}),
    (RLVR, {"algorithm": {"use_reward_scaling": True, "use_reward_norm": True}}),
    (RLVR, {"data": {"gen_batch_size": 12}, "algorithm": {"filter_groups": {"enable": True}}}),
    (RLVR, {"algorithm": {"use_kl_in_reward": True, "kl_penalty": "full"}}),
    (RLVR, {"algorithm": {"use_pf_ppo": True, "difficulty_mask": True, "max_len_mask": True}}),
    (RLVR, {"algorithm": {"adv_estimator": "remax"}}),
    (RLVR, {"algorithm": {"adv_estimator": "optimal_token_baseline"}}),
    (
        AGENTIC,
        {
            "algorithm": {"adv_estimator": "tir_optimal_token_baseline"},
            "actor": {"calculate_sum_pi_squared": True},
        },
    ),
    (
        RLVR,
        {
            "algorithm": {
                "adv_estimator": "gdpo",
                "gdpo_reward_keys": ["accuracy_reward", "format_reward"],
                "gdpo_reward_weights": [1.0, 0.5],
                "filter_groups": {"enable": True},
                "whiten_advantages": True,
            },
            "actor": {"use_kl_loss": True},
        },
    ),
    (RLVR, {"actor": {"policy_loss": "dro", "policy_loss_kwargs": {"dro_beta": 0.1}}}),
    (RLVR, {"actor": {"policy_loss": "dppo_tv", "clip_ratio": 0.15, "clip_ratio_c": 10000.0}}),
    (RLVR, {"actor": {"policy_loss": "dppo_kl", "clip_ratio": 0.05}}),
    (
        RLVR,
        {
            "actor": {
                "policy_loss": "reinforce_is",
                "recompute_old_log_prob": False,
                "policy_loss_kwargs": {
                    "reinforce_is_level": "sequence",
                    "reinforce_is_batch_normalize": True,
                },
            },
            "rollout": {"calculate_log_probs": True},
        },
    ),
    (
        RLVR,
        {
            "algorithm": {"adv_estimator": "sppo", "sppo_beta": 0.5},
            "actor": {"policy_loss": "sppo", "policy_loss_kwargs": {"sppo_eta": 2.0}},
        },
    ),
    (AGENTIC, {"algorithm": {"adv_estimator": "sppo", "sppo_beta": 0.0}}),
    (AGENTIC, {"algorithm": {"add_len_reward": True, "filter_groups": {"enable": True}}}),
    (AGENTIC, {"algorithm": {"use_reward_scaling": True, "length_loss_weight": True}}),
]


@pytest.mark.parametrize(("base", "over"), ACCEPTED)
def test_accepted(base, over):
    build_config(merged(base, over))
