"""The verl key table, part three: critic, reward, algorithm, trainer, Ray; the whole table.

``TABLE`` (all sections; part one is :mod:`verl.table`, part two :mod:`verl.table_rollout`),
``WRAPPER``, ``INHERIT`` and ``DEFAULTS`` are what the translator in :mod:`verl.translate` reads.
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core.rules import Call, Map, Note, Rule
from temper.config.dialects.verl import asynchronous as va
from temper.config.dialects.verl import fully_async as fa
from temper.config.dialects.verl import rs as verl_rs
from temper.config.dialects.verl import transforms as r
from temper.config.dialects.verl.distill import RULES as DISTILL_RULES
from temper.config.dialects.verl.megatron import MEGATRON_INHERIT, megatron_rules
from temper.config.dialects.verl.prime import RULES as PRIME_RULES
from temper.config.dialects.verl.rewards import RULES
from temper.config.dialects.verl.spin import RULES as SPIN_RULES
from temper.config.dialects.verl.sppo import RULES as SPPO_RULES
from temper.config.dialects.verl.table import (
    ACT,
    INTERNAL,
    MOD,
    PERF,
    PROFILE_OFF,
    RO,
    _checkpoint,
    _fsdp,
    _gate,
    _gather,
    _inert,
    _off,
    _optim,
    _profiler,
    _rollout_n,
    _section_actor,
    _section_model,
    _section_ref,
)
from temper.config.dialects.verl.table_rollout import _section_data, _section_rollout, engine_kwargs
from temper.config.dialects.verl.v09 import RULES as V09_RULES
from temper.config.dialects.verl.versions import ADDITIONS, OVERRIDES

CR, RM = "critic", "reward_model"


def _section_critic() -> dict[str, Rule]:
    m = f"{CR}.model"
    lora_off = r.when_off(f"{m}.lora_rank", (0, None))
    return _gather(
        _optim(f"{CR}.optim", "critic"),
        _fsdp(f"{m}.fsdp_config", "critic", trained=True),
        _checkpoint(CR, "critic"),
        _profiler(CR),
        _rollout_n(CR),
        {
            f"{m}.path": Map("critic.model_path"),
            f"{m}.tokenizer_path": _inert(
                r.same_tokenizer,
                "the critic uses the policy tokenizer",
                "the critic scores the policy's tokens, so it must use the policy tokenizer",
                "remove it (or set it to the policy model path)",
            ),
            f"{m}.override_config": _inert(
                (None, {}),
                "no overrides",
                "critic config overrides are not supported",
                "remove them",
            ),
            f"{m}.external_lib": _inert(
                r.equals(f"{MOD}.external_lib"),
                "the policy's external_lib is imported",
                "the critic imports the policy's external_lib",
                f"set {MOD}.external_lib",
            ),
            f"{m}.trust_remote_code": _inert(
                r.equals(f"{MOD}.trust_remote_code", False),
                "follows the policy model",
                "the critic follows the policy's trust_remote_code",
                f"set {MOD}.trust_remote_code",
            ),
            f"{m}.use_shm": _off(
                "models load from disk",
                "shared-memory model loading is not supported",
                "set use_shm: false",
            ),
            f"{m}.enable_gradient_checkpointing": Note(PERF),
            f"{m}.enable_activation_offload": Note(PERF),
            f"{m}.use_remove_padding": Note(PERF),
            f"{m}.lora_rank": _inert(
                (0, None),
                "the critic trains all weights",
                "critic LoRA is not supported",
                "set lora_rank: 0",
            ),
            f"{m}.lora_alpha": _inert(
                lora_off, "critic LoRA is off", "critic LoRA is not supported", "set lora_rank: 0"
            ),
            f"{m}.target_modules": _inert(
                lora_off, "critic LoRA is off", "critic LoRA is not supported", "set lora_rank: 0"
            ),
            f"{CR}.strategy": Map("critic.strategy", r.strategy),
            f"{CR}.enable": Map("critic.enable"),
            f"{CR}.ppo_mini_batch_size": Map("critic.mini_batch_size", r.times_n),
            f"{CR}.ppo_micro_batch_size": Map(
                "critic.micro_batch_size_per_device",
                r.per_device(f"{CR}.ulysses_sequence_parallel_size"),
            ),
            f"{CR}.ppo_micro_batch_size_per_gpu": Map("critic.micro_batch_size_per_device"),
            f"{CR}.use_dynamic_bsz": Map("critic.use_dynamic_bsz"),
            f"{CR}.ppo_max_token_len_per_gpu": Map("critic.max_token_len_per_device"),
            f"{CR}.forward_max_token_len_per_gpu": Map("critic.log_prob_max_token_len_per_device"),
            f"{CR}.forward_micro_batch_size": Map(
                "critic.log_prob_micro_batch_size_per_device",
                r.per_device(f"{CR}.ulysses_sequence_parallel_size"),
            ),
            f"{CR}.forward_micro_batch_size_per_gpu": Map(
                "critic.log_prob_micro_batch_size_per_device"
            ),
            f"{CR}.ppo_epochs": Map("critic.ppo_epochs"),
            f"{CR}.shuffle": Map("critic.shuffle"),
            f"{CR}.data_loader_seed": Map("experiment.seed", weak=True),
            f"{CR}.cliprange_value": Map("critic.cliprange_value"),
            f"{CR}.loss_agg_mode": Map("critic.loss_agg_mode"),
            f"{CR}.ulysses_sequence_parallel_size": Map(
                "critic.ulysses_sequence_parallel_size", r.role_sp
            ),
            f"{CR}.grad_clip": Map("critic.grad_clip"),
        },
        _gate(
            f"{m}.tiled_mlp",
            "enabled",
            (False, None),
            "tiled MLP is off",
            "tiled MLP is not supported",
            "set enabled: false",
        ),
    )


def _section_reward() -> dict[str, Rule]:
    m = f"{RM}.model"
    managers = r.choice("naive", "batch", "dapo", "prime")
    return _gather(
        _fsdp(f"{m}.fsdp_config", "reward.model", trained=False),
        _profiler(RM),
        {
            f"{RM}.enable": Map("reward.model.enable"),
            f"{RM}.enable_resource_pool": _off(
                "the reward model shares the actor's devices",
                "a separate reward-model pool is not expressible in verl terms",
                "remove it; set resources.reward natively",
            ),
            f"{RM}.n_gpus_per_node": _inert(
                r.when_off(f"{RM}.enable_resource_pool"),
                "enable_resource_pool is off",
                "a separate reward-model pool is not supported",
                "remove it",
            ),
            f"{RM}.nnodes": _inert(
                r.when_off(f"{RM}.enable_resource_pool"),
                "enable_resource_pool is off",
                "a separate reward-model pool is not supported",
                "remove it",
            ),
            f"{RM}.strategy": Map("reward.model.strategy", r.strategy),
            f"{m}.input_tokenizer": Map("reward.model.input_tokenizer"),
            f"{m}.path": Map("reward.model.path"),
            f"{m}.external_lib": _inert(
                r.equals(f"{MOD}.external_lib"),
                "the policy's external_lib is imported",
                "the reward model imports the policy's external_lib",
                f"set {MOD}.external_lib",
            ),
            f"{m}.trust_remote_code": Map("reward.model.trust_remote_code"),
            f"{m}.override_config": _inert(
                (None, {}),
                "no overrides",
                "reward-model config overrides are not supported",
                "remove them",
            ),
            f"{m}.use_shm": _off(
                "models load from disk",
                "shared-memory model loading is not supported",
                "set use_shm: false",
            ),
            f"{m}.use_remove_padding": Note(PERF),
            f"{m}.use_fused_kernels": Note(PERF),
            f"{RM}.micro_batch_size": Map(
                "reward.model.micro_batch_size_per_device", r.per_device(None)
            ),
            f"{RM}.micro_batch_size_per_gpu": Map("reward.model.micro_batch_size_per_device"),
            f"{RM}.max_length": Map("reward.model.max_length"),
            f"{RM}.use_dynamic_bsz": Map("reward.model.use_dynamic_bsz"),
            f"{RM}.forward_max_token_len_per_gpu": Map(
                "reward.model.forward_max_token_len_per_device"
            ),
            f"{RM}.reward_manager": Map("reward.reward_manager", managers),
            f"{RM}.reward_loop_source": _inert(
                ("register", None),
                "built-in reward managers",
                "custom reward loops are not supported",
                "remove it",
            ),
            f"{RM}.reward_loop_module_path": _off(
                "built-in reward managers", "custom reward loops are not supported", "remove it"
            ),
            f"{RM}.reward_loop_class_name": _off(
                "built-in reward managers", "custom reward loops are not supported", "remove it"
            ),
            f"{RM}.launch_reward_fn_async": Map("reward.launch_async"),
            f"{RM}.ulysses_sequence_parallel_size": _inert(
                (1, None),
                "no sequence parallelism",
                "reward-model sequence parallelism is not supported",
                "set it to 1",
            ),
            f"{RM}.use_reward_loop": Note(INTERNAL),
            f"{RM}.num_workers": Map("reward.num_workers"),
            f"{RM}.overlong_buffer.enable": Map("algorithm.overlong_buffer.enable"),
            f"{RM}.overlong_buffer.len": Map("algorithm.overlong_buffer.len"),
            f"{RM}.overlong_buffer.penalty_factor": Map("algorithm.overlong_buffer.penalty_factor"),
            f"{RM}.overlong_buffer.log": Note("overlong metrics are always logged"),
            "reward_manager.source": _inert(
                ("register", None),
                "built-in reward managers",
                "custom reward managers are not supported",
                "remove it",
            ),
            "reward_manager.name": Map("reward.reward_manager", managers),
            "custom_reward_function.path": Map("reward.custom_function.path"),
            "custom_reward_function.name": Map("reward.custom_function.name"),
            "custom_reward_function.reward_kwargs": Map("reward.custom_function.kwargs"),
        },
        RULES,
        _gate(
            "reward_manager.module",
            "path",
            (None,),
            "built-in reward managers",
            "custom reward manager modules are not supported",
            "set path: null",
        ),
    )


def _section_algorithm() -> dict[str, Rule]:
    al, rc = "algorithm", "algorithm.rollout_correction"
    return {
        f"{rc}.rollout_is": Map("actor.rollout_is", va.rollout_is),
        f"{rc}.rollout_is_threshold": Map("actor.rollout_is_threshold"),
        f"{rc}.rollout_rs": Call(verl_rs.rollout_rs),
        f"{rc}.rollout_rs_threshold": Call(verl_rs.rollout_rs_threshold),
        f"{rc}.bypass_mode": Call(va.bypass_mode),
        f"{rc}.loss_type": Call(va.loss_type),
        f"{rc}.rollout_is_batch_normalize": Map(
            "actor.rollout_is_batch_normalize", va.rollout_is_batch_normalize
        ),
        f"{al}.gamma": Map("algorithm.gamma"),
        f"{al}.lam": Map("algorithm.lam"),
        f"{al}.adv_estimator": Map("algorithm.adv_estimator"),
        f"{al}.norm_adv_by_std_in_grpo": Map("algorithm.norm_adv_by_std_in_grpo"),
        f"{al}.gdpo_reward_keys": Map("algorithm.gdpo_reward_keys"),
        f"{al}.gdpo_reward_weights": Map("algorithm.gdpo_reward_weights"),
        f"{al}.use_kl_in_reward": Map("algorithm.use_kl_in_reward"),
        f"{al}.kl_penalty": Map("algorithm.kl_penalty"),
        f"{al}.kl_ctrl.type": Map("algorithm.kl_ctrl.type"),
        f"{al}.kl_ctrl.kl_coef": Map("algorithm.kl_ctrl.kl_coef"),
        f"{al}.kl_ctrl.horizon": Map("algorithm.kl_ctrl.horizon"),
        f"{al}.kl_ctrl.target_kl": Map("algorithm.kl_ctrl.target_kl"),
        f"{al}.use_pf_ppo": Map("algorithm.use_pf_ppo"),
        f"{al}.pf_ppo.reweight_method": Map("algorithm.pf_ppo.reweight_method"),
        f"{al}.pf_ppo.weight_pow": Map("algorithm.pf_ppo.weight_pow"),
        f"{al}.filter_groups.enable": Map("algorithm.filter_groups.enable", fa.filter_groups),
        f"{al}.filter_groups.metric": Map("algorithm.filter_groups.metric", r.filter_metric),
        f"{al}.filter_groups.max_num_gen_batches": Map(
            "algorithm.filter_groups.max_num_gen_batches"
        ),
    }


def _section_trainer() -> dict[str, Rule]:
    t = "trainer"
    nsys = "Nsight options are used only by verl's nsys profiler"
    return {
        f"{t}.balance_batch": Map("experiment.balance_batch"),
        f"{t}.total_epochs": Map("experiment.total_epochs"),
        f"{t}.total_training_steps": Map("experiment.max_steps", r.none_if_negative),
        f"{t}.project_name": Map("experiment.project_name"),
        f"{t}.experiment_name": Map("experiment.experiment_name"),
        f"{t}.logger": Map("experiment.trackers", r.trackers),
        f"{t}.log_val_generations": Map("experiment.log_val_generations"),
        f"{t}.rollout_data_dir": Map("experiment.rollout_data_dir"),
        f"{t}.validation_data_dir": Map("experiment.validation_data_dir"),
        f"{t}.nnodes": Map("resources.nnodes"),
        f"{t}.n_gpus_per_node": Map("resources.devices_per_node"),
        f"{t}.save_freq": Map("experiment.save_freq"),
        f"{t}.esi_redundant_time": Note(
            "Ascend elastic-training margin; checkpoints follow save_freq and signals"
        ),
        f"{t}.resume_mode": Map("experiment.resume_mode"),
        f"{t}.resume_from_path": Map("experiment.resume_from_path"),
        f"{t}.val_before_train": Map("experiment.val_before_train"),
        f"{t}.val_only": Map("experiment.val_only"),
        f"{t}.test_freq": Map("experiment.test_freq"),
        f"{t}.critic_warmup": Map("experiment.critic_warmup"),
        f"{t}.default_hdfs_dir": _off(
            "checkpoints stay local",
            "HDFS is not supported",
            "use a local trainer.default_local_dir",
        ),
        f"{t}.del_local_ckpt_after_load": _off(
            "local checkpoints are kept",
            "deleting checkpoints after load is not supported",
            "set it to false",
        ),
        f"{t}.default_local_dir": Map("experiment.output_dir"),
        f"{t}.max_actor_ckpt_to_keep": Map("experiment.max_actor_ckpt_to_keep"),
        f"{t}.max_critic_ckpt_to_keep": Map("experiment.max_critic_ckpt_to_keep"),
        f"{t}.ray_wait_register_center_timeout": Note(INTERNAL),
        f"{t}.device": Map("experiment.device", r.device),
        f"{t}.use_legacy_worker_impl": Note(INTERNAL),
        f"{t}.profile_steps": Map("experiment.profile_steps"),
        f"{t}.controller_nsight_options": Note(nsys),
        f"{t}.worker_nsight_options": Note(nsys),
    }


def _section_ray() -> dict[str, Rule]:
    out: dict[str, Rule] = {}
    for p in ("ray_init", "ray_kwargs.ray_init"):
        out[f"{p}.num_cpus"] = Map("resources.ray.num_cpus")
        out[f"{p}.address"] = Map("resources.ray.address")
        out[f"{p}.runtime_env.env_vars"] = Map("resources.ray.system_envs")
    for p in ("ray_init", "ray_kwargs"):
        out[f"{p}.timeline_json_file"] = Map("resources.ray.timeline_json_file")
    return out


TABLE: dict[str, Rule] = _gather(
    ADDITIONS,  # first: keys of other verl versions, replaced by any row below for the key
    _section_model(),
    _section_actor(),
    _section_ref(),
    _section_rollout(),
    _section_data(),
    _section_critic(),
    _section_reward(),
    _section_algorithm(),
    _section_trainer(),
    _section_ray(),
    megatron_rules(),
    V09_RULES,
    DISTILL_RULES,
    SPPO_RULES,
    SPIN_RULES,
    PRIME_RULES,
    _gate(
        "global_profiler",
        "tool",
        (None,),
        PROFILE_OFF,
        "verl's global profiler is not supported",
        "remove it; set experiment.profile_steps",
    ),
    _gate(
        "transfer_queue",
        "enable",
        (False, None),
        "the transfer queue is off",
        "verl's transfer queue is not supported",
        "set enable: false",
    ),
    OVERRIDES,  # last: rows that replace older ones on purpose (profilers, shm, engines, …)
)

# Keys of the vendor wrapper around a verl config (document 003: ``backend_config.*``).
WRAPPER: dict[str, Rule] = {
    "af_output_dir": Map("experiment.output_dir", weak=True),
    "engine_kwargs": Call(engine_kwargs),
}

# verl's ``${oc.select:...}`` defaults: (key, key whose value it takes when omitted).
INHERIT: list[tuple[str, str]] = [
    (f"{CR}.strategy", f"{ACT}.strategy"),
    ("actor_rollout_ref.ref.strategy", f"{ACT}.strategy"),
    (f"{RM}.strategy", f"{ACT}.strategy"),
    (f"{CR}.ppo_mini_batch_size", f"{ACT}.ppo_mini_batch_size"),
    (f"{CR}.use_dynamic_bsz", f"{ACT}.use_dynamic_bsz"),
    (f"{CR}.ppo_epochs", f"{ACT}.ppo_epochs"),
    (f"{CR}.shuffle", f"{ACT}.shuffle"),
    (f"{CR}.loss_agg_mode", f"{ACT}.loss_agg_mode"),
    (f"{CR}.forward_micro_batch_size_per_gpu", f"{CR}.ppo_micro_batch_size_per_gpu"),
    (f"{CR}.forward_max_token_len_per_gpu", f"{CR}.ppo_max_token_len_per_gpu"),
    ("actor_rollout_ref.ref.log_prob_use_dynamic_bsz", f"{ACT}.use_dynamic_bsz"),
    ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", f"{ACT}.ppo_max_token_len_per_gpu"),
    (f"{RO}.log_prob_use_dynamic_bsz", f"{ACT}.use_dynamic_bsz"),
    (f"{RO}.log_prob_max_token_len_per_gpu", f"{ACT}.ppo_max_token_len_per_gpu"),
    (f"{RM}.use_dynamic_bsz", f"{CR}.use_dynamic_bsz"),
    *MEGATRON_INHERIT,
]

# verl defaults that differ from temper's and change what a run does.
DEFAULTS: dict[str, Any] = {
    "algorithm.adv_estimator": "gae",
    f"{ACT}.strategy": "fsdp",
    "trainer.total_epochs": 30,
}
