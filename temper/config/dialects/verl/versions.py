"""The verl key table, part four: keys of other verl versions and of the megatron trainer.

verl renames and adds keys from release to release, and its megatron trainer config
(``ppo_megatron_trainer.yaml``) has its own optimizer and model keys. Users pin many
versions, so the table knows them all:

- the Megatron optimizer scheduler (``lr_decay_style``, ``lr_decay_steps``, ``min_lr``,
  ``lr_warmup_init``, …) maps onto temper's schedule, which is the same function
  (linear warmup, then constant/linear/cosine decay to a floor);
- ``model.gradient_checkpointing_kwargs`` (Megatron activation recompute) and
  ``nccl_timeout`` change memory, speed or wiring, not results;
- ``reward_model.reward_kwargs`` (verl passes it to the reward manager's constructor: the
  DAPO recipe's overlong buffer lives there) maps onto ``algorithm.overlong_buffer``;
- profilers (nsys, npu, torch, torch_memory), rollout tracing and the FSDP1
  ``mixed_precision`` block are accepted with notes where they change no result;
- the ``megatron`` sections, ``load_weight`` and ``layer_name_map`` are the Megatron-Core
  engine's (:mod:`temper.config.dialects.verl.megatron`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temper.config.dialects.core import paths
from temper.config.dialects.core.rules import Call, Gated, Map, Note, Rule
from temper.config.dialects.verl import transforms as r
from temper.config.dialects.verl.lora import megatron_lora
from temper.config.dialects.verl.table import ACT, MOD, REF, RO, A, _inert, _off

CR, RM = "critic", "reward_model"
RECOMPUTE = "activation recompute (gradient checkpointing) changes memory and speed, not results"


def _min_lr(prefix: str, role: str) -> Call:
    """Megatron's absolute ``min_lr`` -> temper's ``min_lr_ratio`` (÷ the peak lr)."""

    def fn(value: Any, ctx: Any) -> None:
        if value in (None, 0, 0.0):
            ctx._write(f"{role}.optim.min_lr_ratio", 0.0)
            return
        lr = ctx.get(f"{prefix}.lr")
        if not isinstance(lr, int | float) or lr <= 0:
            raise ctx.error(f"min_lr {value} needs a positive lr", f"set {prefix}.lr")
        ctx.note(f"min_lr is absolute in verl's megatron optimizer: ratio {value} / lr {lr}")
        ctx._write(f"{role}.optim.min_lr_ratio", float(value) / float(lr))

    return Call(fn)


def _decay_style(v: Any, ctx: Any) -> Any:
    if v in ("inverse_square_root", "WSD", "wsd"):
        raise ctx.error(
            f"the '{v}' learning-rate decay is not supported",
            "use lr_decay_style: constant, linear or cosine",
        )
    return r.choice("constant", "linear", "cosine")(v, ctx)


def _megatron_optim(prefix: str, role: str) -> dict[str, Rule]:
    """verl's ``McoreOptimizerConfig`` keys beyond those of the FSDP optimizer."""
    o = f"{role}.optim"
    wsd_off = r.when_off(f"{prefix}.lr_decay_style", ("constant", "linear", "cosine", None))
    return {
        f"{prefix}.lr_warmup_init": _inert(
            (0, 0.0, None),
            "warmup starts from a learning rate of 0",
            "a warmup that starts above 0 is not supported",
            "set lr_warmup_init: 0",
        ),
        f"{prefix}.lr_decay_steps": Map(f"{o}.total_training_steps", r.none_if_negative, weak=True),
        f"{prefix}.lr_decay_style": Map(f"{o}.lr_scheduler", _decay_style, weak=True),
        f"{prefix}.min_lr": _min_lr(prefix, role),
        f"{prefix}.weight_decay_incr_style": _inert(
            ("constant", None),
            "weight decay is constant",
            "a weight-decay schedule is not supported",
            "set weight_decay_incr_style: constant",
        ),
        f"{prefix}.lr_wsd_decay_style": _inert(
            wsd_off, "used only with lr_decay_style WSD", "WSD decay is not supported", "remove it"
        ),
        f"{prefix}.lr_wsd_decay_steps": _inert(
            wsd_off, "used only with lr_decay_style WSD", "WSD decay is not supported", "remove it"
        ),
        f"{prefix}.use_checkpoint_opt_param_scheduler": Note(
            "a resume restores the schedule's step from the checkpoint either way; its "
            "settings come from the config (temper checks they did not change)"
        ),
    }


def _note_leaves(message: str) -> Callable[[Any, Any], None]:
    """A ``Call`` body noting ``message`` on every leaf under the key."""

    def note(value: Any, ctx: Any) -> None:
        for leaf in paths.leaves(value, ctx.key):
            ctx.note(message, leaf)

    return note


def _profiler_note(value: Any, ctx: Any) -> None:
    tool = value.get("tool") if isinstance(value, dict) else None
    on = isinstance(value, dict) and (value.get("enable") or value.get("tool"))
    why = (
        f"verl's {tool or 'per-role'} profiler is not run here; profiling changes no result"
        if on
        else "profiling is off"
    )
    for leaf in paths.leaves(value, ctx.key):
        ctx.note(f"no effect here ({why})", leaf)


def _mixed_precision(prefix: str) -> dict[str, Rule]:
    return {
        f"{prefix}.mixed_precision.param_dtype": Map("model.dtype", r.dtype, weak=True),
        f"{prefix}.mixed_precision.reduce_dtype": Note(
            "gradients are reduced in fp32 here (a lower-precision reduction would only be faster)"
        ),
        f"{prefix}.mixed_precision.buffer_dtype": _inert(
            ("fp32", "float32", None),
            "buffers stay in fp32",
            "buffers stay in fp32 here",
            "set buffer_dtype: fp32",
        ),
    }


def reward_kwargs(value: Any, ctx: Any) -> None:
    """``reward_model.reward_kwargs`` (verl 0.9: ``reward.reward_kwargs``): verl passes it to
    the reward manager's constructor.

    The DAPO manager takes ``overlong_buffer_cfg`` (the soft overlong penalty, temper's
    ``algorithm.overlong_buffer``) and ``max_resp_len`` (the response length it is
    measured against, which must be the run's).
    """
    if not isinstance(value, dict):
        raise ctx.error(f"expected a mapping of reward-manager arguments, got {value!r}", "")
    base = ctx.key
    for name, v in value.items():
        ctx.key = f"{base}.{name}"
        if name == "overlong_buffer_cfg":
            for k, kv in (v or {}).items():
                ctx.key = f"{base}.{name}.{k}"
                if k in ("enable", "len", "penalty_factor"):
                    ctx._write(f"algorithm.overlong_buffer.{k}", kv)
                elif k == "log":
                    ctx.note("overlong metrics are always logged")
                else:
                    raise ctx.error(
                        "unknown overlong_buffer_cfg key", "use enable, len, penalty_factor, log"
                    )
        elif name == "max_resp_len":
            length = ctx.get("data.max_response_length") or ctx.get(f"{RO}.response_length")
            if v not in (None, length):
                raise ctx.error(
                    f"{v} differs from the response length {length}; temper measures the "
                    "overlong buffer against the run's response length",
                    f"set it to {length} or remove it",
                )
            ctx.note("the overlong buffer is measured against the response length")
        else:
            raise ctx.error(
                "unknown reward-manager argument",
                "reward_kwargs takes overlong_buffer_cfg and max_resp_len (DAPO)",
            )
    ctx.key = base


def _engine_specific() -> dict[str, Rule]:
    out: dict[str, Rule] = {}
    for role, prefix in (("actor", ACT), ("reference", REF), ("critic", CR), ("reward.model", RM)):
        out[f"{prefix}.profile"] = Gated(  # verl 0.3-0.4 megatron workers
            "use_profile",
            (False, None),
            "profiling is off",
            "verl's megatron profiler is not supported",
            "set use_profile: false",
        )
        if role in ("actor", "critic"):
            out |= _megatron_optim(f"{prefix}.optim", role)
        out |= _mixed_precision(
            f"{prefix}.fsdp_config"
            if role == "actor" or role == "reference"
            else f"{prefix}.model.fsdp_config"
        )
    out[f"{ACT}.profiler"] = Call(_profiler_note)
    out[f"{REF}.profiler"] = Call(_profiler_note)
    out[f"{CR}.profiler"] = Call(_profiler_note)
    out[f"{RM}.profiler"] = Call(_profiler_note)
    out[f"{RO}.profiler"] = Call(_profiler_note)
    out["global_profiler"] = Call(_profiler_note)
    return out


SHM = "copies the model or data to /dev/shm before loading it (speed only); temper reads from disk"
OTHER_ENGINES = {"trtllm": "TensorRT-LLM"}


def _override_config(v: Any, ctx: Any) -> Any:
    """``model.override_config``: HF config overrides; in verl's megatron trainer they sit
    under ``model_config``, beside ``moe_config`` (Megatron-Core MoE settings)."""
    if not isinstance(v, dict) or not v or not set(v) <= {"model_config", "moe_config"}:
        return v
    moe = v.get("moe_config") or {}
    for k, kv in moe.items():
        ctx.key = f"{ctx.key.rsplit('.override_config', 1)[0]}.override_config.moe_config.{k}"
        if k == "freeze_moe_router" and kv:
            raise ctx.error(
                "freezing the MoE router is not supported", "set freeze_moe_router: false"
            )
        ctx.note("accepted at its inert value (the MoE router trains)")
    return dict(v.get("model_config") or {})


def _critic_override_config(v: Any, ctx: Any) -> None:
    model_config = _override_config(v, ctx)
    if model_config:
        raise ctx.error(
            f"critic config overrides are not supported (got {model_config!r})", "remove them"
        )
    ctx.note("accepted at its inert value (no overrides)")


def _optimizer_overrides(prefix: str) -> Call:
    """``override_optimizer_config``: extra optimizer arguments. Megatron's (CPU offload of
    the optimizer, precision-aware states) belong to the Megatron-Core engine."""

    def fn(v: Any, ctx: Any) -> None:
        if not v:
            ctx.note("accepted at its inert value (no optimizer overrides)")
            return
        if ctx.get(f"{prefix}.strategy") == "megatron":
            for leaf in paths.leaves(v, ctx.key):
                ctx.note("Megatron-Core optimizer settings (strategy megatron)", leaf)
            return
        raise ctx.error(
            f"optimizer overrides are not supported (got {v!r})",
            "set the optimizer fields (lr, betas, eps, weight_decay) directly",
        )

    return Call(fn)


def reward_model_server(v: Any, ctx: Any) -> None:
    """``reward_model.rollout`` (verl 0.9: ``reward.reward_model.rollout``): the engine that
    serves the reward model (verl's reward loop).

    Without a custom reward function verl treats the served model as a discriminative
    reward model — a sequence classifier it queries through the engine's classify
    endpoint (``reward_loop.py``: ``compute_score_disrm``). temper scores the same
    sequence-classification model with transformers, in process: the same scores, so the
    engine's settings change speed only. With a custom reward function the served model is
    a generative reward model that the user's function prompts — user code temper
    cannot run.
    """
    leaves = paths.leaves(v, ctx.key)
    unset = (None, "", "???")
    own = v.get("name") if isinstance(v, dict) else None
    # verl 0.9 has both locations; the served engine is the merged one (legacy wins)
    name = r.reward_setting(ctx, f"{RM}.rollout.name", "reward.reward_model.rollout.name")
    enabled = r.reward_setting(ctx, f"{RM}.enable", "reward.reward_model.enable")
    if name in unset or not enabled:
        for leaf in leaves:
            ctx.note("accepted at its inert value (no served reward model)", leaf)
        return
    custom = r.reward_setting(
        ctx, "custom_reward_function.path", "reward.custom_reward_function.path"
    )
    if custom and own not in unset:  # refused once: at the location that names the engine
        ctx.key = f"{ctx.key}.name"
        raise ctx.error(
            "a generative reward model (the served model prompted by "
            "custom_reward_function) is not supported",
            "score with a sequence-classification reward model (drop "
            "custom_reward_function.path) or a rule reward",
        )
    for leaf in leaves:
        ctx.note(
            f"the sequence-classification reward model is scored in process with "
            f"transformers (verl serves it with {name}); engine settings change speed only",
            leaf,
        )


def _is_threshold(v: Any, ctx: Any) -> None:
    """verl's ``rollout_is_threshold``: a float (or float string) truncates the weights at
    it; ``"low_high"`` (verl 0.9, IcePop) zeroes them outside ``[low, high]``. Weak: its
    default 2.0 yields to an older key, ``tis_imp_ratio_cap``, that sets it. null: verl
    computes no IS weights (``compute_rollout_correction_and_rejection_mask``)."""
    if v is None:
        if ctx.get("algorithm.rollout_correction.rollout_is") is not None:
            raise ctx.error(
                "null computes no IS weights, so rollout_is would have no effect",
                "give a threshold (verl's default is 2.0), or set rollout_is: null",
            )
        ctx.note("accepted at its inert value (null: no rollout IS weights)")
        return
    low: float | None = None
    try:
        if isinstance(v, bool):
            raise ValueError
        if isinstance(v, str) and "_" in v:
            lo, hi = v.strip().split("_", 1)
            low, high = float(lo), float(hi)
        else:
            high = float(v)
    except ValueError:
        raise ctx.error(
            f"expected a float or a 'low_high' string, got {v!r}", "e.g. 2.0, or '0.5_5.0'"
        ) from None
    if high <= 0 or (low is not None and not 0 < low <= high):
        raise ctx.error(f"the bounds must be 0 < low ≤ high, got {v!r}", "e.g. 2.0, or '0.5_5.0'")
    ctx._write("actor.rollout_is_threshold", high, weak=True)
    if low is not None:
        ctx._write("actor.rollout_is_threshold_low", low)


def _tis_cap(v: Any, ctx: Any) -> None:
    """verl 0.5's ``actor.tis_imp_ratio_cap``: truncated importance sampling of the rollout
    engine's log-probs, capped at this ratio (-1: off) — later ``rollout_is``."""
    if v is None or (isinstance(v, int | float) and v < 0):
        ctx.note("accepted at its inert value (-1: no truncated importance sampling)")
        return
    ctx._write("actor.rollout_is", "token")
    ctx._write("actor.rollout_is_threshold", float(v))


def _old_rollout_is(v: Any, ctx: Any) -> None:
    """verl 0.6's ``algorithm.rollout_is`` (a bool) with ``rollout_is_level`` /
    ``rollout_is_mode`` / ``rollout_is_threshold`` — later algorithm.rollout_correction."""
    if not v:
        ctx.note("accepted at its inert value (rollout importance sampling off)")
        return
    level = ctx.get("algorithm.rollout_is_level", "token")
    if level not in ("token", "sequence"):
        raise ctx.error(f"rollout_is_level '{level}' is not supported", "use token or sequence")
    if ctx.get("algorithm.rollout_is_mode", "truncate") != "truncate":
        raise ctx.error(
            "only truncated importance weights are supported", "set rollout_is_mode: truncate"
        )
    ctx._write("actor.rollout_is", level)


def _keep_last(v: Any, ctx: Any) -> None:
    """Old verl's ``trainer.remove_previous_ckpt_in_save``: keep only the newest checkpoint."""
    if not v:
        ctx.note("accepted at its inert value (previous checkpoints are kept)")
        return
    ctx._write("experiment.max_actor_ckpt_to_keep", 1, weak=True)
    ctx._write("experiment.max_critic_ckpt_to_keep", 1, weak=True)


def _rollout_engine(v: Any, ctx: Any) -> Any:
    """``rollout.name``; verl < 0.4 spelled the async SGLang engine ``sglang_async``."""
    if v == "sglang_async":
        ctx.note("sglang_async is verl < 0.4's name of the sglang engine")
        return "sglang"
    if v in OTHER_ENGINES:
        raise ctx.error(
            f"'{v}' ({OTHER_ENGINES[v]}) is not a rollout engine temper has",
            "use vllm, sglang or hf",
        )
    return r.engine(v, ctx)


RULES: dict[str, Rule] = {
    **_engine_specific(),
    f"{MOD}.gradient_checkpointing_kwargs": Note(RECOMPUTE),
    f"{CR}.model.gradient_checkpointing_kwargs": Note(RECOMPUTE),
    f"{MOD}.lora": Call(megatron_lora),
    f"{CR}.model.lora": Gated(
        "rank",
        (0, None),
        "critic LoRA is off (rank 0)",
        "critic LoRA is not supported",
        "set rank: 0",
    ),
    f"{MOD}.override_config": Map("model.override_config", _override_config),
    f"{CR}.model.override_config": Call(_critic_override_config),
    f"{ACT}.optim.override_optimizer_config": _optimizer_overrides(ACT),
    f"{CR}.optim.override_optimizer_config": _optimizer_overrides(CR),
    f"{RM}.rollout": Call(reward_model_server),
    f"{RO}.server": Note("connection settings of SGLang's server mode (timeouts, retries)"),
    "data.gen_batch_size": _inert(
        r.equals("data.train_batch_size"),
        "generation rounds are one train batch of prompts",
        "DAPO's dynamic-sampling generation batches larger than data.train_batch_size are "
        "not supported yet",
        "set gen_batch_size to data.train_batch_size (algorithm.filter_groups still refills "
        "with max_num_gen_batches rounds)",
    ),
    f"{RO}.expert_parallel_size": Note(
        "the engine's internal expert parallelism changes speed only"
    ),
    f"{RO}.data_parallel_size": Note(
        "the engine's internal data parallelism; temper runs one engine per rollout rank, "
        "which changes speed only"
    ),
    f"{RO}.prometheus": Call(
        _note_leaves("no effect here (Prometheus exports engine metrics only)")
    ),
    # verl leaves the engine to the user; its default rollout (TP 2) is vLLM's
    f"{RO}.name": Map("rollout.engine", _rollout_engine, unset="auto"),
    f"{MOD}.use_shm": Note(SHM),
    f"{CR}.model.use_shm": Note(SHM),
    f"{RM}.model.use_shm": Note(SHM),
    "data.use_shm": Note(SHM),
    f"{RO}.sglang_rollout_mode": Note(
        "temper's engines batch continuously; sync/async is verl wiring"
    ),
    f"{RO}.trace": Call(
        _note_leaves("no effect here (rollout tracing exports spans only; it changes no result)")
    ),
    f"{CR}.nccl_timeout": Note("collective timeouts use torch's defaults"),
    f"{RM}.nccl_timeout": Note("collective timeouts use torch's defaults"),
    f"{CR}.kl_ctrl": Note(
        "verl's megatron critic never reads it (the KL controller is algorithm.kl_ctrl)"
    ),
    f"{RM}.reward_kwargs": Call(reward_kwargs),
    # ---- renamed or retired keys of verl 0.2-0.6
    f"{ACT}.checkpoint.contents": Map("actor.checkpoint_contents"),
    f"{CR}.checkpoint.contents": Map("critic.checkpoint_contents"),
    f"{ACT}.tis_imp_ratio_cap": Call(_tis_cap),
    f"{REF}.model": _inert(
        (None,),
        "the reference is the policy's initial weights",
        "a reference model other than the policy is not supported",
        "remove it (the reference starts from actor_rollout_ref.model.path)",
    ),
    f"{REF}.param_offload": Map("reference.param_offload"),
    f"{RM}.param_offload": Map("reward.model.fsdp.param_offload"),
    f"{RO}.chat_scheduler": _inert(
        (None,),
        "the built-in scheduler",
        "custom chat schedulers are not supported",
        "set chat_scheduler: null",
    ),
    f"{RO}.update_weights_bucket_megabytes": Map("rollout.update_weights_bucket_megabytes"),
    "algorithm.rollout_is": Call(_old_rollout_is),
    "algorithm.rollout_is_level": Note("read with algorithm.rollout_is"),
    "algorithm.rollout_is_mode": Note("read with algorithm.rollout_is"),
    "algorithm.rollout_is_threshold": Map("actor.rollout_is_threshold", weak=True),
    # (weak: its default 2.0 yields to an older key, tis_imp_ratio_cap, that sets it)
    "algorithm.rollout_correction.rollout_is_threshold": Call(_is_threshold),
    "algorithm.rollout_is_threshold_lower": _inert(
        (None,), "no lower bound", "a lower IS bound is not supported", "set it to null"
    ),
    "algorithm.rollout_is_veto_threshold": _inert(
        r.when_off("algorithm.rollout_is"),
        "rollout_is is off",
        "vetoing sequences by their IS weight is not supported",
        "set it to null",
    ),
    "trainer.val_generations_to_log_to_wandb": Map("experiment.log_val_generations", weak=True),
    "trainer.remove_previous_ckpt_in_save": Call(_keep_last),
    "trainer.resume_from_path": Map(
        "experiment.resume_from_path", lambda v, _c: None if v in (False, "", None) else v
    ),
    "trainer.profile_continuous_steps": Note("profiling is not run here"),
    "trainer.npu_profile": Call(_profiler_note),
    f"{A}.profiler": Call(_profiler_note),
}
for _k in (
    "rollout_rs_threshold_lower",
    "rollout_token_veto_threshold",
    "use_policy_gradient",
    "bypass_old_logprob_for_rollout",
    "use_pure_rollout_correction",
):
    for _p in ("algorithm", "algorithm.rollout_correction"):
        RULES[f"{_p}.{_k}"] = _inert(
            (None, False),
            "off",
            f"{_k} (a rollout-correction mode) is not supported",
            f"set {_k} to null/false",
        )
RULES["algorithm.rollout_rs"] = _off(
    "no rejection sampling", "rollout rejection sampling is not supported", "set it to null"
)
RULES["algorithm.rollout_rs_threshold"] = _inert(
    (None,), "rollout_rs is off", "rollout rejection sampling is not supported", "set it to null"
)


# Rows that replace older rows of the table on purpose (a decision that changed: profilers
# and shared-memory loading are noted, the rollout engine knows more names, …). They enter
# the table last; every other row here enters first, so a row another module defines for
# the same key (the Megatron engine's ``megatron`` sections, …) takes precedence over it.
OVERRIDE_KEYS = {
    *(f"{p}.profiler" for p in (ACT, REF, CR, RM, RO)),
    "global_profiler",
    f"{MOD}.use_shm",
    f"{CR}.model.use_shm",
    f"{RM}.model.use_shm",
    "data.use_shm",
    f"{RO}.name",
    f"{MOD}.override_config",
    f"{CR}.model.override_config",
    f"{ACT}.optim.override_optimizer_config",
    f"{CR}.optim.override_optimizer_config",
    f"{RO}.data_parallel_size",
    f"{RO}.expert_parallel_size",
    f"{RO}.prometheus",
    f"{RO}.trace",
    f"{RM}.rollout",
    "algorithm.rollout_correction.rollout_is_threshold",
    "trainer.resume_from_path",
}
for _fsdp_prefix in (f"{ACT}.fsdp_config", f"{REF}.fsdp_config", f"{CR}.model.fsdp_config"):
    OVERRIDE_KEYS.add(f"{_fsdp_prefix}.mixed_precision.reduce_dtype")
OVERRIDES: dict[str, Rule] = {k: v for k, v in RULES.items() if k in OVERRIDE_KEYS}
ADDITIONS: dict[str, Rule] = {k: v for k, v in RULES.items() if k not in OVERRIDE_KEYS}
