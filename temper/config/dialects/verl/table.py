"""The verl key table: every key of verl's PPO trainer config (0.8's fully expanded
``ppo_trainer.yaml``, plus older and documented keys) and what it becomes here.

Keys are dotted verl paths; rule kinds are in :mod:`core.rules`. ``_target_`` keys (Hydra
class paths) are accepted anywhere. ``INHERIT`` mirrors verl's ``${oc.select:...}``
defaults for keys a short file omits; ``DEFAULTS`` are verl defaults that differ from
temper's and change what a run does.
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core.rules import Call, Gated, Map, Note, Refuse, Rule, Transform
from temper.config.dialects.verl import asynchronous as verl_async
from temper.config.dialects.verl import transforms as r

A, ACT, REF, RO, MOD = (
    "actor_rollout_ref",
    "actor_rollout_ref.actor",
    "actor_rollout_ref.ref",
    "actor_rollout_ref.rollout",
    "actor_rollout_ref.model",
)

PERF = "performance/memory only; temper chooses this itself"
FSDP1 = "FSDP1-only option; temper runs FSDP2"
PROFILE_OFF = "profiling is off; temper profiles with experiment.profile_steps"
INTERNAL = "verl-internal wiring with no counterpart here"
MM = "vision-language inputs are built from the model's own processor"


def _inert(ok: Any, why: str, reason: str, fix: str = "remove the key") -> Refuse:
    return Refuse(reason, fix, ok=ok if callable(ok) else tuple(ok), why=why)


def _off(why: str, reason: str, fix: str = "remove the key") -> Refuse:
    """Refuse at false/null: a feature temper does not have."""
    return Refuse(reason, fix, ok=(False, None), why=why)


def _profiler(prefix: str) -> dict[str, Rule]:
    return {
        f"{prefix}.profiler": Gated(
            "enable",
            (False, None),
            PROFILE_OFF,
            "verl's profilers are not supported",
            "remove it; set experiment.profile_steps for torch.profiler traces",
        )
    }


def _router_replay(prefix: str, *, actor: bool = False) -> dict[str, Rule]:
    """``<role>.router_replay`` (and, verl 0.9, ``<role>.megatron.router_replay``): the
    actor's mode is ``actor.router_replay``; another role's replay must stay off (temper's
    reference routes by its own top-k, as verl's does with replay disabled)."""
    if not actor:
        return {
            f"{prefix}.router_replay": Gated(
                "mode",
                ("disabled", None),
                "MoE router replay is disabled",
                "only the actor replays MoE routing",
                "set mode: disabled",
            )
        }
    files = "routing is carried in the batch, never written to files"
    return {
        f"{prefix}.router_replay.mode": Map("actor.router_replay", r.router_replay_mode),
        f"{prefix}.router_replay.record_file": Refuse(
            "writing routing to files is not supported", "set it to null", ok=(None,), why=files
        ),
        f"{prefix}.router_replay.replay_file": Refuse(
            "replaying routing from files is not supported", "set it to null", ok=(None,), why=files
        ),
    }


def _optim(prefix: str, role: str) -> dict[str, Rule]:
    o = f"{role}.optim"
    return {
        f"{prefix}.optimizer": Map(f"{o}.optimizer", r.optimizer),
        f"{prefix}.optimizer_impl": _inert(
            ("torch.optim",),
            "optimizers come from torch.optim",
            "only torch.optim optimizers are supported",
            "set optimizer_impl: torch.optim",
        ),
        f"{prefix}.lr": Map(f"{o}.lr"),
        f"{prefix}.lr_warmup_steps_ratio": Map(f"{o}.warmup_ratio", r.titan_warmup_ratio),
        f"{prefix}.lr_warmup_steps": Map(f"{o}.warmup_steps", r.warmup_steps),
        f"{prefix}.total_training_steps": Map(f"{o}.total_training_steps", r.titan_total),
        f"{prefix}.weight_decay": Map(f"{o}.weight_decay"),
        f"{prefix}.betas": Map(f"{o}.betas"),
        f"{prefix}.clip_grad": Map(
            f"{role}.grad_clip", r.titan_clip, weak=True
        ),  # grad_clip's copy
        f"{prefix}.min_lr_ratio": Map(f"{o}.min_lr_ratio", r.zero_if_none),
        f"{prefix}.num_cycles": Map(f"{o}.num_cycles", r.automodel_ignores),
        # verl: a non-null (deprecated) warmup_style overrides lr_scheduler_type
        f"{prefix}.lr_scheduler_type": Map(
            f"{o}.lr_scheduler", r.choice("constant", "cosine", "linear"), weak=True
        ),
        f"{prefix}.warmup_style": Map(
            f"{o}.lr_scheduler", r.choice("constant", "cosine", "linear")
        ),
        f"{prefix}.zero_indexed_step": Map(f"{o}.zero_indexed_step", _zero_indexed(prefix)),
        f"{prefix}.override_optimizer_config": _inert(
            (None, {}),
            "no optimizer overrides",
            "optimizer overrides are not supported",
            "set the optimizer fields (lr, betas, eps, weight_decay) directly",
        ),
    }


def _zero_indexed(prefix: str) -> Transform:
    """verl 0.9's ``zero_indexed_step``: false counts the schedule's steps from 1, which
    verl's FSDP engine applies to its cosine schedule only (its constant schedule with
    warmup counts from 0 whatever this says)."""

    def fn(v: Any, ctx: Any) -> Any:
        if v is not False or r.automodel_ignores(v, ctx) is None:  # verl's default, ours
            return None
        style = ctx.get(f"{prefix}.warmup_style") or ctx.get(
            f"{prefix}.lr_scheduler_type", ctx.get(f"{prefix}.lr_scheduler", "constant")
        )
        if style != "cosine":
            ctx.note(f"no effect here: verl counts its {style} schedule from step 0 either way")
            return None
        return False

    return fn


#: The verl key that picks a trained role's workers (FSDP or megatron)
_STRATEGY_KEYS = {"actor": f"{ACT}.strategy", "critic": "critic.strategy"}


def _fsdp(prefix: str, role: str, trained: bool) -> dict[str, Rule]:
    """``fsdp_config`` of actor (trained, role=actor), ref, critic, or reward model."""
    f = f"{role}.fsdp"
    dtype_rule: Rule
    if role == "actor":
        dtype_rule = Map("model.dtype", r.dtype)
    else:
        dtype_rule = _inert(
            r.same_dtype,
            "the same compute dtype as the actor: model.dtype",
            "temper uses one compute dtype (model.dtype) for every role",
            f"set it equal to {ACT}.fsdp_config.dtype",
        )
    rules: dict[str, Rule] = {
        f"{prefix}.wrap_policy.min_num_params": Map(f"{f}.wrap_min_num_params"),
        f"{prefix}.min_num_params": Map(f"{f}.wrap_min_num_params"),  # verl < 0.3
        f"{prefix}.wrap_policy.transformer_layer_cls_to_wrap": Note(
            "temper wraps every decoder layer (FSDP2 fully_shard)"
        ),
        f"{prefix}.param_offload": Map(
            "reference.param_offload" if role == "reference" else f"{f}.param_offload"
        ),
        f"{prefix}.reshard_after_forward": Map(f"{f}.reshard_after_forward"),
        f"{prefix}.fsdp_size": Map(f"{f}.fsdp_size"),
        f"{prefix}.forward_prefetch": Note(FSDP1),
        f"{prefix}.use_orig_params": Note(FSDP1),
        f"{prefix}.grad_offload": _off(
            "gradients stay on device",
            "FSDP2 has no separate gradient offload",
            "use offload_policy: true (parameters, gradients and optimizer on CPU)",
        ),
        f"{prefix}.offload_policy": Map(f"{f}.offload_policy"),
    }
    if role != "reward.model":
        rules |= {
            f"{prefix}.optimizer_offload": (
                Map(f"{f}.optimizer_offload") if trained else Note("the reference has no optimizer")
            ),
            f"{prefix}.model_dtype": (
                Map(f"{role}.master_dtype", r.precision(_STRATEGY_KEYS.get(role, "")))
                if trained
                else _inert(
                    r.reference_storage,
                    "the reference is stored in the compute dtype (model.dtype)",
                    "the reference is stored in the compute dtype; a storage dtype below it "
                    "would round the weights first",
                    f"set it to fp32 or to {ACT}.fsdp_config.dtype",
                )
            ),
            f"{prefix}.dtype": dtype_rule,
            f"{prefix}.seed": Map("experiment.seed", weak=True),
            # process-wide in temper: true on any role turns it on for the run
            f"{prefix}.full_determinism": Map("experiment.deterministic", r.only_true),
            f"{prefix}.entropy_from_logits_with_chunking": (
                Map("actor.entropy_chunk_size", r.entropy_chunk, weak=True)
                if role == "actor"
                else Note("this role computes no entropy")
            ),
            f"{prefix}.entropy_checkpointing": Note(PERF),
            f"{prefix}.forward_only": Note(INTERNAL),
            f"{prefix}.strategy": Map(f"{role}.strategy", r.strategy, weak=True),
        }
        if role == "reference":
            rules[f"{prefix}.ulysses_sequence_parallel_size"] = Note(
                "the reference follows the actor's sequence parallelism"
            )
            rules[f"{prefix}.use_torch_compile"] = Note(PERF)
        else:
            # fsdp_config copies of role-level keys: the role-level key wins
            rules[f"{prefix}.ulysses_sequence_parallel_size"] = Map(
                f"{role}.ulysses_sequence_parallel_size", weak=True
            )
            rules[f"{prefix}.use_torch_compile"] = Map(f"{role}.use_torch_compile", weak=True)
    return rules


def _sp_follows_actor() -> Refuse:
    return _inert(
        r.equals(f"{ACT}.ulysses_sequence_parallel_size", 1),
        "the reference uses the actor's sequence parallelism",
        "the reference runs with the actor's ulysses_sequence_parallel_size",
        f"set it equal to {ACT}.ulysses_sequence_parallel_size",
    )


def _checkpoint(prefix: str, role: str) -> dict[str, Rule]:
    return {
        f"{prefix}.checkpoint.save_contents": Map(f"{role}.checkpoint_contents"),
        f"{prefix}.checkpoint.load_contents": _inert(
            r.equals(f"{prefix}.checkpoint.save_contents", ["model", "optimizer", "extra"]),
            "a resume loads what was saved",
            "temper loads exactly what it saved (load_contents must equal save_contents)",
            "remove load_contents",
        ),
        f"{prefix}.checkpoint.async_save": _off(
            "checkpoints are written synchronously",
            "asynchronous checkpoint saving is not supported",
            "set async_save: false",
        ),
    }


def _rollout_n(prefix: str) -> dict[str, Rule]:
    return {
        f"{prefix}.rollout_n": _inert(
            r.equals(f"{RO}.n", 1),
            f"repeats {RO}.n",
            f"must equal {RO}.n",
            f"remove it or set it to {RO}.n",
        )
    }


def _gate(path: str, gate: str, off: tuple[Any, ...], why: str, reason: str, fix: str) -> dict:
    return {path: Gated(gate, off, why, reason, fix)}


def _gather(*parts: dict[str, Rule]) -> dict[str, Rule]:
    out: dict[str, Rule] = {}
    for part in parts:
        out.update(part)
    return out


def _section_model() -> dict[str, Rule]:
    mtp_off = "multi-token prediction is off"
    return _gather(
        {
            f"{A}.hybrid_engine": Call(verl_async.hybrid_engine),
            f"{A}.nccl_timeout": Note("collective timeouts use torch's defaults"),
            f"{MOD}.path": Map("model.path"),
            f"{MOD}.hf_config_path": _off(
                "the config is read from model.path",
                "a separate config path is not supported",
                "put config.json in the model directory, or use override_config",
            ),
            f"{MOD}.tokenizer_path": Map("model.tokenizer_path"),
            f"{MOD}.use_shm": _off(
                "models load from disk",
                "shared-memory model loading is not supported",
                "set use_shm: false",
            ),
            f"{MOD}.trust_remote_code": Map("model.trust_remote_code"),
            # verl sets it as the tokenizer's template: temper's Jinja data.chat_template
            # is the run tokenizer's template too (prompts, turns, training, validation)
            f"{MOD}.custom_chat_template": Map(
                "data.chat_template", lambda v, _c: "native" if v is None else v
            ),
            f"{MOD}.external_lib": Map("model.external_lib"),
            f"{MOD}.external_libs": Map("model.external_lib"),  # spelling in verl's docs
            f"{MOD}.override_config": Map("model.override_config"),
            f"{MOD}.enable_gradient_checkpointing": Map("model.enable_gradient_checkpointing"),
            f"{MOD}.enable_activation_offload": Map("model.enable_activation_offload"),
            f"{MOD}.use_remove_padding": Map("model.use_remove_padding"),
            # weak: a megatron actor's model.lora section (verl_lora) takes their place
            f"{MOD}.lora_rank": Map("model.lora.rank", weak=True),
            f"{MOD}.lora_alpha": Map("model.lora.alpha", weak=True),
            f"{MOD}.target_modules": Map("model.lora.target_modules", weak=True),
            f"{MOD}.exclude_modules": Map("model.lora.exclude_modules"),
            f"{MOD}.lora_adapter_path": Map("model.lora.adapter_path"),
            f"{MOD}.use_liger": Map("model.use_liger"),
            f"{MOD}.use_fused_kernels": Map("model.use_fused_kernels"),
            f"{MOD}.fused_kernel_options.impl_backend": Note(PERF),
        },
        _gate(
            f"{MOD}.tiled_mlp",
            "enabled",
            (False, None),
            "tiled MLP is off",
            "tiled MLP is not supported",
            "set enabled: false",
        ),
        _gate(
            f"{MOD}.mtp",
            "enable",
            (False, None),
            mtp_off,
            "multi-token prediction is not supported",
            "set enable: false",
        ),
        _gate(
            f"{RO}.mtp",
            "enable",
            (False, None),
            mtp_off,
            "multi-token prediction is not supported",
            "set enable: false",
        ),
    )


def _section_actor() -> dict[str, Rule]:
    kw = "actor.policy_loss_kwargs"
    return _gather(
        _optim(f"{ACT}.optim", "actor"),
        _fsdp(f"{ACT}.fsdp_config", "actor", trained=True),
        _checkpoint(ACT, "actor"),
        _profiler(ACT),
        _router_replay(ACT, actor=True),
        _rollout_n(ACT),
        {
            f"{ACT}.strategy": Map("actor.strategy", r.strategy),
            f"{ACT}.ppo_mini_batch_size": Map("actor.mini_batch_size", r.times_n),
            f"{ACT}.ppo_micro_batch_size": Map(
                "actor.micro_batch_size_per_device",
                r.per_device(f"{ACT}.ulysses_sequence_parallel_size"),
            ),
            f"{ACT}.ppo_micro_batch_size_per_gpu": Map("actor.micro_batch_size_per_device"),
            f"{ACT}.use_dynamic_bsz": Map("actor.use_dynamic_bsz"),
            f"{ACT}.ppo_max_token_len_per_gpu": Map("actor.max_token_len_per_device"),
            f"{ACT}.clip_ratio": Map("actor.clip_ratio"),
            f"{ACT}.clip_ratio_low": Map("actor.clip_ratio_low"),
            f"{ACT}.clip_ratio_high": Map("actor.clip_ratio_high"),
            f"{ACT}.clip_ratio_c": Map("actor.clip_ratio_c"),
            f"{ACT}.tau_pos": Map(f"{kw}.tau_pos"),
            f"{ACT}.tau_neg": Map(f"{kw}.tau_neg"),
            f"{ACT}.freeze_vision_tower": Map("actor.freeze_vision_tower"),
            f"{ACT}.policy_loss.loss_mode": Map("actor.policy_loss"),
            f"{ACT}.policy_loss.clip_cov_ratio": Map(f"{kw}.clip_cov_ratio"),
            f"{ACT}.policy_loss.clip_cov_lb": Map(f"{kw}.clip_cov_lb"),
            f"{ACT}.policy_loss.clip_cov_ub": Map(f"{kw}.clip_cov_ub"),
            f"{ACT}.policy_loss.kl_cov_ratio": Map(f"{kw}.kl_cov_ratio"),
            f"{ACT}.policy_loss.ppo_kl_coef": Map(f"{kw}.ppo_kl_coef"),
            f"{ACT}.policy_loss.dro_beta": Map(f"{kw}.dro_beta"),
            f"{ACT}.loss_agg_mode": Map("actor.loss_agg_mode"),
            f"{ACT}.loss_scale_factor": _off(
                "no constant loss scaling",
                "loss_scale_factor is not supported",
                "use loss_agg_mode seq-mean-token-sum-norm, or remove it",
            ),
            f"{ACT}.entropy_coeff": Map("actor.entropy_coeff"),
            f"{ACT}.calculate_entropy": Note("entropy is logged whenever it is computed"),
            f"{ACT}.use_kl_loss": Map("actor.use_kl_loss"),
            f"{ACT}.kl_loss_coef": Map("actor.kl_loss_coef"),
            f"{ACT}.kl_loss_type": Map("actor.kl_loss_type"),
            f"{ACT}.use_prefix_grouper": Note(PERF),
            f"{ACT}.use_torch_compile": Map("actor.use_torch_compile"),
            f"{ACT}.ppo_epochs": Map("actor.ppo_epochs"),
            f"{ACT}.shuffle": Map("actor.shuffle"),
            f"{ACT}.data_loader_seed": Map("experiment.seed", weak=True),
            f"{ACT}.use_fused_kernels": Map("model.use_fused_kernels"),
            f"{ACT}.grad_clip": Map("actor.grad_clip", r.titan_role_clip(f"{ACT}.strategy")),
            f"{ACT}.ulysses_sequence_parallel_size": Map(
                "actor.ulysses_sequence_parallel_size", r.role_sp
            ),
            f"{ACT}.entropy_from_logits_with_chunking": Map(
                "actor.entropy_chunk_size", r.entropy_chunk
            ),
            f"{ACT}.entropy_checkpointing": Note(PERF),
            f"{ACT}.use_remove_padding": Map("model.use_remove_padding"),
            f"{ACT}.calculate_sum_pi_squared": Map("actor.calculate_sum_pi_squared"),
            f"{ACT}.sum_pi_squared_checkpointing": Note(PERF),
        },
    )


def _section_ref() -> dict[str, Rule]:
    return _gather(
        _fsdp(f"{REF}.fsdp_config", "reference", trained=False),
        _profiler(REF),
        _router_replay(REF),
        _rollout_n(REF),
        {
            f"{REF}.strategy": Map("reference.strategy", r.strategy),
            f"{REF}.use_torch_compile": Note(PERF),
            f"{REF}.log_prob_micro_batch_size": Map(
                "reference.log_prob_micro_batch_size_per_device",
                r.per_device(f"{ACT}.ulysses_sequence_parallel_size"),
            ),
            f"{REF}.log_prob_micro_batch_size_per_gpu": Map(
                "reference.log_prob_micro_batch_size_per_device"
            ),
            f"{REF}.log_prob_use_dynamic_bsz": Map("reference.use_dynamic_bsz"),
            f"{REF}.log_prob_max_token_len_per_gpu": Map(
                "reference.log_prob_max_token_len_per_device"
            ),
            f"{REF}.ulysses_sequence_parallel_size": _sp_follows_actor(),
            f"{REF}.entropy_from_logits_with_chunking": Note("the reference computes no entropy"),
            f"{REF}.entropy_checkpointing": Note("the reference computes no entropy"),
        },
    )
