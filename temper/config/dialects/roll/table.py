"""The ROLL key table: every ROLL key path and what happens to it here.

A path is dot-separated; ``*`` matches one segment (a reward name, an env tag). Each
entry is one rule (:mod:`core.rules`):

- ``Map(native, fn, also=…)``: the value (through ``fn``) is written to ``native`` (and
  the ``also`` fields); ``{0}`` in a native key is the segment the first ``*`` matched.
- ``Use(what, by)``: read by the derivation ``by`` (``roll.derive.placement``,
  ``roll.rewards.rewards``, …: a :func:`core.derivation.derivation`, which declares the
  keys it reads): the value does reach the native config, but through arithmetic or a
  cross-key rule; ``what`` says where.
- ``Note(why)``: accepted; a note in ``Translation.notes`` says why it has no effect.
- ``Refuse(reason, fix, ok=…, why=…)``: accepted with a note (``why``) when
  ``ok(value, ctx)``, otherwise a ``ConfigError(key, reason, fix)``.
- ``Same(other, why)``: must equal the value at ``other`` (if set), then noted.

A rule on a mapping claims its whole subtree. Worker sections (``actor_train``, …)
share most keys, so their rows are generated per role below.
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core.rules import Map, Note, Refuse, Rule, Same, Use
from temper.config.dialects.roll import derive, gigpo, rewards
from temper.config.dialects.roll.transforms import (
    GROUPINGS,
    ROLE_WORKERS,
    ROUTE_KWARGS,
    choice,
    listify,
    negative_none,
    nonpositive_none,
    str_values,
    zero_none,
)
from temper.config.dialects.roll.versions import ADDITIONS, OVERRIDES
from temper.config.dialects.roll.workers import (
    DATA_NOTE,
    JUDGE_USE,
    VIDEO_SAMPLING_KEYS,
    VISION_KEYS,
    worker_rules,
)

# --------------------------------------------------------------------------- top level

TOP: dict[str, Rule] = {
    "hydra": Note("Hydra runtime settings (working dir, output subdir); temper never chdirs"),
    "exp_name": Map("experiment.experiment_name"),
    "seed": Map("experiment.seed"),
    "rpc_timeout": Map("resources.ray.rpc_timeout"),
    "logging_dir": Note("temper writes its logs under experiment.output_dir"),
    "output_dir": Map("experiment.output_dir"),
    "render_save_dir": Map("experiment.render_save_dir"),
    "system_envs": Map("resources.ray.system_envs", str_values),
    "track_with": Use(
        "experiment.trackers (stdout -> console; jsonl is always kept)", derive.experiment
    ),
    "tracker_kwargs": Map("experiment.tracker_kwargs"),
    "num_gpus_per_node": Map("resources.devices_per_node"),
    "num_nodes": Map("resources.nnodes"),
    "max_steps": Map("experiment.max_steps", nonpositive_none),
    "save_steps": Map("experiment.save_freq"),
    "logging_steps": Map("experiment.logging_steps"),
    "eval_steps": Map("experiment.test_freq"),
    "resume_from_checkpoint": Use("experiment.resume_mode / resume_from_path", derive.experiment),
    "checkpoint_config.type": Refuse(
        "only the file_system checkpoint backend exists here",
        "set checkpoint_config.type: file_system (or remove it)",
        ok=lambda v, _ctx: v in (None, "file_system"),
    ),
    "checkpoint_config.output_dir": Map("experiment.checkpoint_dir"),
    "max_ckpt_to_keep": Map(
        "experiment.max_actor_ckpt_to_keep",
        zero_none,
        also=("experiment.max_critic_ckpt_to_keep",),
    ),
    "rollout_batch_size": Map("data.train_batch_size"),
    "val_batch_size": Map("data.val_batch_size", negative_none),
    "prompt_length": Map("data.max_prompt_length"),
    "response_length": Use("rollout.response_length", derive.lengths),
    "sequence_length": Use(
        "rollout.max_model_len (and response_length when absent)", derive.lengths
    ),
    "num_return_sequences_in_group": Map("rollout.n"),
    "generate_opt_level": Note(
        "temper's engines always schedule requests continuously; "
        "the samples drawn do not depend on it"
    ),
    "is_num_return_sequences_expand": Note("only how n samples per prompt are requested"),
    "max_running_requests": Map("rollout.max_num_seqs"),
    "is_use_additional_prompts": Use(
        "data.gen_batch_size = rollout_batch_size + max_additional_running_prompts (with a "
        "query filter: extra prompts replace the filtered groups)",
        derive.dynamic_sampling,
    ),
    "max_additional_running_prompts": Use(
        "data.gen_batch_size (with is_use_additional_prompts)", derive.dynamic_sampling
    ),
    "local_rank": Note("set by the launcher per process; temper's launcher assigns ranks"),
    "ppo_epochs": Map("actor.ppo_epochs", also=("critic.ppo_epochs",)),
    "max_grad_norm": Map("actor.grad_clip", also=("critic.grad_clip",)),
    "l2": Map("actor.l2_coef"),
    # ROLL's old log-probs are the trainer's own either way (roll/pipeline/base_worker.py)
    "enable_old_logprobs_recompute": Note(
        "ROLL's old log-probs are the trainer's own with either value: false caches the "
        "first forward of the update (the numbers a recompute gives; ROLL forces the "
        "recompute when a step takes several backward passes); temper recomputes them "
        "(actor.recompute_old_log_prob: true)"
    ),
    "lambd": Map("algorithm.lam"),
    "gamma": Map("algorithm.gamma"),
    "kl_penalty": Map("algorithm.kl_penalty"),
    "init_kl_coef": Map("algorithm.kl_ctrl.kl_coef"),
    "kl_horizon": Map("algorithm.kl_ctrl.horizon"),
    "target_kl": Use("algorithm.kl_ctrl.target_kl and type=adaptive", derive.algorithm),
    "use_reward_scaling": Map("algorithm.use_reward_scaling"),
    "use_reward_norm": Map("algorithm.use_reward_norm"),
    "add_len_reward": Map("algorithm.add_len_reward"),
    "reward_clip": Map("algorithm.reward_clip"),
    "difficulty_loss_weight": Map("algorithm.difficulty_loss_weight"),
    "length_loss_weight": Map("algorithm.length_loss_weight"),
    "whiten_rewards": Map("algorithm.whiten_rewards"),
    "whiten_advantages": Map("algorithm.whiten_advantages"),
    "advantage_clip": Map("algorithm.advantage_clip"),
    "adv_estimator": Use(
        "algorithm.adv_estimator (grpo: reinforce after group reward_norm)", derive.algorithm
    ),
    "reward_norm": Use(
        "algorithm.reward_norm (group whenever adv_estimator is grpo)", derive.algorithm
    ),
    "reward_shift": Map("algorithm.reward_shift"),
    "reward_scale": Map("algorithm.reward_scale"),
    "add_token_level_kl": Map("algorithm.use_kl_in_reward"),
    "critic_warmup": Map("experiment.critic_warmup"),
    "use_kl_loss": Map("actor.use_kl_loss"),
    "kl_loss_coef": Map("actor.kl_loss_coef"),
    "entropy_loss_coef": Map("actor.entropy_coeff"),
    "sft_loss_coef": Map("actor.sft_loss_coef"),
    "postive_loss_coef": Map("actor.sft_loss_coef"),
    "use_topr_loss": Use("actor.policy_loss = topr", derive.algorithm),
    "rl_loss_coef": Map("actor.rl_loss_coef"),
    "dual_clip_loss": Use("actor.clip_ratio_c = 1 + 2*pg_clip (None when off)", derive.algorithm),
    "loss_agg_mode": Map("actor.loss_agg_mode"),
    "value_clip": Map("critic.cliprange_value"),
    "pg_clip": Map("actor.clip_ratio"),
    "use_pg_clip_range": Use("actor.clip_ratio_low/high", derive.algorithm),
    "pg_clip_low": Use("actor.clip_ratio_low (with use_pg_clip_range)", derive.algorithm),
    "pg_clip_high": Use("actor.clip_ratio_high (with use_pg_clip_range)", derive.algorithm),
    "max_len_mask": Map("algorithm.max_len_mask"),
    "difficulty_mask": Map("algorithm.difficulty_mask"),
    "difficulty_low_threshold": Map("algorithm.difficulty_low_threshold"),
    "difficulty_high_threshold": Map("algorithm.difficulty_high_threshold"),
    "error_max_len_clip": Refuse(
        "ROLL's error_max_len_clip (clipping wrong over-long answers) is not implemented",
        "set error_max_len_clip: false; max_len_mask masks truncated responses",
        ok=lambda v, _ctx: not v,
    ),
    "error_max_len_threshold": Note("used only with error_max_len_clip"),
    "pretrain": Use("model.path (unless actor_train.model_args.model_name_or_path)", derive.model),
    "reward_pretrain": Use(
        "critic.model_path (unless critic.model_args.model_name_or_path)", derive.model
    ),
    # agentic
    "max_actions_per_traj": Map("agentic.max_actions_per_traj"),
    "use_turn_scores": Map("agentic.use_turn_rewards"),
    "enable_response_mask": Refuse(
        "training on environment observation tokens is not supported",
        "set enable_response_mask: true (temper always masks env tokens out of the loss)",
        ok=lambda v, _ctx: bool(v),
        why="temper always masks environment tokens out of the loss",
    ),
    "enable_think": Map("agentic.enable_think"),
    "action_sep": Map("agentic.action_sep"),
    "reward_normalization.grouping": Map(
        "agentic.reward_normalization.grouping",
        choice(GROUPINGS, "reward_normalization.grouping"),
    ),
    "reward_normalization.method": Map("agentic.reward_normalization.method"),
    "custom_envs.*.env_type": Map("agentic.custom_envs.{0}.env_type"),
    "custom_envs.*.max_actions_per_traj": Map("agentic.custom_envs.{0}.max_turns"),
    "custom_envs.*.max_steps_per_traj": Map("agentic.custom_envs.{0}.max_turns"),
    "custom_envs.*.env_instruction": Map("agentic.custom_envs.{0}.env_instruction"),
    "custom_envs.*.max_tokens": Map("agentic.custom_envs.{0}.max_words"),
    "custom_envs.*.env_config": Map("agentic.custom_envs.{0}.env_config", lambda v, _ctx: v or {}),
    "custom_envs.*.env_manager_cls": Use(
        "agentic.env_manager (TrajEnvManager: trajectory, StepEnvManager: step, "
        "StepConcatEnvManager: step_concat, VLTrajEnvManager: vl_trajectory, "
        "ProxyEnvManager with GEMRunner: gem_runner; other classes are refused)",
        gigpo.env_manager,
    ),
}

for _mgr in ("train_env_manager", "val_env_manager"):
    _dst = f"agentic.{_mgr}"
    TOP.update(
        {
            f"{_mgr}.env_groups": Map(f"{_dst}.num_env_groups"),
            f"{_mgr}.num_env_groups": Map(f"{_dst}.num_env_groups"),
            f"{_mgr}.group_size": Map(f"{_dst}.group_size"),
            f"{_mgr}.tags": Map(f"{_dst}.tags", listify),
            f"{_mgr}.n_groups": Map(f"{_dst}.n_groups"),
            f"{_mgr}.num_groups_partition": Map(f"{_dst}.n_groups"),
            f"{_mgr}.max_traj_per_env": Map(f"{_dst}.max_traj_per_env"),
            f"{_mgr}.format_penalty": Map(f"{_dst}.format_penalty"),
            f"{_mgr}.worker_cls": Refuse(
                "a custom ROLL environment worker class cannot run here",
                "remove worker_cls (temper's env manager runs the environments)",
                ok=lambda v, _ctx: v is None or v in ROLE_WORKERS["env"],
            ),
            f"{_mgr}.max_env_num_per_worker": Note(
                "ROLL packs env threads per Ray worker; temper sizes its env pool itself"
            ),
            f"{_mgr}.group_size_redundancy": Refuse(
                "redundant episodes per group are not implemented",
                "set group_size_redundancy: 0",
                ok=lambda v, _ctx: not v,
            ),
            f"{_mgr}.llm_proxy.proxy_type": Refuse(
                "only the policy itself can play the environments",
                "set llm_proxy.proxy_type: policy",
                ok=lambda v, _ctx: v in (None, "policy"),
            ),
            f"{_mgr}.llm_proxy.proxy_config": Note("used only by non-policy LLM proxies"),
        }
    )

WORKERS = ("actor_train", "actor_infer", "reference", "critic", "reward")
for _role in WORKERS:
    TOP.update(worker_rules(_role))

# `reward` (singular) is a reward-model worker, or in an agentic file the generating
# worker behind its envs' LLM judge (DeepEyes): roll.rewards.agentic_judge
REWARD_USE = "reward.model.path (and enable); agentic: reward.judge.* (the envs' LLM judge)"
TOP["reward.model_args.model_name_or_path"] = Use(REWARD_USE, derive.model)
TOP["reward.model_args.dtype"] = Use(
    "agentic: reward.judge.dtype; noted for a reward model (scored in model.dtype)",
    derive.model,
)
TOP["reward.data_args.template"] = Note(
    "the reward model's or judge's inputs are rendered with its own tokenizer's chat template"
)
TOP["reward.infer_batch_size"] = Use(
    "reward.model.micro_batch_size_per_device; agentic: reward.judge.infer_batch_size",
    derive.model,
)

# `rewards.<name>`: one reward worker per domain -> reward.routes.<name> (roll_rewards).
_reward = worker_rules("rewards.*")
for _k in (
    "model_args.model_name_or_path",
    "model_args.dtype",
    "model_args.model_type",
    "strategy_args.strategy_name",
    "strategy_args.strategy_config",
):
    _reward[f"rewards.*.{_k}"] = Use(JUDGE_USE, rewards.rewards)
_reward["rewards.*.infer_batch_size"] = Use(JUDGE_USE, rewards.rewards)
_reward["rewards.*.model_args.attn_implementation"] = Note(
    "the attention kernel does not change a forward-only role's results beyond rounding"
)
for _k in ROUTE_KWARGS:
    _reward[f"rewards.*.{_k}"] = Use(
        "reward.routes.<name>.kwargs, when its function reads it", rewards.rewards
    )
_reward["rewards.*.tag_included"] = Map("reward.routes.{0}.tags", listify)
_reward["rewards.*.worker_cls"] = Use("reward.routes.<name>.function", rewards.rewards)
# query filters: dynamic sampling (roll_derive.dynamic_sampling); ROLL's response filter
# keeps every response whatever its config (user_defined_rollout_loop.response_filter)
_reward["rewards.*.query_filter_config.type"] = Use(
    "algorithm.filter_groups (mean_filter: mean_low/mean_high; std_filter: std_threshold)",
    derive.dynamic_sampling,
)
_reward["rewards.*.query_filter_config.filter_args"] = Use(
    "algorithm.filter_groups thresholds (threshold_down/threshold_up, std_threshold)",
    derive.dynamic_sampling,
)
_reward["rewards.*.response_filter_config.type"] = Note(
    "ROLL's response filter keeps every response whatever its type"
)
_reward["rewards.*.response_filter_config.filter_args"] = Note(
    "ROLL's response filter keeps every response whatever its arguments"
)
TOP.update(_reward)
for _k, _rule in worker_rules("validation").items():
    if _k.startswith(
        (
            "validation.generating_args",
            "validation.strategy_args",
            "validation.device_mapping",
            "validation.world_size",
            "validation.infer_batch_size",
            "validation.system_envs",
            "validation.worker_cls",
        )
    ):
        TOP[_k] = _rule
    elif _k.startswith("validation.data_args"):
        TOP[_k] = Note("validation prompts are built like training prompts")
    else:
        TOP[_k] = Note("validation generates with the actor_infer engine")
TOP["validation.data_args.file_name"] = Use(
    "data.val_files (joined with dataset_dir)", derive.data_files
)
for _k in VISION_KEYS:  # one image policy for training and validation prompts
    TOP[f"validation.data_args.{_k}"] = Same(
        f"actor_train.data_args.{_k}", "validation images are sized like training images"
    )
for _k in VIDEO_SAMPLING_KEYS:  # and one video policy
    TOP[f"validation.data_args.{_k}"] = Same(
        f"actor_train.data_args.{_k}", "validation videos are sampled like training videos"
    )
TOP["validation.data_args.template"] = Same("actor_train.data_args.template", DATA_NOTE)
TOP["validation.eval_steps"] = Map("experiment.test_freq")
# Keys of later ROLL releases: additions yield to rows defined above, overrides replace them.
TOP = {**ADDITIONS, **TOP, **OVERRIDES}

# Defaults ROLL applies when a key is absent and temper's default differs.
ROLL_DEFAULTS: dict[str, Any] = {
    "lambd": 0.95,
    "adv_estimator": "gae",
    "loss_agg_mode": "seq-mean-token-mean",
    "init_kl_coef": 0.2,
    "kl_loss_coef": 0.0,
    "value_clip": None,
    "pg_clip": 0.2,
    "max_steps": 500,
    "save_steps": 50,
    "eval_steps": 10,
    "rollout_batch_size": 128,
    "val_batch_size": 128,
    "prompt_length": 1024,
    "num_return_sequences_in_group": 1,
}
