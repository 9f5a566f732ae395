"""Rows of the ROLL key table for keys of ROLL releases after the first (2025-06 on).

``ADDITIONS`` are keys the first release did not have; they enter the table before the
older rows, so a row another module defines for the same key wins. ``OVERRIDES`` replace
older rows on purpose (a wording or a decision that changed) and enter last.

What the newer keys become:

- ``norm_mean_type`` / ``norm_std_type`` (where the reward normalisation's mean and std
  come from: batch, group, running or none) -> ``algorithm.reward_norm`` with
  ``reward_shift`` / ``reward_scale`` (derived in ``roll_derive._estimator``); the agentic
  ``reward_normalization.norm_*_type`` -> ``agentic.reward_normalization.norm_*_type``;
- ``custom_envs.<tag>``: ``max_steps`` -> the tag's ``max_turns``, ``max_tokens_per_step`` ->
  its per-turn generation budget (the smaller of it and ``generating_args.max_new_tokens``,
  as ROLL's ``TrajEnvManager`` does), ``agent_system_template`` / ``agent_template`` -> the
  tag's ``system_template`` / ``turn_template`` (rendered per turn with ROLL's fields);
- ``model_args.attn_implementation`` (the newer spelling of ``flash_attn``),
  ``lora_rank``/``lora_alpha``/``lora_target``, ``ulysses_size`` -> the model and actor
  settings they name; ``use_dynamic_batching_in_infer`` / ``max_tokens_per_microbatch_in_infer``
  -> the log-prob micro-batching of the actor and reference;
- speed, memory, observability and wiring keys (``offload_nccl``, sequence rounding and
  packing arguments, profilers, ``use_thread_lock``, ``max_env_step_concurrent``, …) are
  noted; features temper does not have are refused with what they are.
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core.rules import Map, Note, Refuse, Rule, Same, Use
from temper.config.dialects.roll import correction, derive, gem, gigpo, opd, pg
from temper.config.dialects.roll.mock import RULES as ROLLOUT_MOCK
from temper.config.dialects.roll.pg import PARAM_RULES
from temper.config.dialects.roll.transforms import ATTN, choice, listify

PERF = "speed or memory only"
MM = "vision-language inputs (images, video, audio) are not supported yet; a text-only config runs"
TRAJ = "roll.pipeline.agentic.env_manager.traj_env_manager.TrajEnvManager"
NORM_TYPES = ("batch", "group", "running", None)


def _off(why: str, fix: str) -> Refuse:
    return Refuse(why, fix, ok=lambda v, _ctx: not v, why="off, as temper runs")


def _router_replay(role: str) -> dict[str, Rule]:
    """``<worker>.router_replay.mode``: actor_train's is ``actor.router_replay``; another
    worker's must stay ``disable`` (the reference routes by its own top-k; R3's rollout
    side follows from actor_train's R3: the rollout engine returns the routing)."""
    key = f"{role}.router_replay.mode"
    if role == "actor_train":
        modes = {None: "none", "disable": "none", "R2": "R2", "R3": "R3"}
        return {"router_replay.mode": Map("actor.router_replay", choice(modes, key))}
    if role == "actor_infer":  # R3's rollout side: it returns routing iff actor_train replays it
        return {
            "router_replay.mode": Refuse(
                "the rollout returns each token's experts exactly when actor_train's "
                "router_replay.mode is R3",
                "set router_replay.mode: R3 on both actor_train and actor_infer, or disable",
                ok=lambda v, ctx: (
                    v in (None, "disable")
                    or (v == "R3" and ctx.get("actor_train.router_replay.mode") == "R3")
                ),
                why="disable, or R3 with actor_train's R3",
            )
        }
    return {
        "router_replay.mode": Refuse(
            "only actor_train replays MoE routing here (the other workers route by their own top-k)",
            "set router_replay.mode: disable",
            ok=lambda v, _ctx: v in (None, "disable"),
            why="off",
        )
    }


def _worker(role: str) -> dict[str, Rule]:
    """Rows every worker section gained (``actor_train``, ``reference``, …)."""
    trained = role in ("actor_train", "critic")
    rules: dict[str, Rule] = {
        "apply_loss_scale": Note("loss scaling over micro-batches: temper averages them itself"),
        "logits_in_fp32": Note("log-probs are computed from fp32 logits here"),
        "mtp_training_mode": Refuse(
            "multi-token prediction training is not supported",
            "set mtp_training_mode: disabled",
            ok=lambda v, _ctx: v in (None, "disabled"),
        ),
        "opd_kl_coef": Note("read by ROLL's on-policy distillation teachers only (roll_opd)"),
        "tag_included": Note("read by ROLL's on-policy distillation teachers only (roll_opd)"),
        **_router_replay(role),
        "model_args.adapter_name_or_path": Refuse(
            "loading an existing LoRA adapter is not supported",
            "merge the adapter into the model first",
            ok=lambda v, _ctx: v is None,
        ),
        "model_args.gradient_checkpointing_use_reentrant": Note("activation recompute: " + PERF),
        "model_args.model_config_kwargs": Note("the policy's config overrides are actor_train's"),
        "model_args.moe_aux_loss_coef": Refuse(
            "an MoE auxiliary loss is not supported",
            "remove moe_aux_loss_coef",
            ok=lambda v, _ctx: v in (None, 0, 0.0),
        ),
        "model_args.num_labels": Refuse(
            "temper's value and reward heads give one number",
            "remove num_labels",
            ok=lambda v, _ctx: v in (None, 1),
        ),
        "training_args.bf16": Note("precision comes from model_args.dtype"),
        "training_args.fp16": Note("precision comes from model_args.dtype"),
        "training_args.tf32": Note("TF32 matmuls: GPU speed only"),
        "training_args.data_seed": Note("ROLL overwrites it with the pipeline seed"),
        "training_args.dataloader_num_workers": Note(PERF),
        "training_args.output_dir": Note("temper writes under experiment.output_dir"),
        "training_args.save_hf_model": Note(
            "temper saves the final actor as a Hugging Face directory"
        ),
        "generating_args.length_penalty": Note("used by beam search only"),
        "generating_args.logprobs": Note("the sampling log-probs are always returned"),
        "generating_args.max_length": Note("the budget is max_new_tokens"),
        "offload_nccl": Note("frees NCCL buffers between phases: " + PERF),
        "sequence_length_round_in_train": Note("pads lengths to a multiple: " + PERF),
        "sequence_length_round_in_infer": Note("pads lengths to a multiple: " + PERF),
        "sequence_packing_args": Note("packing layout: " + PERF),
        "model_args.device_map": Note("placement comes from device_mapping"),
        "model_args.ulysses_size": Note("the reference follows the actor's sequence parallelism"),
        "model_args.lora_rank": Same(
            "actor_train.model_args.lora_rank", "all policy roles share one LoRA model"
        ),
        "model_args.lora_alpha": Same(
            "actor_train.model_args.lora_alpha", "all policy roles share one LoRA model"
        ),
        "model_args.lora_target": Note("the policy's LoRA modules are actor_train's"),
        "model_args.freeze_module_prefix": Note("this role does not train"),
        "model_args.attn_implementation": Note(
            "the attention kernel of a forward-only role does not change its results beyond "
            "float rounding"
        ),
        "use_remove_padding": Note(
            "padding is removed in training forwards (model.use_remove_padding)"
        ),
        "use_sequence_packing": Note("sequences are packed in training forwards: " + PERF),
        "use_dynamic_batching_in_infer": Note("this role runs no log-prob forward here"),
        "max_tokens_per_microbatch_in_infer": Note("this role runs no log-prob forward here"),
        "pg_variant": Note("read by ROLL's policy-gradient worker only"),
        "topr_positive_weight": Note("read by ROLL's policy-gradient worker only"),
        "topr_negative_weight": Note("read by ROLL's policy-gradient worker only"),
        "backend_timeout": Note("collective timeouts use torch's defaults"),
        "max_concurrency": Note("Ray actor concurrency: " + PERF),
    }
    if role == "actor_train":
        rules |= {
            "model_args.model_config_kwargs": Map(
                "model.override_config", lambda v, _ctx: dict(v or {})
            ),
            "model_args.attn_implementation": Map(
                "model.attn_implementation",
                choice(ATTN, "actor_train.model_args.attn_implementation"),
            ),
            "model_args.lora_rank": Map("model.lora.rank"),
            "model_args.lora_alpha": Map("model.lora.alpha"),
            "model_args.lora_target": Map("model.lora.target_modules", _lora_target),
            "model_args.ulysses_size": Map("actor.ulysses_sequence_parallel_size"),
            "model_args.freeze_module_prefix": Refuse(
                "freezing parts of the model (model_args.freeze_module_prefix, used for "
                "vision towers) is not supported",
                "remove it (every parameter trains)",
                ok=lambda v, _ctx: not v,
            ),
            "use_remove_padding": Map("model.use_remove_padding"),
            "use_sequence_packing": Map("model.use_remove_padding"),
            "use_dynamic_batching_in_infer": Map("rollout.log_prob_use_dynamic_bsz"),
            "max_tokens_per_microbatch_in_infer": Map("rollout.log_prob_max_token_len_per_device"),
            "pg_variant": Use(
                "actor.policy_loss (with a policy-gradient worker_cls)", pg.pg_variant
            ),
            "topr_positive_weight": Use(
                "actor.policy_loss_kwargs (pg_variant topr)", pg.pg_variant
            ),
            "topr_negative_weight": Use(
                "actor.policy_loss_kwargs (pg_variant topr)", pg.pg_variant
            ),
            **PARAM_RULES,
        }
    elif role == "reference":
        rules |= {
            "use_dynamic_batching_in_infer": Map("reference.use_dynamic_bsz"),
            "max_tokens_per_microbatch_in_infer": Map(
                "reference.log_prob_max_token_len_per_device"
            ),
        }
    elif role == "critic":
        rules |= {
            "use_dynamic_batching_in_infer": Note(
                "the critic's forward follows its training batching"
            ),
            "max_tokens_per_microbatch_in_infer": Map("critic.log_prob_max_token_len_per_device"),
        }
    if not trained:
        rules["model_args.lora_target"] = Note("the policy's LoRA modules are actor_train's")
    return {f"{role}.{k}": v for k, v in rules.items()}


def _lora_target(value: Any, _ctx: Any = None) -> Any:
    """``'q_proj,v_proj'`` -> a list; ``all-linear`` stays peft's shorthand."""
    if isinstance(value, str) and "," in value:
        return [t.strip() for t in value.split(",") if t.strip()]
    return value


def _generating(role: str) -> dict[str, Rule]:
    out: dict[str, Rule] = {}
    if role == "actor_infer":
        out["actor_infer.generating_args.stop_strings"] = Map("rollout.stop", listify)
        out["actor_infer.generating_args.include_stop_str_in_output"] = Refuse(
            "temper keeps the stop string in the response",
            "set include_stop_str_in_output: true",
            ok=lambda v, _ctx: v in (None, True),
            why="the stop string is kept in the response",
        )
    else:
        for k in ("stop_strings", "include_stop_str_in_output"):
            out[f"{role}.generating_args.{k}"] = Note("this role does not generate")
    return out


def _env_tag() -> dict[str, Rule]:
    e = "custom_envs.*"
    return {
        f"{e}.max_steps": Map("agentic.custom_envs.{0}.max_turns"),
        f"{e}.max_tokens_per_step": Use(
            "agentic.custom_envs.<tag>.max_tokens_per_turn (the smaller of it and "
            "actor_infer.generating_args.max_new_tokens, as ROLL's TrajEnvManager takes)",
            derive.lengths,
        ),
        f"{e}.agent_system_template": Map("agentic.custom_envs.{0}.system_template", _text),
        f"{e}.agent_template": Map("agentic.custom_envs.{0}.turn_template", _text),
        f"{e}.use_thread_lock": Note(
            "ROLL serializes env steps in a thread pool; temper steps envs in order"
        ),
        f"{e}.max_env_step_concurrent": Note("concurrent env steps: " + PERF),
        f"{e}.history_length": Use(
            "agentic.custom_envs.<tag>.history_length with StepEnvManager (the trajectory "
            "env manager keeps the whole episode)",
            gigpo.env_manager,
        ),
        f"{e}.agent_runner_cls": Use(
            "agentic.env_manager with env_manager_cls ProxyEnvManager (GEMRunner: gem_runner; "
            "other runners are refused)",
            gigpo.env_manager,
        ),
        f"{e}.pre_step_template": Map("agentic.custom_envs.{0}.pre_step_template", _text),
        f"{e}.next_step_template": Map("agentic.custom_envs.{0}.next_step_template", _text),
        f"{e}.user_prompt_format": Refuse(
            "ROLL 2025-07's prompt scheme (user_prompt_format, added_text) is not supported; "
            "its successor agent_template is",
            "write the turn prompt as agent_template",
            ok=lambda v, _ctx: v in (None, "", "<answer> [your answer] </answer>"),
            why="the default reply format, which temper's instruction states",
        ),
        f"{e}.added_text": Refuse(
            "text forced at the start of every answer (added_text) is not supported",
            "remove added_text",
            ok=lambda v, _ctx: not v,
            why="empty",
        ),
        f"{e}.reward_template": Refuse(
            "an env reward template is not supported", "remove it", ok=lambda v, _ctx: not v
        ),
        f"{e}.grid_vocab": Note("a vision-language env setting (the grid is text here)"),
        f"{e}.tool_wrapper": Use(
            "agentic.custom_envs.<tag>.tool_wrapper (GEM's tool wrapper: wrapper_args and "
            "the tool_configs by tool_id)",
            gem.tool_wrappers,
        ),
    }


def _text(value: Any, _ctx: Any = None) -> str:
    return "" if value is None else str(value)


def _env_manager(mgr: str) -> dict[str, Rule]:
    return {
        f"{mgr}.system_envs": Use("merged into resources.ray.system_envs", derive.placement),
        f"{mgr}.generating_args": Use(
            "actor_infer.generating_args when the file gives none (ROLL copies one to the other)"
            if mgr == "train_env_manager"
            else "replaced by actor_infer.generating_args (ROLL copies that one to both env "
            "managers)",
            derive.env_manager_sampling,
        ),
        f"{mgr}.group_filter_cls": Refuse(
            "a custom ROLL group filter cannot run here",
            "remove group_filter_cls",
            ok=lambda v, _ctx: v in (None, "roll.pipeline.agentic.agentic_pipeline.GroupFilter"),
            why="ROLL's default group filter keeps every group",
        ),
    }


ADDITIONS: dict[str, Rule] = {
    "norm_mean_type": Use("algorithm.reward_norm / reward_shift / reward_scale", derive.algorithm),
    "norm_std_type": Use("algorithm.reward_norm / reward_shift / reward_scale", derive.algorithm),
    "reward_normalization.norm_mean_type": Map(
        "agentic.reward_normalization.norm_mean_type",
        choice(
            {"batch": "batch", "group": "group", None: None}, "reward_normalization.norm_mean_type"
        ),
    ),
    "reward_normalization.norm_std_type": Map(
        "agentic.reward_normalization.norm_std_type",
        choice(
            {"batch": "batch", "group": "group", None: None}, "reward_normalization.norm_std_type"
        ),
    ),
    "reward_normalization.global_scale_factor": Refuse(
        "a global reward scale after normalisation is not supported",
        "remove it",
        ok=lambda v, _ctx: v in (None, 1, 1.0),
    ),
    "reward_normalization.global_shift_value": Refuse(
        "a global reward shift after normalisation is not supported",
        "remove it",
        ok=lambda v, _ctx: v in (None, 0, 0.0),
    ),
    "async_generation_ratio": Use(
        "async_training.staleness (whole numbers of batches ahead)", derive.async_generation
    ),
    "offload_nccl": Note("frees NCCL buffers between phases: " + PERF),
    "rollout_dump_dir": Map("experiment.rollout_data_dir"),
    "model_download_type": Note(
        "temper loads models with transformers (a local directory or a Hugging Face id)"
    ),
    "profiler_timeline": _off("ROLL's profilers are not run here", "set it to false"),
    "profiler_memory": _off("ROLL's profilers are not run here", "set it to false"),
    "profiler_output_dir": Note("ROLL's profilers are not run here"),
    "length_profiler_dir": Note("ROLL's profilers are not run here"),
    "otlp_output_dir": Note("OpenTelemetry export is not run here; it changes no result"),
    "report_length_and_rewards": Note("lengths and rewards are logged every step"),
    "model_update_buffer_size_mb": Map("rollout.update_weights_bucket_megabytes"),
    "is_offload_states": Note("offloads idle roles' states: " + PERF),
    "is_offload_optimizer_states_in_train_step": Note("optimizer-state offload: " + PERF),
    "global_template": Use(
        "data.chat_template (native; named templates -> native)", derive.data_files
    ),
    "model_name": Note("a run label of ROLL's rollout pipelines"),
    "batch_adjust_mode": Note(
        "ROLL pads or trims a batch whose trajectory count drifted; temper's agentic batch "
        "always holds exactly rollout_batch_size trajectories"
    ),
    "parse_tool_call_parameter_to_dict": Note("tool-call arguments are parsed as JSON objects"),
    "skip_mock_system_prompt": Note(
        "temper renders the messages it builds with the tokenizer's template as they are"
    ),
    "reward_system_config.skip_special_tokens": Refuse(
        "responses are decoded without special tokens for scoring",
        "set skip_special_tokens: true",
        ok=lambda v, _ctx: v in (None, True),
        why="special tokens are skipped when responses are decoded for scoring",
    ),
    # seq: the ratio exp(mean_t log π/π_old) of the whole response, clipped — GSPO
    "importance_sampling": Map(
        "actor.policy_loss",
        choice({"token": "vanilla", "seq": "gspo", None: "vanilla"}, "importance_sampling"),
    ),
    "positive_loss_coef": Map("actor.sft_loss_coef"),  # later spelling of postive_loss_coef
    "use_topr_neg_loss_coef": Refuse(
        "TOPR's negative-sample coefficient is not supported",
        "remove it",
        ok=lambda v, _ctx: v in (None, 0, 0.0, 1, 1.0),
    ),
    "pg_variant": Note("a definition the workers' pg_variant reads"),
    "step_reward_weight": Use("algorithm.gigpo_step_weight (adv_estimator gigpo)", gigpo.gigpo),
    "episode_reward_weight": Use(
        "algorithm.gigpo_episode_weight (adv_estimator gigpo)", gigpo.gigpo
    ),
    "step_reward_gamma": Use(
        "algorithm.gigpo_step_gamma (adv_estimator gigpo), agentic.step_score_gamma "
        "(adv_estimator step_reinforce)",
        gigpo.gigpo,
    ),
    "default_history_length": Note("read by ROLL's step-wise env manager only"),
    "env_monitor": Note("ROLL's hung-env watchdog; temper's env steps run in its own process"),
    "dirty_data_mask": _off("masking 'dirty' trajectories is not supported", "set it to false"),
    "open_feedback_turn": _off("feedback turns are not supported", "set it to false"),
    "use_token_reward": _off("token-level env rewards are not supported", "set it to false"),
    "partial_gpu_mode": Note("placement comes from device_mapping"),
    "exp_mode": Refuse(
        "only training runs here (exp_mode: train)",
        "set exp_mode: train",
        ok=lambda v, _ctx: v in (None, "train"),
    ),
    "ratio_type": Refuse(
        "segment-level importance ratios are not supported",
        "set ratio_type: token",
        ok=lambda v, _ctx: v in (None, "token"),
        why="token-level ratios, as temper computes them",
    ),
    "val_greedy": Note("validation sampling follows validation.generating_args"),
    "val_n_sample": Note(
        "validation samples follow validation.generating_args.num_return_sequences"
    ),
    "mask_type": Refuse(
        "max_len_mask and difficulty_mask mask the loss here (mask_type: loss)",
        "set mask_type: loss",
        ok=lambda v, _ctx: v in (None, "loss"),
    ),
    "train_infer_correction.is_weight.enabled": Use(
        "actor.rollout_is", correction.train_infer_correction
    ),
    "train_infer_correction.is_weight.weight_type": Use(
        "actor.rollout_is", correction.train_infer_correction
    ),
    "train_infer_correction.is_weight.upper_bound": Use(
        "actor.rollout_is_threshold", correction.train_infer_correction
    ),
    "train_infer_correction.is_weight.detach": Note(
        "the importance weight is never differentiated"
    ),
    "train_infer_correction.filters": Use("actor.rollout_rs", correction.train_infer_correction),
    # ---- remaining fields of ROLL's config dataclasses (no example sets them)
    "balance_length": Note("balances lengths over data-parallel ranks: " + PERF),
    "base_dir": Note("temper writes under experiment.output_dir"),
    "save_logging_board_dir": Note("ROLL's logging board is not run here"),
    "router_args": Note("ROLL's request router for env affinity: " + PERF),
    "transfer_backend": Note("weights sync over temper's own transport: " + PERF),
    "enable_reference": Map("reference.enable", lambda v, _ctx: True if v else None),
    "force_disable_old_logprobs_recompute": Refuse(
        "ROLL then takes each mini-batch's first forward (after the step's earlier "
        "updates) as its old log-probs; temper's are the policy's before the step's first "
        "update, or the rollout engine's (actor.recompute_old_log_prob: false)",
        "remove force_disable_old_logprobs_recompute",
        ok=lambda v, _ctx: not v,
    ),
    "minibatch_data_iter_num": Refuse(
        "iterating a mini-batch's data several times is not supported (use ppo_epochs)",
        "set minibatch_data_iter_num: 1",
        ok=lambda v, _ctx: v in (None, 1),
    ),
    "dataset_filter": Refuse(
        "ROLL's dataset filter (by source and difficulty) is not supported",
        "filter the data file beforehand, and remove dataset_filter",
        ok=lambda v, _ctx: not v or not any(vv for vv in (v or {}).values()),
        why="no filter",
    ),
    "tag_to_template": Use(
        "one chat template for every tag: each must be the file's template", derive.data_files
    ),
    "use_policy_loss_type": Refuse(
        "only the PPO loss (with the importance ratio) is supported here; PG is "
        "the plain policy gradient",
        "set use_policy_loss_type: PPO",
        ok=lambda v, _ctx: v in (None, "PPO"),
    ),
    "user_defined_rollout_loop_cls": Refuse(
        "a custom ROLL rollout loop cannot run here",
        "remove user_defined_rollout_loop_cls",
        ok=lambda v, _ctx: v is None,
    ),
    "val_prompt_length": Refuse(
        "validation uses the training lengths here", "remove it", ok=lambda v, _ctx: v is None
    ),
    "val_sequence_length": Refuse(
        "validation uses the training lengths here", "remove it", ok=lambda v, _ctx: v is None
    ),
    "world_size": Note("ROLL derives worker counts from device_mapping"),
    "ipa_failure_reward": Refuse(
        "the IPA failure reward is not supported",
        "remove it",
        ok=lambda v, _ctx: v in (None, 0, 0.0),
    ),
    "pure_opd_pipeline_type": Note(
        "ROLL's OPD launcher picks the RLVR or agentic config class with it; here the "
        "file's train_env_manager picks the pipeline"
    ),
    **ROLLOUT_MOCK,
    **_generating("actor_infer"),
    **_generating("reference"),
    **_generating("validation"),
    **_env_tag(),
    **_env_manager("train_env_manager"),
    **_env_manager("val_env_manager"),
}
for _role in ("actor_train", "actor_infer", "reference", "critic", "reward"):
    ADDITIONS.update(_worker(_role))
for _k in ("attn_implementation", "lora_rank", "lora_alpha", "lora_target"):
    ADDITIONS[f"rewards.*.model_args.{_k}"] = Note("the ROLL reward workers temper runs are rules")
ADDITIONS["rewards.*.reward_manager_config"] = Refuse(
    "ROLL's reward-system plugins are not supported", "remove it", ok=lambda v, _ctx: not v
)
for _k in ("is_pure_opd", "use_opd", "student_train", "student_infer"):
    ADDITIONS[_k] = Use(
        "on-policy distillation (roll_opd): its mode and the student's workers", opd.rewrite_opd
    )
ADDITIONS["teacher"] = Refuse(
    "ROLL reads the teacher only in on-policy distillation (student_train and student_infer, "
    "or use_opd)",
    "remove teacher, or configure on-policy distillation",
    ok=lambda v, _ctx: not v,
    why="off",
)
# Vision-language, video and audio inputs (ROLL's data_args of its VL pipelines).
for _section in ("actor_train", "validation"):
    for _k in (
        "image_max_pixels",
        "image_min_pixels",
        "video_max_pixels",
        "video_min_pixels",
        "video_total_pixels",
        "video_fps",
        "video_max_frames",
        "video_resize_chunk_frames",
        "image_folder",
        "video_folder",
        "audio_folder",
        "custom_data_kwargs_func",
    ):
        ADDITIONS[f"{_section}.data_args.{_k}"] = Refuse(
            MM, "remove it", ok=lambda v, _ctx: v is None
        )

# Rows that change how an older key is read.
OVERRIDES: dict[str, Rule] = {
    "reward_model": Refuse(
        "ROLL's served reward model (an LLM judge behind a server, reward_model:) is not "
        "supported yet",
        "remove reward_model and score with rule rewards (rewards.<domain>)",
        ok=lambda v, _ctx: not v,
    ),
    "rewards.*.data_args.template": Note("a reward worker's own prompt template"),
    # ``trl``: a causal LM plus a value head (trl's AutoModelForCausalLMWithValueHead),
    # which is how temper builds every critic.
    "critic.model_args.model_type": Refuse(
        "temper's critic is a causal LM with a scalar value head (trl's layout)",
        "remove critic.model_args.model_type, or set it to trl",
        ok=lambda v, _ctx: v in (None, "trl"),
        why="a causal LM plus a value head, as temper builds the critic",
    ),
}
