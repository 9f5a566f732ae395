"""The ROLL dialect: every ROLL key is mapped, noted, or rejected with its reason."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from reference_paths import UPSTREAM as REFERENCE_CONFIGS  # next to this file
from reference_paths import needs

from temper.config.dialects.roll.translate import parse_device_mapping, translate_roll
from temper.config.errors import ConfigError
from temper.config.loader import RawConfig, load_yaml
from temper.config.schema import TemperConfig
from temper.config.typed import from_dict, to_dict

REPO = Path(__file__).resolve().parents[3]
UPSTREAM = REFERENCE_CONFIGS / "roll-v0"
UPSTREAM_FILES = [
    UPSTREAM / "qwen2.5-7B-rlvr_megatron/rlvr_config.yaml",
    UPSTREAM / "qwen2.5-0.5B-agentic_ds/agentic_val_sokoban.yaml",
]
# The upstream RLVR file translates with all five reward domains.
RLVR_DROP: list[str] = []
EXAMPLES = [REPO / "examples/roll_rlvr.yaml", REPO / "examples/roll_agentic_sokoban.yaml"]
W = "roll.pipeline.rlvr.rewards."
DS = {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}
MEGA = {"actor_train": {"strategy_args": {"strategy_name": "megatron_train"}}}
VLLM = {"actor_infer": {"strategy_args": {"strategy_name": "vllm"}}}
SGL = {"actor_infer": {"strategy_args": {"strategy_name": "sglang"}}}
REF_MEGA = {"reference": {"strategy_args": {"strategy_name": "megatron_infer"}}}
MATH = {"rewards": {"r": {"worker_cls": W + "math_rule_reward_worker.MathRuleRewardWorker"}}}
JUDGE = {"rewards": {"j": {"worker_cls": W + "llm_judge_reward_worker.LLMJudgeRewardWorker"}}}
CODE_REMOTE = {
    "rewards": {
        "c": {
            "worker_cls": W + "code_sandbox_reward_worker.CodeSandboxRewardWorker",
            "use_local": False,
        }
    }
}
CROSS = {
    "rewards": {
        "c": {"worker_cls": W + "crossthinkqa_rule_reward_worker.CrossThinkQARuleRewardWorker"}
    }
}
GRPO = {"adv_estimator": "grpo"}


def query_filter(kind: str, **args: Any) -> dict[str, Any]:
    """MATH with a query filter on its domain (ROLL dynamic sampling)."""
    spec = {"type": kind, **({"filter_args": args} if args else {})}
    return merge(MATH, {"rewards": {"r": {"query_filter_config": spec}}})


ENVS = {"train_env_manager": {"tags": ["S"]}}


def nest(path: str, value: Any, into: dict[str, Any] | None = None) -> dict[str, Any]:
    out = copy.deepcopy(into or {})
    node = out
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return out


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def run(data: dict[str, Any], from_defaults: set[str] | None = None):
    t = translate_roll(RawConfig(data=data, source="<test>", from_defaults=from_defaults or set()))
    return from_dict(TemperConfig, t.native), t.notes


def native_get(cfg: TemperConfig, path: str) -> Any:
    node: Any = to_dict(cfg)
    for part in path.split("."):
        node = node[part]
    return node


# (ROLL key, value, native key, expected, extra context)
MAPPED = [
    ("exp_name", "e1", "experiment.experiment_name", "e1", {}),
    ("seed", 7, "experiment.seed", 7, {}),
    ("rpc_timeout", 99, "resources.ray.rpc_timeout", 99.0, {}),
    ("output_dir", "/o", "experiment.output_dir", "/o", {}),
    ("render_save_dir", "/r", "experiment.render_save_dir", "/r", {}),
    ("system_envs", {"A": 1}, "resources.ray.system_envs", {"A": "1"}, {}),
    ("track_with", "wandb", "experiment.trackers", ["wandb", "jsonl"], {}),
    ("track_with", "tensorboard", "experiment.trackers", ["tensorboard", "jsonl"], {}),
    ("track_with", "stdout", "experiment.trackers", ["console", "jsonl"], {}),
    ("track_with", "swanlab", "experiment.trackers", ["swanlab", "jsonl"], {}),
    ("track_with", "trackio", "experiment.trackers", ["trackio", "jsonl"], {}),
    ("tracker_kwargs", {"log_dir": "/t"}, "experiment.tracker_kwargs", {"log_dir": "/t"}, {}),
    ("num_gpus_per_node", 4, "resources.devices_per_node", 4, {}),
    ("num_nodes", 2, "resources.nnodes", 2, {}),
    ("max_steps", 77, "experiment.max_steps", 77, {}),
    ("save_steps", 13, "experiment.save_freq", 13, {}),
    ("logging_steps", 3, "experiment.logging_steps", 3, {}),
    ("eval_steps", 9, "experiment.test_freq", 9, {}),
    ("resume_from_checkpoint", False, "experiment.resume_mode", "disable", {}),
    ("resume_from_checkpoint", True, "experiment.resume_mode", "auto", {}),
    ("resume_from_checkpoint", "/ck", "experiment.resume_from_path", "/ck", {}),
    ("checkpoint_config.output_dir", "/c", "experiment.checkpoint_dir", "/c", {}),
    ("max_ckpt_to_keep", 3, "experiment.max_actor_ckpt_to_keep", 3, {}),
    ("rollout_batch_size", 33, "data.train_batch_size", 33, {}),
    ("val_batch_size", 17, "data.val_batch_size", 17, {}),
    ("prompt_length", 300, "data.max_prompt_length", 300, {}),
    ("response_length", 400, "rollout.response_length", 400, {}),
    ("sequence_length", 1000, "rollout.max_model_len", 1000, {}),
    ("sequence_length", 1000, "rollout.response_length", 700, {"prompt_length": 300}),
    ("num_return_sequences_in_group", 5, "rollout.n", 5, {}),
    ("max_running_requests", 64, "rollout.max_num_seqs", 64, {}),
    ("ppo_epochs", 3, "actor.ppo_epochs", 3, {}),
    ("ppo_epochs", 3, "critic.ppo_epochs", 3, {}),
    ("max_grad_norm", 0.7, "actor.grad_clip", 0.7, {}),
    ("l2", 0.01, "actor.l2_coef", 0.01, {}),
    ("lambd", 0.9, "algorithm.lam", 0.9, {}),
    ("gamma", 0.98, "algorithm.gamma", 0.98, {}),
    ("kl_penalty", "abs", "algorithm.kl_penalty", "abs", {}),
    ("init_kl_coef", 0.05, "algorithm.kl_ctrl.kl_coef", 0.05, {}),
    ("kl_horizon", 500, "algorithm.kl_ctrl.horizon", 500, {}),
    ("target_kl", 0.3, "algorithm.kl_ctrl.target_kl", 0.3, {}),
    ("target_kl", 0.3, "algorithm.kl_ctrl.type", "adaptive", {}),
    ("use_reward_scaling", True, "algorithm.use_reward_scaling", True, {}),
    ("use_reward_norm", True, "algorithm.use_reward_norm", True, {}),
    ("add_len_reward", True, "algorithm.add_len_reward", True, {}),
    ("reward_clip", 5.0, "algorithm.reward_clip", 5.0, {}),
    ("difficulty_loss_weight", True, "algorithm.difficulty_loss_weight", True, {}),
    ("length_loss_weight", True, "algorithm.length_loss_weight", True, {}),
    ("whiten_rewards", True, "algorithm.whiten_rewards", True, {}),
    ("whiten_advantages", True, "algorithm.whiten_advantages", True, {}),
    ("advantage_clip", 2.5, "algorithm.advantage_clip", 2.5, {}),
    # ROLL's grpo: group reward normalization, then the reinforce return
    ("adv_estimator", "grpo", "algorithm.adv_estimator", "reinforce", {}),
    ("adv_estimator", "grpo", "algorithm.reward_norm", "group", {}),
    ("reward_norm", None, "algorithm.reward_norm", "group", GRPO),
    ("adv_estimator", "grpo", "algorithm.reward_norm", "none", ENVS),  # agentic: no reward_norm
    ("adv_estimator", "reinforce", "algorithm.adv_estimator", "reinforce", {}),
    ("reward_norm", "group", "algorithm.reward_norm", "group", {}),
    ("reward_norm", None, "algorithm.reward_norm", "none", {}),
    ("reward_shift", True, "algorithm.reward_shift", True, {}),
    ("reward_scale", True, "algorithm.reward_scale", True, {}),
    ("add_token_level_kl", True, "algorithm.use_kl_in_reward", True, {}),
    ("critic_warmup", 4, "experiment.critic_warmup", 4, {}),
    ("use_kl_loss", True, "actor.use_kl_loss", True, {}),
    ("kl_loss_coef", 0.02, "actor.kl_loss_coef", 0.02, {}),
    ("entropy_loss_coef", 0.003, "actor.entropy_coeff", 0.003, {}),
    ("sft_loss_coef", 0.1, "actor.sft_loss_coef", 0.1, {}),
    ("use_topr_loss", True, "actor.policy_loss", "topr", {}),
    ("rl_loss_coef", 0.5, "actor.rl_loss_coef", 0.5, {}),
    ("dual_clip_loss", True, "actor.clip_ratio_c", pytest.approx(1.6), {"pg_clip": 0.3}),
    ("dual_clip_loss", False, "actor.clip_ratio_c", None, {}),
    ("loss_agg_mode", "token-mean", "actor.loss_agg_mode", "token-mean", {}),
    ("value_clip", 0.25, "critic.cliprange_value", 0.25, {}),
    ("pg_clip", 0.15, "actor.clip_ratio", 0.15, {}),
    ("pg_clip_low", 0.1, "actor.clip_ratio_low", 0.1, {"use_pg_clip_range": True}),
    ("max_len_mask", True, "algorithm.max_len_mask", True, {}),
    ("difficulty_mask", True, "algorithm.difficulty_mask", True, {}),
    ("difficulty_low_threshold", 0.2, "algorithm.difficulty_low_threshold", 0.2, {}),
    ("difficulty_high_threshold", 0.8, "algorithm.difficulty_high_threshold", 0.8, {}),
    ("pretrain", "p/m", "model.path", "p/m", {}),
    ("reward_pretrain", "r/m", "critic.model_path", "r/m", {}),
    # agentic
    ("train_env_manager.env_groups", 16, "pipeline", "agentic", {}),
    ("max_actions_per_traj", 7, "agentic.max_actions_per_traj", 7, {}),
    ("use_turn_scores", True, "agentic.use_turn_rewards", True, {}),
    ("enable_think", True, "agentic.enable_think", True, {}),
    ("action_sep", ",", "agentic.action_sep", ",", {}),
    ("reward_normalization.grouping", "tags", "agentic.reward_normalization.grouping", "tag", {}),
    (
        "reward_normalization.method",
        "mean_std",
        "agentic.reward_normalization.method",
        "mean_std",
        {},
    ),
    ("custom_envs.S.env_type", "frozen_lake", "agentic.custom_envs.S.env_type", "frozen_lake", {}),
    ("custom_envs.S.max_actions_per_traj", 6, "agentic.custom_envs.S.max_turns", 6, {}),
    ("custom_envs.S.max_steps_per_traj", 6, "agentic.custom_envs.S.max_turns", 6, {}),
    ("custom_envs.S.env_instruction", "go", "agentic.custom_envs.S.env_instruction", "go", {}),
    ("custom_envs.S.max_tokens", 100, "agentic.custom_envs.S.max_words", 100, {}),
    (
        "custom_envs.S.env_config",
        {"dim_x": 5},
        "agentic.custom_envs.S.env_config",
        {"dim_x": 5},
        {},
    ),
    ("custom_envs.S.env_config", None, "agentic.custom_envs.S.env_config", {}, {}),
    (
        "actor_infer.generating_args.max_new_tokens",
        32,
        "agentic.custom_envs.S.max_tokens_per_turn",
        32,
        {**ENVS, "custom_envs": {"S": {}}},
    ),
]
for _m, _b in (("train_env_manager", "rollout_batch_size"), ("val_env_manager", "val_batch_size")):
    _d = f"agentic.{_m}"
    MAPPED += [  # batch = envs: each env plays one episode per step
        (f"{_m}.env_groups", 16, f"{_d}.num_env_groups", 16, {_b: 16}),
        (f"{_m}.num_env_groups", 16, f"{_d}.num_env_groups", 16, {_b: 16}),
        (f"{_m}.group_size", 4, f"{_d}.group_size", 4, {_b: 512}),
        (f"{_m}.tags", ["A", "B"], f"{_d}.tags", ["A", "B"], {}),
        (f"{_m}.n_groups", [8, 8], f"{_d}.n_groups", [8, 8], {}),
        (f"{_m}.num_groups_partition", [8, 8], f"{_d}.n_groups", [8, 8], {}),
        (f"{_m}.max_traj_per_env", 3, f"{_d}.max_traj_per_env", 3, {}),
        (f"{_m}.format_penalty", -0.5, f"{_d}.format_penalty", -0.5, {}),
    ]
# ROLL dynamic sampling: query filters and extra prompts → filter_groups, gen_batch_size
MAPPED += [
    (
        "rewards.r.query_filter_config.type",
        "std_filter",
        "algorithm.filter_groups.enable",
        True,
        MATH,
    ),
    (
        "rewards.r.query_filter_config.filter_args",
        {"std_threshold": 0.1},
        "algorithm.filter_groups.std_threshold",
        0.1,
        query_filter("std_filter"),
    ),
    (
        "rewards.r.query_filter_config.filter_args",
        {"threshold_up": 0.9, "threshold_down": 0.1},
        "algorithm.filter_groups.mean_high",
        0.9,
        query_filter("mean_filter"),
    ),
    (
        "is_use_additional_prompts",
        True,
        "data.gen_batch_size",
        24,
        {**query_filter("std_filter"), "rollout_batch_size": 8},
    ),
    (
        "max_additional_running_prompts",
        4,
        "data.gen_batch_size",
        12,
        {**query_filter("std_filter"), "rollout_batch_size": 8, "is_use_additional_prompts": True},
    ),
]

MAPPED += [
    (f"{_m}.env_groups", 16, f"{_d}.num_env_groups", 16, {}),
    (f"{_m}.num_env_groups", 16, f"{_d}.num_env_groups", 16, {}),
    (f"{_m}.group_size", 4, f"{_d}.group_size", 4, {}),
    (f"{_m}.tags", ["A", "B"], f"{_d}.tags", ["A", "B"], {}),
    (f"{_m}.n_groups", [8, 8], f"{_d}.n_groups", [8, 8], {}),
    (f"{_m}.num_groups_partition", [8, 8], f"{_d}.n_groups", [8, 8], {}),
    (f"{_m}.max_traj_per_env", 3, f"{_d}.max_traj_per_env", 3, {}),
    (f"{_m}.format_penalty", -0.5, f"{_d}.format_penalty", -0.5, {}),
]
MAPPED += [
    # actor_train
    ("actor_train.model_args.dtype", "fp16", "model.dtype", "fp16", {}),
    (
        "actor_train.model_args.disable_gradient_checkpointing",
        True,
        "model.enable_gradient_checkpointing",
        False,
        {},
    ),
    (
        "actor_train.model_args.flash_attn",
        "fa2",
        "model.attn_implementation",
        "flash_attention_2",
        {},
    ),
    ("actor_train.model_args.model_name_or_path", "a/b", "model.path", "a/b", {"pretrain": "p"}),
    ("actor_train.training_args.learning_rate", 3e-6, "actor.optim.lr", 3e-6, {}),
    ("actor_train.training_args.weight_decay", 0.05, "actor.optim.weight_decay", 0.05, {}),
    (
        "actor_train.training_args.per_device_train_batch_size",
        3,
        "actor.micro_batch_size_per_device",
        3,
        {},
    ),
    (
        "actor_train.training_args.gradient_accumulation_steps",
        5,
        "actor.mini_batch_size",
        10,
        {"actor_train": {"device_mapping": "list(range(0,2))"}},
    ),
    ("actor_train.training_args.warmup_steps", 11, "actor.optim.warmup_steps", 11, {}),
    (
        "actor_train.training_args.lr_scheduler_type",
        "cosine",
        "actor.optim.lr_scheduler",
        "cosine",
        {},
    ),
    ("actor_train.data_args.template", "native", "data.chat_template", "native", {}),
    ("actor_train.data_args.template", "qwen2_5", "data.chat_template", "native", {}),
    ("actor_train.data_args.file_name", "x.jsonl", "data.train_files", ["x.jsonl"], {}),
    (
        "actor_train.data_args.file_name",
        ["a.json", "b.csv"],
        "data.train_files",
        ["a.json", "b.csv"],
        {},
    ),
    (
        "actor_train.data_args.dataset_dir",
        "d",
        "data.train_files",
        ["d/x.jsonl", "d/y.jsonl"],
        {"actor_train": {"data_args": {"file_name": ["x.jsonl", "d/y.jsonl"]}}},
    ),
    ("actor_train.data_args.prompt", "instruction", "data.prompt_key", "instruction", {}),
    ("actor_train.data_args.messages", "msgs", "data.messages_key", "msgs", {}),
    (
        "actor_train.data_args.domain_interleave_probs",
        {"a": 0.7, "b": 0.3},
        "data.source_weights",
        {"a": 0.7, "b": 0.3},
        {},
    ),
    ("actor_train.strategy_args.strategy_name", "megatron_train", "actor.strategy", "megatron", {}),
    (
        "actor_train.strategy_args.strategy_name",
        "deepspeed_train",
        "actor.strategy",
        "deepspeed",
        {},
    ),
    ("actor_train.strategy_args.strategy_name", "fsdp2_train", "actor.strategy", "fsdp2", {}),
    (
        "actor_train.strategy_args.strategy_config",
        DS,
        "actor.deepspeed",
        DS,
        {"actor_train": {"strategy_args": {"strategy_name": "deepspeed_train"}}},
    ),
    ("actor_train.device_mapping", "list(range(0,4))", "resources.actor_train", [0, 1, 2, 3], {}),
    ("actor_train.device_mapping", "list(range(0,4))", "resources.backend", "ray", {}),
    ("actor_train.device_mapping", "[0]", "resources.backend", "local", {}),
    ("actor_train.infer_batch_size", 6, "actor.log_prob_micro_batch_size_per_device", 6, {}),
    ("actor_train.model_update_frequency", 2, "rollout.model_update_frequency", 2, {}),
    ("model_update_buffer_size_mb", 64, "rollout.update_weights_bucket_megabytes", 64, {}),
    ("actor_train.system_envs", {"B": "2"}, "resources.ray.system_envs", {"B": "2"}, {}),
    # the env managers' workers start with theirs too (their Use row names the placement)
    ("train_env_manager.system_envs", {"C": 3}, "resources.ray.system_envs", {"C": "3"}, ENVS),
    # actor_infer
    ("actor_infer.model_args.dtype", "bf16", "rollout.dtype", "bf16", {}),
    ("actor_infer.generating_args.max_new_tokens", 123, "rollout.response_length", 123, {}),
    ("actor_infer.generating_args.temperature", 0.7, "rollout.temperature", 0.7, {}),
    ("actor_infer.generating_args.top_p", 0.9, "rollout.top_p", 0.9, {}),
    ("actor_infer.generating_args.top_k", 20, "rollout.top_k", 20, {}),
    (
        "actor_infer.generating_args.num_return_sequences",
        4,
        "rollout.n",
        4,
        {"num_return_sequences_in_group": 4},
    ),
    ("actor_infer.strategy_args.strategy_name", "vllm", "rollout.engine", "vllm", {}),
    ("actor_infer.strategy_args.strategy_name", "sglang", "rollout.engine", "sglang", {}),
    ("actor_infer.strategy_args.strategy_name", "hf_infer", "rollout.engine", "hf", {}),
    (
        "actor_infer.strategy_args.strategy_config.gpu_memory_utilization",
        0.6,
        "rollout.gpu_memory_utilization",
        0.6,
        VLLM,
    ),
    ("actor_infer.strategy_args.strategy_config.block_size", 32, "rollout.block_size", 32, VLLM),
    (
        "actor_infer.strategy_args.strategy_config.max_model_len",
        8000,
        "rollout.max_model_len",
        8000,
        VLLM,
    ),
    (
        "actor_infer.strategy_args.strategy_config.load_format",
        "dummy",
        "rollout.load_format",
        "dummy",
        VLLM,
    ),
    (
        "actor_infer.strategy_args.strategy_config.mem_fraction_static",
        0.7,
        "rollout.gpu_memory_utilization",
        0.7,
        SGL,
    ),
    ("actor_infer.num_gpus_per_worker", 2, "resources.devices_per_infer_worker", 2, {}),
    ("actor_infer.num_gpus_per_worker", 2, "rollout.tensor_parallel_size", 2, {}),
    ("actor_infer.device_mapping", "list(range(0,2))", "resources.actor_infer", [0, 1], {}),
    ("actor_infer.infer_batch_size", 3, "rollout.infer_batch_size", 3, {}),
    ("actor_infer.model_update_frequency", 2, "rollout.model_update_frequency", 2, {}),
    # reference / critic
    (
        "reference.strategy_args.strategy_name",
        "megatron_infer",
        "reference.strategy",
        "megatron",
        {},
    ),
    ("reference.strategy_args.strategy_name", "hf_infer", "reference.strategy", "torch", {}),
    (
        "reference.strategy_args.strategy_config.tensor_model_parallel_size",
        2,
        "reference.megatron.tensor_model_parallel_size",
        2,
        REF_MEGA,
    ),
    ("reference.device_mapping", "list(range(0,2))", "resources.reference", [0, 1], {}),
    ("reference.infer_batch_size", 8, "reference.log_prob_micro_batch_size_per_device", 8, {}),
    ("critic.training_args.learning_rate", 1e-5, "critic.optim.lr", 1e-5, {}),
    ("critic.training_args.per_device_train_batch_size", 2, "critic.mini_batch_size", 2, {}),
    ("critic.strategy_args.strategy_name", "deepspeed_train", "critic.strategy", "deepspeed", {}),
    ("critic.device_mapping", "[2,3]", "resources.critic", [2, 3], {}),
    ("critic.model_args.model_name_or_path", "c/m", "critic.model_path", "c/m", {}),
    ("critic.infer_batch_size", 5, "critic.log_prob_micro_batch_size_per_device", 5, {}),
    # rewards
    (
        "rewards.r.worker_cls",
        W + "math_rule_reward_worker.MathRuleRewardWorker",
        "reward.routes.r.function",
        "math",
        {},
    ),
    (
        "rewards.r.worker_cls",
        W + "crossthinkqa_rule_reward_worker.CrossThinkQARuleRewardWorker",
        "reward.routes.r.function",
        "crossthinkqa",
        {},
    ),
    ("rewards.r.tag_included", ["t1"], "reward.routes.r.tags", ["t1"], MATH),
    ("rewards.c.reward_type", "strict", "reward.routes.c.kwargs.reward_type", "strict", CROSS),
    (
        "rewards.c.response_length_penalty_coef",
        0.1,
        "reward.routes.c.kwargs.response_length_penalty_coef",
        0.1,
        CROSS,
    ),
    ("rewards.r.world_size", 8, "reward.num_workers", 8, MATH),
    ("rewards.r.device_mapping", "list(range(12,14))", "resources.reward", [12, 13], MATH),
    # validation
    ("validation.data_args.file_name", ["v.jsonl"], "data.val_files", ["v.jsonl"], {}),
    ("validation.generating_args.temperature", 0.0, "rollout.val.do_sample", False, {}),
    ("validation.generating_args.temperature", 0.6, "rollout.val.temperature", 0.6, {}),
    ("validation.generating_args.top_p", 0.6, "rollout.val.top_p", 0.6, {}),
    ("validation.generating_args.top_k", 50, "rollout.val.top_k", 50, {}),
    ("validation.generating_args.num_return_sequences", 2, "rollout.val.n", 2, {}),
    ("validation.eval_steps", 5, "experiment.test_freq", 5, {}),
]
_MEGA_KEYS = [
    ("tensor_model_parallel_size", 2),
    ("pipeline_model_parallel_size", 2),
    ("expert_model_parallel_size", 4),
    ("context_parallel_size", 2),
    ("virtual_pipeline_model_parallel_size", 2),
    ("sequence_parallel", True),
    ("recompute_granularity", "selective"),
    ("use_distributed_optimizer", False),
    ("overlap_grad_reduce", True),
    ("overlap_param_gather", True),
    ("recompute_method", "uniform"),
    ("recompute_num_layers", 2),
    ("recompute_modules", ["core_attn", "mlp"]),
    ("expert_tensor_parallel_size", 1),
]
MAPPED += [
    (f"actor_train.strategy_args.strategy_config.{k}", v, f"actor.megatron.{k}", v, MEGA)
    for k, v in _MEGA_KEYS
]
MAPPED += [
    (f"actor_train.strategy_args.strategy_config.{k}", v, f"actor.megatron.extra.{k}", v, MEGA)
    for k, v in [
        ("moe_layer_recompute", True),
        ("moe_grouped_gemm", True),
        ("moe_token_dispatcher_type", "alltoall"),
        ("moe_shared_expert_overlap", True),
    ]
]

# ROLL's policy-gradient workers: pg_variant -> the native loss with the same formula
PG = {"actor_train": {"worker_cls": "roll.pipeline.rlvr.actor_pg_worker.ActorPGWorker"}}
PG_AGENTIC = {
    "actor_train": {"worker_cls": "roll.pipeline.agentic.agentic_actor_pg_worker.ActorWorker"}
}
MAPPED += [
    ("actor_train.worker_cls", PG["actor_train"]["worker_cls"], "actor.policy_loss", "gpg", {}),
    ("actor_train.pg_variant", "vanilla", "actor.policy_loss", "gpg", PG),
    ("actor_train.pg_variant", "vanilla", "actor.policy_loss", "gpg", PG_AGENTIC),
    ("actor_train.pg_variant", "ppo", "actor.policy_loss", "vanilla", PG),
    (
        "actor_train.pg_variant",
        "ppo",
        "actor.clip_ratio_c",
        1.4,
        merge(PG, {"dual_clip_loss": True}),
    ),
    # tis: -sg[clip(r, 0, 1)] A log pi = cispo with 1 - eps_low = 0, 1 + eps_high = 1
    ("actor_train.pg_variant", "tis", "actor.policy_loss", "cispo", PG),
    ("actor_train.pg_variant", "tis", "actor.clip_ratio_low", 1.0, PG),
    ("actor_train.pg_variant", "tis", "actor.clip_ratio_high", 0.0, PG),
    (
        "actor_train.pg_variant",
        "tis",
        "actor.clip_ratio_high",
        0.0,
        merge(PG, {"use_pg_clip_range": True, "pg_clip_high": 0.28}),
    ),
    ("actor_train.pg_variant", "cispo", "actor.policy_loss", "cispo", PG),
    ("actor_train.pg_variant", "cispo", "actor.clip_ratio_low", 0.1, PG),
    ("actor_train.pg_variant", "cispo", "actor.clip_ratio_high", 0.1, PG),
    # topr: split by the sample's score (ROLL's scores), weights from actor_train
    ("actor_train.pg_variant", "topr", "actor.policy_loss", "topr_score", PG),
    (
        "actor_train.pg_variant",
        "topr",
        "actor.policy_loss_kwargs",
        {"topr_positive_weight": 1.0, "topr_negative_weight": 1.0},
        PG_AGENTIC,
    ),
    (
        "actor_train.topr_negative_weight",
        0.5,
        "actor.policy_loss_kwargs",
        {"topr_positive_weight": 2.0, "topr_negative_weight": 0.5},
        merge(PG, {"actor_train": {"pg_variant": "topr", "topr_positive_weight": 2}}),
    ),
    # kimi15: -A log pi + tau/2 (log pi - log pi_old)^2 = dro with beta = tau = 0.1
    ("actor_train.pg_variant", "kimi15", "actor.policy_loss", "dro", PG),
    ("actor_train.pg_variant", "kimi15", "actor.policy_loss_kwargs", {"dro_beta": 0.1}, PG),
    (
        "actor_train.pg_variant",
        "kimi15",
        "actor.policy_loss",
        "dro",
        merge(PG, {"importance_sampling": "token"}),
    ),
]

# ROLL's train/infer correction: importance weights and rejection filters
TIC = "train_infer_correction"
IS_ON = {TIC: {"is_weight": {"enabled": True}}}
SEGMENT_FILTER = {
    "enabled": True,
    "agg_type": "segment",
    "diff_enabled": True,
    "ratio_high": 1.05,
    "diff_low": -0.1,
    "diff_high": 0.1,
}
MAPPED += [
    (f"{TIC}.is_weight.enabled", True, "actor.rollout_is", "token", {}),
    (f"{TIC}.is_weight.enabled", True, "actor.rollout_is_threshold", 1.2, {}),  # ROLL's
    (f"{TIC}.is_weight.upper_bound", 1.5, "actor.rollout_is_threshold", 1.5, IS_ON),
    (f"{TIC}.is_weight.weight_type", "geometric", "actor.rollout_is", "geometric", IS_ON),
    (f"{TIC}.is_weight.weight_type", "segment", "actor.rollout_is", "segment", IS_ON),
    (
        f"{TIC}.filters",
        [SEGMENT_FILTER, {"enabled": False}, {"enabled": True, "agg_type": "sequence"}],
        "actor.rollout_rs",
        [
            {"stat": "ratio", "level": "segment_mean", "low": 0.8, "high": 1.05},
            {"stat": "prob_diff", "level": "segment_mean", "low": -0.1, "high": 0.1},
            {"stat": "ratio", "level": "sequence_sum", "low": 0.8, "high": 1.2},
        ],
        {},
    ),
    (
        f"{TIC}.filters",
        [{"enabled": True, "agg_type": "geometric", "ratio_enabled": False, "diff_enabled": True}],
        "actor.rollout_rs",
        [{"stat": "prob_diff", "level": "sequence_mean", "low": -0.2, "high": 0.2}],
        {},
    ),
    # ROLL's old log-probs without recompute are the trainer's forward, not the engine's
    ("enable_old_logprobs_recompute", False, "actor.recompute_old_log_prob", True, IS_ON),
    ("enable_old_logprobs_recompute", False, "actor.recompute_old_log_prob", True, {}),
]

# (ROLL key, value, extra context): accepted, a note names the key.
NOTED = [
    ("track_with", "swanlab", {}),  # offline unless tracker_kwargs.mode says online
    ("enable_old_logprobs_recompute", False, IS_ON),
    ("enable_old_logprobs_recompute", True, {}),
    (
        f"{TIC}.filters",
        [{"enabled": True}],
        {"enable_old_logprobs_recompute": False, "entropy_loss_coef": 0.01},
    ),
    (f"{TIC}.is_weight.upper_bound", 1.5, {}),  # weights off
    ("actor_train.pg_variant", "topr", {}),  # the PPO worker does not read it
    ("actor_train.cispo_epsilon_low", 0.1, PG),  # ROLL's built-in value
    ("pg_clip_high", 0.28, merge(PG, {"use_pg_clip_range": True})),
    ("hydra.run.dir", ".", {}),
    ("hydra.output_subdir", None, {}),
    ("logging_dir", "./logs", {}),
    ("local_rank", -1, {}),
    ("generate_opt_level", 1, {}),
    ("is_num_return_sequences_expand", False, {}),
    ("is_use_additional_prompts", True, {}),  # no query filter: nothing to replace
    ("error_max_len_clip", False, {}),
    ("checkpoint_config.type", "file_system", {}),
    ("enable_response_mask", True, {}),
    ("system_envs.USE_MODELSCOPE", "1", {}),
    ("actor_train.model_args.model_type", None, {}),
    ("actor_train.training_args.num_train_epochs", 50, {}),
    ("actor_train.training_args.max_steps", 10, {}),
    ("actor_train.data_args.interleave_probs", "1.0", {}),
    ("actor_train.data_args.preprocessing_num_workers", 16, {}),
    ("actor_train.data_args.template", "qwen2_5", {}),
    ("actor_train.num_gpus_per_worker", 1, {}),
    ("actor_infer.model_args.flash_attn", "fa2", {}),
    ("actor_infer.model_args.disable_gradient_checkpointing", True, {}),
    (
        "actor_infer.data_args.template",
        "qwen2_5",
        {"actor_train": {"data_args": {"template": "qwen2_5"}}},
    ),
    ("actor_infer.generating_args.num_beams", 1, {}),
    ("reference.model_args.flash_attn", "fa2", {}),
    ("reference.model_args.disable_gradient_checkpointing", True, {}),
    ("reference.model_args.dtype", "bf16", {"actor_train": {"model_args": {"dtype": "bf16"}}}),
    ("reference.model_args.model_type", None, {}),
    ("reference.data_args.template", "native", {}),
    ("reference.strategy_args.strategy_config", None, {}),
    ("rewards.r.data_args.template", "native", MATH),
    ("rewards.r.model_args", {"model_name_or_path": "m"}, MATH),
    ("rewards.r.infer_batch_size", 4, MATH),
    ("rewards.r.model_args.flash_attn", "fa2", MATH),
    ("rewards.r.model_args.dtype", "bf16", MATH),
    ("rewards.r.model_args.model_type", "trl", MATH),
    ("rewards.r.strategy_args.strategy_name", "hf_infer", MATH),
    ("rewards.r.strategy_args.strategy_config", None, MATH),
    ("rewards.r.model_args.disable_gradient_checkpointing", True, MATH),
    ("rewards.r.generating_args", {"max_new_tokens": 100, "top_p": 0.8, "num_beams": 1}, MATH),
    # ROLL keys only the rejected workers read (sandbox, judge) or that math ignores
    ("rewards.r.use_local", True, MATH),
    ("rewards.r.code_url", "http://sandbox", MATH),
    ("rewards.r.judge_prompt", "p", MATH),
    ("rewards.r.judge_model_type", "inference", MATH),
    ("rewards.r.judge_model_name", "m", MATH),
    ("rewards.r.judge_api_url", "http://judge", MATH),
    ("rewards.r.judge_api_key", "k", MATH),
    ("rewards.r.reward_type", "soft", MATH),
    ("rewards.r.response_length_penalty_coef", 0.1, MATH),
    ("rewards.r.format_pattern", "^<think>", MATH),
    ("reward_norm", "batch", GRPO),
    ("rewards.r.response_filter_config.type", "mean_filter", MATH),
    ("rewards.r.response_filter_config.filter_args", {"threshold_up": 1.0}, MATH),
    ("validation.generating_args.num_beams", 1, {}),
    ("validation.generating_args.max_new_tokens", 100, {}),
    ("validation.data_args.template", "native", {}),
    ("train_env_manager.max_env_num_per_worker", 4, {}),
    (
        "train_env_manager.worker_cls",
        "roll.pipeline.agentic.environment_worker.EnvironmentWorker",
        {},
    ),
    ("pg_clip_high", 0.28, {}),
]

# (ROLL key, value, words in the reason, extra context)
REJECTED = [
    (f"{TIC}.is_weight.upper_bound", None, "untruncated", IS_ON),
    (f"{TIC}.is_weight.weight_type", "turn", "granularities", IS_ON),
    (f"{TIC}.filters", [{"enabled": True, "agg_typ": "token"}], "loader drops it", {}),
    (f"{TIC}.filters", [{"enabled": True, "agg_type": "tok"}], "granularities", {}),
    ("actor_train.pg_variant", "foo", "not one of ROLL's variants", PG),
    ("actor_train.tis_upper_bound", 2.0, "loader drops it", PG),
    ("actor_train.cispo_use_unified_mask", True, "loader drops it", PG),
    ("actor_train.kimi15_tau", 0.5, "loader drops it", PG),
    ("checkpoint_config.type", "s3", "file_system", {}),
    ("error_max_len_clip", True, "not implemented", {}),
    ("enable_response_mask", False, "environment observation tokens", {}),
    ("track_with", "mlflow", "not supported", {}),  # ROLL has no mlflow tracker
    ("track_with", "ml_tracker", "in-house experiment tracker", {}),
    ("actor_infer.generating_args.num_beams", 4, "beam search", {}),
    ("validation.generating_args.num_beams", 2, "beam search", {}),
    ("actor_infer.generating_args.num_return_sequences", 3, "differs", {}),
    ("actor_train.strategy_args.strategy_name", "foo_train", "not supported", {}),
    ("actor_infer.strategy_args.strategy_name", "trtllm", "not supported", {}),
    ("reference.strategy_args.strategy_name", "vllm", "not supported", {}),
    ("actor_train.worker_cls", "my.pkg.Worker", "custom ROLL worker", {}),
    ("rewards.x.worker_cls", "my.pkg.MyRewardWorker", "not a ROLL reward worker", {}),
    ("rewards.j.judge_model_type", "api", "not supported", JUDGE),
    ("rewards.j.judge_prompt", "my-prompt", "not one of ROLL's judge prompts", JUDGE),
    ("rewards.j.strategy_args.strategy_name", "sglang", "not supported", JUDGE),
    ("rewards.j.generating_args.num_return_sequences", 2, "one verdict", JUDGE),
    ("rewards.c.code_url", None, "no code_url", CODE_REMOTE),
    ("rewards.c.reward_type", "fuzzy", "not a CrossThinkQA reward type", CROSS),
    (
        "rewards.r.query_filter_config.type",
        "mean_filter",
        "different rules",
        merge(MATH, {"rewards": {"s": MATH["rewards"]["r"]}}),
    ),
    ("rewards.r.query_filter_config.type", "median_filter", "not supported", MATH),
    ("actor_train.model_args.model_type", "trl", "AutoModelForCausalLM", {}),
    ("actor_train.model_args.flash_attn", "fa9", "not supported", {}),
    ("actor_train.training_args.lr_scheduler_type", "polynomial", "not supported", {}),
    (
        "reference.model_args.dtype",
        "fp32",
        "differs",
        {"actor_train": {"model_args": {"dtype": "bf16"}}},
    ),
    ("actor_infer.model_args.model_name_or_path", "other", "share one model", {"pretrain": "p"}),
    ("actor_train.data_args.interleave_probs", "0.5,1.0", "interleave", {}),
    (
        "actor_train.data_args.messages",
        "m",
        "exclusive",
        {"actor_train": {"data_args": {"prompt": "p"}}},
    ),
    ("custom_envs.S.env_manager_cls", "my.Cls", "env manager", {}),
    ("train_env_manager.worker_cls", "my.Cls", "environment worker", {}),
    ("train_env_manager.group_size_redundancy", 2, "redundant", {}),
    ("train_env_manager.llm_proxy.proxy_type", "openai", "policy", {}),
    ("reward_normalization.grouping", "foo", "not supported", {}),
    ("actor_train.device_mapping", "__import__('os').system('true')", "cannot read", {}),
    ("actor_train.world_size", 3, "do not match", {"actor_train": {"device_mapping": "[0,1]"}}),
    ("validation.eval_steps", 5, "agree", {"eval_steps": 10}),
    (
        "custom_envs.S.max_steps_per_traj",
        3,
        "agree",
        {"custom_envs": {"S": {"max_actions_per_traj": 4}}},
    ),
]


def _id(row: tuple) -> str:
    return f"{row[0]}={row[1]!r}"[:60]


@pytest.mark.parametrize("row", MAPPED, ids=_id)
def test_mapped(row):
    key, value, dst, expected, extra = row
    cfg, _ = run(nest(key, value, extra))
    assert native_get(cfg, dst) == expected


@pytest.mark.parametrize("row", NOTED, ids=_id)
def test_noted(row):
    key, value, extra = row
    _, notes = run(nest(key, value, extra))
    assert any(key in n for n in notes), notes


@pytest.mark.parametrize("row", REJECTED, ids=_id)
def test_rejected(row):
    key, value, words, extra = row
    with pytest.raises(ConfigError) as err:
        run(nest(key, value, extra))
    assert key in str(err.value) and words in str(err.value)
    assert err.value.fix


def _norm(path: str) -> str:
    parts = path.split(".")
    if parts[0] in ("rewards", "custom_envs") and len(parts) > 1:
        parts[1] = "*"
    return ".".join(parts)


COVERED = {_norm(r[0]) for r in MAPPED + NOTED + REJECTED}


def _covered(leaf: str) -> bool:
    leaf = _norm(leaf)
    return any(leaf == c or leaf.startswith(c + ".") for c in COVERED)


def _leaves(value: Any, path: str) -> list[str]:
    if isinstance(value, dict) and value:
        return [x for k, v in value.items() for x in _leaves(v, f"{path}.{k}")]
    return [path]


@needs(*UPSTREAM_FILES)
@pytest.mark.parametrize("path", UPSTREAM_FILES, ids=lambda p: p.name)
def test_every_upstream_leaf_has_a_row(path):
    raw = load_yaml(path)
    leaves = [
        leaf for k, v in raw.data.items() if k not in raw.from_defaults for leaf in _leaves(v, k)
    ]
    missing = [leaf for leaf in leaves if not _covered(leaf)]
    # deepspeed dicts arrive whole (the actor.deepspeed row); megatron keys one by one
    missing = [
        m
        for m in missing
        if not m.startswith("actor_train.strategy_args.strategy_config") or "megatron" in str(path)
    ]
    assert not missing


SEED_KEYS = [
    "exp_name",
    "seed",
    "rpc_timeout",
    "logging_dir",
    "output_dir",
    "render_save_dir",
    "system_envs",
    "track_with",
    "tracker_kwargs",
    "num_gpus_per_node",
    "max_steps",
    "save_steps",
    "logging_steps",
    "eval_steps",
    "resume_from_checkpoint",
    "checkpoint_config.type",
    "rollout_batch_size",
    "val_batch_size",
    "prompt_length",
    "response_length",
    "sequence_length",
    "local_rank",
    "num_nodes",
    "generate_opt_level",
    "is_num_return_sequences_expand",
    "max_running_requests",
    "is_use_additional_prompts",
    "max_additional_running_prompts",
    "num_return_sequences_in_group",
    "ppo_epochs",
    "max_grad_norm",
    "l2",
    "lambd",
    "gamma",
    "kl_penalty",
    "init_kl_coef",
    "kl_horizon",
    "use_reward_scaling",
    "add_len_reward",
    "reward_clip",
    "difficulty_loss_weight",
    "length_loss_weight",
    "use_reward_norm",
    "whiten_rewards",
    "whiten_advantages",
    "advantage_clip",
    "adv_estimator",
    "reward_norm",
    "reward_shift",
    "reward_scale",
    "add_token_level_kl",
    "critic_warmup",
    "use_kl_loss",
    "kl_loss_coef",
    "entropy_loss_coef",
    "sft_loss_coef",
    "use_topr_loss",
    "rl_loss_coef",
    "dual_clip_loss",
    "loss_agg_mode",
    "reward_normalization.grouping",
    "reward_normalization.method",
    "train_env_manager.env_groups",
    "train_env_manager.group_size",
    "train_env_manager.tags",
    "train_env_manager.n_groups",
    "train_env_manager.max_traj_per_env",
    "train_env_manager.format_penalty",
    "train_env_manager.worker_cls",
    "actor_train.model_args.dtype",
    "actor_train.model_args.disable_gradient_checkpointing",
    "actor_train.training_args.learning_rate",
    "actor_train.training_args.weight_decay",
    "actor_train.training_args.per_device_train_batch_size",
    "actor_train.training_args.gradient_accumulation_steps",
    "actor_train.training_args.warmup_steps",
    "actor_train.data_args.template",
    "actor_train.data_args.file_name",
    "actor_train.data_args.prompt",
    "actor_train.data_args.messages",
    "actor_train.strategy_args.strategy_name",
    "actor_train.infer_batch_size",
    "actor_train.device_mapping",
    "actor_train.world_size",
    "actor_train.model_update_frequency",
    "actor_infer.generating_args.max_new_tokens",
    "actor_infer.generating_args.temperature",
    "actor_infer.strategy_args.strategy_name",
    "actor_infer.num_gpus_per_worker",
    "actor_infer.device_mapping",
    "reference.strategy_args.strategy_name",
    "reference.device_mapping",
]
SEED_KEYS += [f"actor_train.strategy_args.strategy_config.{k}" for k, _ in _MEGA_KEYS]
SEED_KEYS += [
    f"actor_train.strategy_args.strategy_config.moe_{k}"
    for k in ("layer_recompute", "token_dispatcher_type", "grouped_gemm", "shared_expert_overlap")
]
SEED_KEYS += [
    f"actor_infer.strategy_args.strategy_config.{k}"
    for k in (
        "gpu_memory_utilization",
        "block_size",
        "max_model_len",
        "load_format",
        "mem_fraction_static",
    )
]
SEED_KEYS += ["reference.strategy_args.strategy_config.tensor_model_parallel_size"]


def test_every_seed_key_has_a_row():
    assert [k for k in SEED_KEYS if not _covered(k)] == []


def _translate_and_build(path: Path, overrides: list[str]) -> None:
    raw = load_yaml(path, overrides)
    t = translate_roll(raw)
    cfg = from_dict(TemperConfig, t.native)
    again = from_dict(TemperConfig, to_dict(cfg))
    assert again == cfg
    assert to_dict(from_dict(TemperConfig, t.native)) == to_dict(cfg)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_translate_and_build(path):
    _translate_and_build(path, [])


@needs(*UPSTREAM_FILES)
def test_upstream_files_translate_and_build():
    _translate_and_build(UPSTREAM_FILES[0], RLVR_DROP)
    _translate_and_build(UPSTREAM_FILES[1], [])


@needs(UPSTREAM_FILES[0])
def test_upstream_rlvr_scores_all_five_domains():
    cfg = from_dict(TemperConfig, translate_roll(load_yaml(UPSTREAM_FILES[0])).native)
    functions = {name: route.function for name, route in cfg.reward.routes.items()}
    assert functions == {
        "crossthinkqa": "crossthinkqa",
        "ifeval": "ifeval",
        "math_rule": "math",
        "code_sandbox": "code",
        "llm_judge": "llm_judge",
    }
    assert cfg.reward.routes["code_sandbox"].tags == ["KodCode"]
    assert cfg.data.extra_info_columns == ["case_type", "test_cases", "test_case_function"]
    assert cfg.reward.sandbox == "bwrap"  # use_local: true
    judge = cfg.reward.judge
    assert judge.model_path == "AI-ModelScope/Qwen2.5-7B-Instruct-RLVR" and judge.engine == "hf"
    assert judge.max_new_tokens == 100 and judge.temperature == pytest.approx(0.8)
    assert judge.infer_batch_size == 4 and "{reference}" in judge.prompt_template
    assert cfg.resources.reward == [12, 13, 14, 15]  # the judge's device_mapping
    assert cfg.reward.num_workers == 8  # the rule workers' world_size


def test_roll_remote_code_sandbox_is_sandbox_fusion():
    extra = {"rewards": {"c": {**CODE_REMOTE["rewards"]["c"], "code_url": "http://sb:8080"}}}
    cfg, _ = run(nest("rewards.c.tag_included", ["code"], extra))
    assert cfg.reward.sandbox == "sandbox_fusion" and cfg.reward.sandbox_url == "http://sb:8080"


@needs(UPSTREAM_FILES[0])
def test_upstream_rlvr_semantics():
    t = translate_roll(load_yaml(UPSTREAM_FILES[0], RLVR_DROP))
    cfg = from_dict(TemperConfig, t.native)
    assert cfg.pipeline == "rlvr" and cfg.model.path == "Qwen/Qwen2.5-7B"
    # megatron: 1 × 32 × 16 devices / (TP1 × PP1 × CP1) = 512 = 64 prompts × 8
    assert cfg.actor.mini_batch_size == 512 and cfg.actor.strategy == "megatron"
    assert cfg.actor.clip_ratio_c == pytest.approx(1.4)
    assert cfg.resources.backend == "ray"
    assert cfg.resources.nnodes == 2  # ROLL: ids up to 15 with 8 devices per node
    assert cfg.reward.routes["math_rule"].tags == ["deepmath_103k", "aime"]
    route = cfg.reward.routes["crossthinkqa"]
    assert route.function == "crossthinkqa" and route.tags == ["crossthinkqa"]
    assert route.kwargs == {"reward_type": "soft", "response_length_penalty_coef": 0.0}
    assert cfg.data.source_weights["ifeval"] == 0.1 and cfg.data.source_weights["math_rule"] == 0.4
    assert cfg.rollout.response_length == 4096 and cfg.rollout.max_model_len == 8000


@needs(UPSTREAM_FILES[1])
def test_upstream_agentic_semantics():
    raw = load_yaml(UPSTREAM_FILES[1])
    t = translate_roll(raw)
    cfg = from_dict(TemperConfig, t.native)
    assert cfg.pipeline == "agentic"
    assert cfg.actor.deepspeed["zero_optimization"]["stage"] == 2
    assert cfg.actor.mini_batch_size == 2 * 32 * 8
    assert cfg.agentic.custom_envs["SimpleSokoban"].max_turns == 20
    # ROLL: 64 envs each replay 512/64 = 8 episodes -> 512 groups of one episode
    assert cfg.agentic.train_env_manager.num_env_groups == 512
    assert cfg.agentic.train_env_manager.n_groups == [512]
    assert cfg.agentic.val_env_manager.n_groups == [256, 256, 256, 256]
    assert cfg.resources.nnodes == 1
    # definitions from defaults files: the referenced one is silent, the others noted
    assert not any(n.startswith("deepspeed_zero2:") for n in t.notes)
    assert any(n.startswith("deepspeed_zero3:") for n in t.notes)
    assert any(n.startswith("custom_env:") for n in t.notes)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("list(range(0,16))", list(range(16))),
        ("list(range(12,16))", [12, 13, 14, 15]),
        ("[0, 1] + list(range(4, 6))", [0, 1, 4, 5]),
        ("list(range(0, 8, 2))", [0, 2, 4, 6]),
        ("[3]", [3]),
        ([0, 1], [0, 1]),
        (None, None),
    ],
)
def test_device_mapping_parses(text, expected):
    assert parse_device_mapping(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "open('/etc/passwd').read()",
        "eval('[0]')",
        "[x for x in range(3)]",
        "().__class__.__bases__",
        "lambda: [0]",
        "list(range(10**12))",
        "list(range(0, 10000000))",
        "[0] * 100000000",
        "[0, 0]",
        "[-1]",
        "os.getpid()",
        "list(range(0,4",
    ],
)
def test_device_mapping_rejects_unsafe_or_bad(text):
    with pytest.raises(ConfigError) as err:
        parse_device_mapping(text, "actor_train.device_mapping")
    assert err.value.key == "actor_train.device_mapping"


def _trainer(strategy: str, devices: str, per: int, ga: int, cfg: dict | None = None):
    return {
        "actor_train": {
            "training_args": {
                "per_device_train_batch_size": per,
                "gradient_accumulation_steps": ga,
            },
            "strategy_args": {"strategy_name": strategy, "strategy_config": cfg or {}},
            "device_mapping": devices,
        }
    }


def test_mini_batch_deepspeed():
    cfg, _ = run(_trainer("deepspeed_train", "list(range(0,8))", 2, 4))
    assert cfg.actor.mini_batch_size == 2 * 4 * 8


def test_mini_batch_megatron():
    par = {
        "tensor_model_parallel_size": 2,
        "pipeline_model_parallel_size": 2,
        "context_parallel_size": 1,
        "expert_model_parallel_size": 8,
    }
    cfg, _ = run(_trainer("megatron_train", "list(range(0,16))", 1, 32, par))
    assert cfg.actor.mini_batch_size == 1 * 32 * 16 // 4  # EP does not divide


def test_mini_batch_megatron_indivisible():
    par = {"tensor_model_parallel_size": 4}
    with pytest.raises(ConfigError) as err:
        run(_trainer("megatron_train", "list(range(0,6))", 1, 8, par))
    assert err.value.key == "actor_train.device_mapping"
    assert "TP×PP×CP" in err.value.reason and "multiple" in err.value.fix


@pytest.mark.parametrize(
    "data, key, suggestion",
    [
        ({"rollout_batch_sise": 8}, "rollout_batch_sise", "rollout_batch_size"),
        (
            {"actor_train": {"training_args": {"learning_rat": 1e-6}}},
            "actor_train.training_args.learning_rat",
            "learning_rate",
        ),
        (
            {"actor_infer": {"generating_args": {"temprature": 1.0}}},
            "actor_infer.generating_args.temprature",
            "temperature",
        ),
    ],
)
def test_typo_did_you_mean(data, key, suggestion):
    with pytest.raises(ConfigError) as err:
        run(data)
    assert err.value.key == key and f"did you mean '{suggestion}'" in err.value.reason


def test_defaults_definition_used_only_via_reference_is_silent(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config/ds.yaml").write_text(
        "ds_a: {zero_optimization: {stage: 2}}\nds_b: {zero_optimization: {stage: 3}}\n"
    )
    (tmp_path / "run.yaml").write_text(
        "defaults:\n  - config/ds@_here_\n"
        "actor_train:\n  strategy_args:\n    strategy_name: deepspeed_train\n"
        "    strategy_config: ${ds_a}\n"
    )
    t = translate_roll(load_yaml(tmp_path / "run.yaml"))
    assert t.native["actor"]["deepspeed"] == {"zero_optimization": {"stage": 2}}
    assert [n for n in t.notes if n.startswith("ds_")] == [
        "ds_b: accepted, no effect here: a definition from a defaults file that nothing references"
    ]


def test_roll_defaults_are_applied_and_noted():
    cfg, notes = run({})
    assert cfg.algorithm.lam == 0.95 and cfg.algorithm.adv_estimator == "gae"
    assert cfg.actor.clip_ratio_c is None and cfg.critic.cliprange_value is None
    assert any("ROLL defaults applied" in n and "lambd=0.95" in n for n in notes)


def test_agentic_batch_must_fill_the_environments():
    data = {"rollout_batch_size": 10, "train_env_manager": {"env_groups": 4, "group_size": 2}}
    with pytest.raises(ConfigError) as err:
        run(data)
    assert err.value.key == "rollout_batch_size" and "multiple of 8" in err.value.fix


def test_num_nodes_follows_the_device_ids_over_the_files_own():
    """ROLL's config sets num_nodes from the highest device id, whatever the file says."""
    data = _trainer("megatron_train", "list(range(0,16))", 1, 32, {})
    data.update(num_nodes=1, num_gpus_per_node=8)
    cfg, notes = run(data)
    assert cfg.resources.nnodes == 2
    assert any(n.startswith("num_nodes: 2, not the file's 1") for n in notes)
