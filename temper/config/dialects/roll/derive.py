"""Derivations of the ROLL dialect: values that come from several ROLL keys.

Model path, response lengths, mini-batch arithmetic, strategies and engine settings,
placement, reward routes. Each reads the (defaults-completed) ROLL data through
``Ctx.get`` and writes native keys through ``Ctx.set``, which refuses two keys setting
one native field to different values.
"""

from __future__ import annotations

import math
import os
from typing import Any

from temper.config.dialects.core.derivation import derivation
from temper.config.dialects.core.paths import MISSING
from temper.config.dialects.roll import correction as roll_correction
from temper.config.dialects.roll import pg as roll_pg
from temper.config.dialects.roll.context import Ctx as Ctx
from temper.config.dialects.roll.devices import parse_device_mapping
from temper.config.dialects.roll.rewards import is_agentic
from temper.config.dialects.roll.rewards import rewards as rewards
from temper.config.dialects.roll.transforms import (
    DTYPES,
    GENERATING_ARGS,
    INFER_STRATEGIES,
    ROLE_WORKERS,
    ROLLOUT_ENGINES,
    TRACKERS,
    TRAIN_STRATEGIES,
    choice,
    listify,
)
from temper.config.errors import ConfigError
from temper.config.loader import RawConfig
from temper.config.schema import MEGATRON_DEGREES, MODEL_PARALLEL_DEGREES

#: The worker sections of a ROLL RL file (a reward domain's, ``rewards.*``, aside).
ROLES = ("actor_train", "actor_infer", "reference", "critic", "reward")
#: Sections whose ``system_envs`` reach every worker's environment (the env managers'
#: too: ROLL starts their workers with them).
ENV_SECTIONS = (*ROLES, "train_env_manager", "val_env_manager")


@derivation(
    "pretrain",
    "reward_pretrain",
    "{role}.model_args.model_name_or_path",
    "reward.model_args.model_name_or_path",
    "reward.infer_batch_size",
    explains=("reward.model_args.dtype", "reward.generating_args.{gen}"),
    role=ROLES,
    gen=GENERATING_ARGS,
    fields=(
        "critic.model_path",
        "pipeline",
    ),
)
def model(ctx: Ctx) -> None:
    path = ctx.get("actor_train.model_args.model_name_or_path") or ctx.get("pretrain")
    if path:
        ctx.write("model.path", path, "pretrain")
    for role in ("actor_infer", "reference"):
        key = f"{role}.model_args.model_name_or_path"
        other = ctx.get(key)
        if other and path and other != path:
            raise ConfigError(
                key,
                f"'{other}' differs from the policy model '{path}'; the "
                "actor, rollout and reference share one model here",
                f"remove {key} or set it to '{path}'",
            )
    critic = ctx.get("critic.model_args.model_name_or_path") or ctx.get("reward_pretrain")
    if critic and not ctx.native_get("critic.model_path"):
        ctx.write("critic.model_path", critic, "reward_pretrain")
    if is_agentic(ctx):
        return  # an agentic file's reward worker is its envs' judge (rewards.agentic_judge)
    reward_model = ctx.get("reward.model_args.model_name_or_path")
    if reward_model:
        ctx.write("reward.model.path", reward_model, "reward.model_args.model_name_or_path")
        ctx.write("reward.model.enable", True, "reward.model_args.model_name_or_path")
    if ctx.get("reward.infer_batch_size") is not None:
        ctx.write(
            "reward.model.micro_batch_size_per_device",
            ctx.get("reward.infer_batch_size"),
            "reward.infer_batch_size",
        )
    if ctx.has("reward.model_args.dtype"):
        ctx.note("the reward model is scored in model.dtype", "reward.model_args.dtype")
    for k in sorted(ctx.get("reward.generating_args") or {}):
        ctx.note("a reward model does not generate", f"reward.generating_args.{k}")


@derivation(
    "sequence_length",
    "prompt_length",
    "response_length",
    "num_return_sequences_in_group",
    "actor_infer.generating_args.max_new_tokens",
    "actor_infer.generating_args.num_return_sequences",
    "custom_envs.*.max_tokens_per_step",
)
def lengths(ctx: Ctx, agentic: bool) -> None:
    gen_key = "actor_infer.generating_args.max_new_tokens"
    seq, prompt = ctx.get("sequence_length"), ctx.get("prompt_length")
    if seq is not None:
        ctx.write("rollout.max_model_len", seq, "sequence_length")
    if agentic:  # per-turn generation budget
        per_turn = ctx.get(gen_key)
        if per_turn is not None:
            ctx.write("rollout.response_length", per_turn, gen_key)
        elif ctx.has("response_length"):
            ctx.write("rollout.response_length", ctx.get("response_length"), "response_length")
        for tag, spec in (ctx.get("custom_envs") or {}).items():
            # ROLL's TrajEnvManager: min(the tag's max_tokens_per_step, max_new_tokens)
            step = (spec or {}).get("max_tokens_per_step") if isinstance(spec, dict) else None
            budget = [v for v in (step, per_turn) if v is not None]
            if budget:
                src = f"custom_envs.{tag}.max_tokens_per_step" if step is not None else gen_key
                ctx.write(f"agentic.custom_envs.{tag}.max_tokens_per_turn", min(budget), src)
        return
    if ctx.get("response_length") is not None:
        length, src = ctx.get("response_length"), "response_length"
    elif seq is not None:
        length, src = seq - prompt, "sequence_length"
    else:
        length, src = ctx.get(gen_key), gen_key
    if length is not None:
        ctx.write("rollout.response_length", length, src)
    n_key = "actor_infer.generating_args.num_return_sequences"
    n = ctx.get(n_key)
    if n is not None and n != ctx.get("num_return_sequences_in_group"):
        raise ConfigError(
            n_key,
            f"{n} differs from num_return_sequences_in_group "
            f"({ctx.get('num_return_sequences_in_group')})",
            "set it to ${num_return_sequences_in_group} or remove it",
        )


@derivation("{mgr}.generating_args", mgr=("train_env_manager", "val_env_manager"))
def env_manager_sampling(ctx: Ctx) -> None:
    """ROLL copies ``actor_infer.generating_args`` to both env managers, or, when the file
    gives only ``train_env_manager.generating_args``, that one to ``actor_infer``."""
    if ctx.has("val_env_manager.generating_args"):
        ctx.inert(
            "ROLL replaces it with actor_infer.generating_args",
            "val_env_manager.generating_args",
        )
    mgr = ctx.get("train_env_manager.generating_args")
    if not isinstance(mgr, dict):
        return
    infer = ctx.data.get("actor_infer")
    if isinstance(infer, dict) and infer.get("generating_args"):
        ctx.remark(
            "train_env_manager.generating_args: ROLL replaces it with "
            "actor_infer.generating_args, which the file also sets"
        )
        return
    if not isinstance(infer, dict):
        infer = ctx.data["actor_infer"] = {}
    infer["generating_args"] = dict(mgr)
    ctx.remark(
        "train_env_manager.generating_args: the rollout engine's sampling "
        "(ROLL copies it to actor_infer.generating_args)"
    )


def _norm_types(ctx: Ctx) -> None:
    """ROLL's ``norm_mean_type`` / ``norm_std_type`` (where the mean and the std of the
    sequence-score normalisation come from) -> ``reward_norm`` with ``reward_shift``
    (mean only) or ``reward_scale`` (std only)."""
    mean, std = ctx.get("norm_mean_type"), ctx.get("norm_std_type")
    for key, value in (("norm_mean_type", mean), ("norm_std_type", std)):
        if value not in ("batch", "group", "running", None):
            raise ConfigError(
                key, f"'{value}' is not a ROLL norm type", "use batch, group, running or null"
            )
    if mean is None and std is None:
        ctx.write("algorithm.reward_norm", "none", "norm_mean_type")
        return
    if mean is not None and std is not None and mean != std:
        raise ConfigError(
            "norm_std_type",
            f"a mean from '{mean}' with a std from '{std}' is not supported (temper takes "
            "both from one source, or one of them alone)",
            f"set norm_std_type: {mean}, or null (subtract the mean only)",
        )
    ctx.write("algorithm.reward_norm", mean or std, "norm_mean_type")
    if std is None:
        ctx.write("algorithm.reward_shift", True, "norm_std_type")
    elif mean is None:
        ctx.write("algorithm.reward_scale", True, "norm_mean_type")


def _estimator(ctx: Ctx) -> None:
    """``adv_estimator`` and ``reward_norm``.

    ROLL's ``grpo`` is not verl's: ``reward_postprocess`` normalizes the sequence scores
    per prompt group whenever ``adv_estimator == "grpo" or reward_norm == "group"``
    (mean only with ``reward_shift``), clips them, the token-level KL penalty is added
    after that, and ``compute_advantage`` then takes the ``reinforce`` discounted return.
    So it translates to ``reward_norm: group`` + ``adv_estimator: reinforce``, which
    runs the same steps in the same order (temper's ``grpo`` would normalize after the
    KL penalty and ignore ``gamma``). ROLL's agentic pipeline normalizes episode scores
    with ``reward_normalization`` instead and then also takes the reinforce return, so
    there ``grpo`` is ``reinforce`` alone.
    """
    estimator = ctx.get("adv_estimator")
    norm = ctx.get("reward_norm", MISSING)
    if estimator == "step_reinforce":
        return  # a step env manager's scores: roll_gigpo.step_reinforce
    if estimator == "grpo":
        ctx.write("algorithm.adv_estimator", "reinforce", "adv_estimator")
        if "train_env_manager" in ctx.data:
            ctx.remark(
                "adv_estimator: grpo: ROLL's agentic grpo is the reinforce return over "
                "scores normalized by reward_normalization: algorithm.adv_estimator=reinforce"
            )
            if norm is not MISSING:
                ctx.inert("the agentic pipeline uses reward_normalization", "reward_norm")
            return
        ctx.write("algorithm.reward_norm", "group", "adv_estimator")
        ctx.remark(
            "adv_estimator: grpo: ROLL's grpo is group reward normalization then the "
            "reinforce return: algorithm.reward_norm=group, algorithm.adv_estimator=reinforce"
        )
        if norm not in (MISSING, None, "group"):
            ctx.inert("ROLL normalizes per group whenever adv_estimator is grpo", "reward_norm")
        for key in ("norm_mean_type", "norm_std_type"):
            if ctx.has(key):
                ctx.inert("ROLL takes group mean and std whenever adv_estimator is grpo", key)
        return
    ctx.write("algorithm.adv_estimator", estimator, "adv_estimator")
    if norm is not MISSING:
        ctx.write("algorithm.reward_norm", "none" if norm is None else norm, "reward_norm")
    has_types = ctx.has("norm_mean_type") or ctx.has("norm_std_type")
    if has_types and "train_env_manager" in ctx.data:
        for key in ("norm_mean_type", "norm_std_type"):
            if ctx.has(key):
                ctx.inert("the agentic pipeline normalizes with reward_normalization", key)
    elif has_types and norm is not MISSING:
        for key in ("norm_mean_type", "norm_std_type"):
            if ctx.has(key):
                ctx.inert("the file's reward_norm (ROLL's older key) decides", key)
    elif has_types:
        _norm_types(ctx)


@derivation(
    "adv_estimator",
    "reward_norm",
    "norm_mean_type",
    "norm_std_type",
    "target_kl",
    "use_topr_loss",
    "pg_clip",
    "dual_clip_loss",
    "use_pg_clip_range",
    "pg_clip_{side}",
    side=("low", "high"),
)
def algorithm(ctx: Ctx) -> None:
    _estimator(ctx)
    roll_correction.train_infer_correction(ctx)
    # ROLL's GAE returns raw advantages; whitening is its separate whiten_advantages key.
    ctx.write("algorithm.gae_whiten", False, "adv_estimator")
    if ctx.get("target_kl") is not None:
        ctx.write("algorithm.kl_ctrl.type", "adaptive", "target_kl")
        ctx.write("algorithm.kl_ctrl.target_kl", ctx.get("target_kl"), "target_kl")
    elif ctx.has("target_kl"):
        ctx.write("algorithm.kl_ctrl.type", "fixed", "target_kl")
    if ctx.get("use_topr_loss"):
        ctx.write("actor.policy_loss", "topr", "use_topr_loss")
    pg_clip = ctx.get("pg_clip")
    c = 1.0 + 2.0 * pg_clip if ctx.get("dual_clip_loss") and pg_clip is not None else None
    ctx.write("actor.clip_ratio_c", c, "dual_clip_loss")
    if ctx.get("use_pg_clip_range"):
        for side in ("low", "high"):
            if ctx.has(f"pg_clip_{side}"):
                ctx.write(f"actor.clip_ratio_{side}", ctx.get(f"pg_clip_{side}"), f"pg_clip_{side}")
    else:
        for side in ("low", "high"):
            if ctx.has(f"pg_clip_{side}"):
                ctx.inert("used only with use_pg_clip_range: true", f"pg_clip_{side}")
    roll_pg.pg_variant(ctx)
    experiment(ctx)


@derivation("track_with", "tracker_kwargs", "resume_from_checkpoint")
def experiment(ctx: Ctx) -> None:
    """Trackers, resume and saving (every ROLL pipeline's)."""
    track = ctx.get("track_with")
    if ctx.has("track_with"):
        if track == "ml_tracker":
            raise ConfigError(
                "track_with",
                "ml_tracker is Alibaba's in-house experiment tracker, not a public package "
                "temper can log to",
                "set track_with to wandb, tensorboard, swanlab, trackio or stdout",
            )
        name = choice(TRACKERS, "track_with")(track)
        ctx.write("experiment.trackers", list(dict.fromkeys([name, "jsonl"])), "track_with")
        kwargs = ctx.get("tracker_kwargs") or {}
        if name == "swanlab" and not (isinstance(kwargs, dict) and kwargs.get("mode")):
            # ROLL leaves the mode to SwanLab, whose default is its cloud: temper's run
            # needs no account or network unless asked
            ctx.remark(
                "track_with: swanlab logs offline (under <output_dir>/swanlog unless "
                "tracker_kwargs.logdir) unless tracker_kwargs.mode or SWANLAB_MODE is "
                "online; `swanlab sync <run dir>` uploads an offline run"
            )
    resume = ctx.get("resume_from_checkpoint", MISSING)
    if resume is not MISSING:
        if isinstance(resume, str) and resume:
            ctx.write("experiment.resume_mode", "resume_path", "resume_from_checkpoint")
            ctx.write("experiment.resume_from_path", resume, "resume_from_checkpoint")
        else:
            mode = "auto" if resume else "disable"
            ctx.write("experiment.resume_mode", mode, "resume_from_checkpoint")
    # ROLL saves every save_steps and nothing else: temper's time-based recovery
    # checkpoints (native configs only) stay off, so a ROLL file saves as it does there
    ctx.write("experiment.save_every_minutes", None, "save_steps")


@derivation("actor_train.data_args.eval_file_name", "actor_train.data_args.dataset_dir")
def eval_files(ctx: Ctx) -> None:
    """The RL pipelines' validation files from ``actor_train.data_args.eval_file_name``
    (the offline pipelines validate on ``validation.data_args.file_name`` only)."""
    key = "actor_train.data_args.eval_file_name"
    if ctx.get(key) is not None:
        base = ctx.get("actor_train.data_args.dataset_dir")
        ctx.write("data.val_files", _joined(base, ctx.get(key)), key)


@derivation(
    "actor_train.data_args.domain_interleave_probs",
    "actor_train.data_args.prompt",
    "actor_train.data_args.messages",
    "rewards.*.tag_included",
    "validation.generating_args.temperature",
    "validation.generating_args.do_sample",
)
def data(ctx: Ctx) -> None:
    data_files(ctx)
    eval_files(ctx)
    probs = ctx.get("actor_train.data_args.domain_interleave_probs")
    if probs:
        # The keys are reward domains (rewards.<name>), whose tag_included lists their
        # tags; ROLL puts a row whose tag no domain lists into the domain math_rule.
        key = "actor_train.data_args.domain_interleave_probs"
        domains = {
            str(name): [str(t) for t in listify((spec or {}).get("tag_included"))]
            for name, spec in (ctx.get("rewards") or {}).items()
        }
        ctx.write("data.source_domains", {d: domains.get(d, []) for d in probs}, key)
        ctx.write("data.source_default_domain", "math_rule", key)
    if ctx.get("actor_train.data_args.prompt") and ctx.get("actor_train.data_args.messages"):
        raise ConfigError(
            "actor_train.data_args.messages",
            "prompt and messages are both set; they are exclusive",
            "keep one of data_args.prompt and data_args.messages",
        )
    temp = ctx.get("validation.generating_args.temperature")
    if temp is not None:
        ctx.write("rollout.val.temperature", temp, "validation.generating_args.temperature")
        if not ctx.has("validation.generating_args.do_sample"):
            ctx.write("rollout.val.do_sample", temp > 0, "validation.generating_args.temperature")


def _joined(base: Any, value: Any) -> list[str]:
    """ROLL's file list ``value`` with each relative file joined with ``dataset_dir``
    ``base`` (a file already under it, a ``task:`` name and an absolute path as given)."""
    out = []
    for f in listify(value):
        f = str(f)
        norm = os.path.normpath(f)
        if (
            base
            and not f.startswith("task:")  # temper's generated data, not a file
            and not os.path.isabs(f)
            and not (
                norm == os.path.normpath(base) or norm.startswith(os.path.normpath(base) + os.sep)
            )
        ):
            f = os.path.join(base, f)
        out.append(f)
    return out


@derivation(
    "actor_train.data_args.dataset_dir",
    "actor_train.data_args.file_name",
    "actor_train.data_args.template",
    "validation.data_args.file_name",
    "global_template",
    "tag_to_template",
)
def data_files(ctx: Ctx) -> None:
    """Training and validation files (joined with ``dataset_dir``) and the chat template
    (every ROLL pipeline's)."""
    base = ctx.get("actor_train.data_args.dataset_dir")
    for src, dst in (
        ("actor_train.data_args.file_name", "data.train_files"),
        ("validation.data_args.file_name", "data.val_files"),
    ):
        if ctx.get(src) is not None:
            ctx.write(dst, _joined(base, ctx.get(src)), src)
    template = ctx.get("actor_train.data_args.template", MISSING)
    if template is MISSING:
        template = ctx.get("global_template", MISSING)
    for tag, named in (ctx.get("tag_to_template") or {}).items():
        if named != (None if template is MISSING else template):
            raise ConfigError(
                f"tag_to_template.{tag}",
                f"'{named}' is not the file's template ({template if template is not MISSING else 'none'}): "
                "one chat template serves every tag here",
                "remove tag_to_template, or give every tag the one template",
            )
    if template is not MISSING:
        ctx.write("data.chat_template", "native", "actor_train.data_args.template")
        if template not in (None, "native"):
            ctx.remark(
                f"actor_train.data_args.template: '{template}' -> native: the "
                "tokenizer's own chat template is used (apply_chat_template)"
            )


@derivation(
    "{role}.strategy_args.strategy_name",
    "{role}.strategy_args.strategy_config",
    "actor_infer.num_gpus_per_worker",
    role=ROLES,
    fields=(
        "model.dtype",
        "pipeline",
        "rollout.engine",
        "rollout.tensor_parallel_size",
    ),
)
def strategies(ctx: Ctx) -> None:
    for role in ROLES:
        ckey = f"{role}.strategy_args.strategy_config"
        if ctx.has(ckey) and not ctx.get(ckey):
            ctx.inert("empty: the engine's defaults apply", ckey)
        elif ctx.get(ckey) and ctx.get(f"{role}.strategy_args.strategy_name") is None:
            raise ConfigError(
                ckey,
                "strategy_config without strategy_name",
                f"set {role}.strategy_args.strategy_name",
            )
    roles = {
        "actor_train": ("actor", TRAIN_STRATEGIES),
        "critic": ("critic", TRAIN_STRATEGIES),
        "reference": ("reference", INFER_STRATEGIES),
        "reward": ("reward.model", INFER_STRATEGIES),
    }
    if is_agentic(ctx):  # the envs' judge engine: rewards.agentic_judge
        del roles["reward"]
    for role, (dst, table) in roles.items():
        key = f"{role}.strategy_args.strategy_name"
        name = ctx.get(key)
        if name is None:
            continue
        engine = choice(table, key)(name)
        ctx.write(f"{dst}.strategy", engine, key)
        cfg = ctx.get(f"{role}.strategy_args.strategy_config") or {}
        ckey = f"{role}.strategy_args.strategy_config"
        if engine == "deepspeed" and role != "reward":
            ctx.write(f"{dst}.deepspeed", dict(cfg), ckey)
        elif engine == "megatron" and role != "reward":
            _megatron(ctx, cfg, f"{dst}.megatron", ckey)
        elif engine == "fsdp2" and cfg:
            _fsdp2(ctx, cfg, f"{dst}.fsdp", ckey)
        elif cfg:
            ctx.inert(f"{name} takes no strategy_config here", ckey)
    key = "actor_infer.strategy_args.strategy_name"
    if ctx.get(key) is not None:
        engine = choice(ROLLOUT_ENGINES, key)(ctx.get(key))
        ctx.write("rollout.engine", engine, key)
        _engine_cfg(ctx, engine, ctx.get("actor_infer.strategy_args.strategy_config") or {})
    gpus = ctx.get("actor_infer.num_gpus_per_worker")
    tp = ctx.native_get("rollout.tensor_parallel_size")
    if gpus is not None and not tp:
        ctx.write("rollout.tensor_parallel_size", gpus, "actor_infer.num_gpus_per_worker")
    elif gpus is not None and gpus != tp and ctx.native_get("rollout.engine") == "vllm":
        # ROLL gives a vLLM worker tensor_parallel_size × pipeline_parallel_size GPUs,
        # whatever num_gpus_per_worker says (roll/configs/worker_config.py)
        ctx.replace("resources.devices_per_infer_worker", tp, "actor_infer.num_gpus_per_worker")
        ctx.inert(
            f"ROLL replaces {gpus} with the vLLM engine's tensor_parallel_size ({tp})",
            "actor_infer.num_gpus_per_worker",
        )


# strategy_config keys with a field of their own in the native megatron section; the
# rest (moe_*, other TransformerConfig arguments) go to megatron.extra
MEGATRON_KEYS = {
    *MEGATRON_DEGREES,
    "sequence_parallel",
    "use_distributed_optimizer",
    "recompute_granularity",
    "recompute_method",
    "recompute_num_layers",
    "recompute_modules",
    "overlap_grad_reduce",
    "overlap_param_gather",
}
VLLM_KEYS = {
    "gpu_memory_utilization",
    "block_size",
    "max_model_len",
    "load_format",
    "enforce_eager",
    "max_num_batched_tokens",
    "enable_prefix_caching",
    "tensor_parallel_size",
    "max_num_seqs",
    "enable_chunked_prefill",
    "disable_log_stats",
}
SGLANG_KEYS = {
    "mem_fraction_static": "gpu_memory_utilization",
    "load_format": "load_format",
    "tp_size": "tensor_parallel_size",
    "context_length": "max_model_len",
}


FSDP2_KEYS = {"fsdp_size", "offload_policy", "reshard_after_forward"}
FSDP2_PERF = {
    "wrap_policy": "temper wraps every decoder layer (FSDP2 fully_shard)",
    "apply_tiled_mlp": "tiled MLP computes the MLP in chunks: memory only",
    "tiled_num_shards": "tiled MLP computes the MLP in chunks: memory only",
    "apply_expert_patch": "an MoE kernel patch: speed only",
    "moe_use_grouped_mm": "grouped MoE matmuls: speed only",
    "ep_size": "expert-parallel sharding: speed and memory only",
    "efsdp_size": "expert-parallel sharding: speed and memory only",
    "use_batched_model_update": "weight-sync batching: speed only",
}


def _fsdp2(ctx: Ctx, cfg: dict[str, Any], dst: str, key: str) -> None:
    """ROLL's fsdp2 strategy_config -> the role's native FSDP2 settings."""
    model_dtype = ctx.native_get("model.dtype")
    for k, v in cfg.items():
        if k in FSDP2_KEYS:
            ctx.write(f"{dst}.{k}", v, f"{key}.{k}")
        elif k == "param_dtype":
            if model_dtype is not None and DTYPES.get(v, v) != model_dtype:
                raise ConfigError(
                    f"{key}.{k}",
                    f"'{v}' differs from actor_train.model_args.dtype; temper computes every "
                    "role in model.dtype",
                    "set them equal",
                )
            ctx.inert("the compute dtype is model.dtype", f"{key}.{k}")
        elif k == "reduce_dtype":
            ctx.inert(
                "gradients are reduced in fp32 here (a lower-precision reduction would only "
                "be faster)",
                f"{key}.{k}",
            )
        elif k in FSDP2_PERF:
            ctx.inert(FSDP2_PERF[k], f"{key}.{k}")
        else:
            raise ConfigError(
                f"{key}.{k}",
                "not an FSDP2 setting temper knows",
                f"remove it (known: {', '.join(sorted({*FSDP2_KEYS, *FSDP2_PERF}))}, "
                "param_dtype, reduce_dtype)",
            )


def _megatron(ctx: Ctx, cfg: dict[str, Any], dst: str, key: str) -> None:
    extra = {}
    for k, v in cfg.items():
        if k == "recompute_modules" and isinstance(v, str):  # ROLL files write "moe,layernorm"
            v = [m.strip() for m in v.split(",") if m.strip()]
        if k in MEGATRON_KEYS:
            ctx.write(f"{dst}.{k}", v, f"{key}.{k}")
        else:  # moe_* and other TransformerConfig arguments
            extra[k] = v
    if extra:
        ctx.write(f"{dst}.extra", extra, key)


def _engine_cfg(ctx: Ctx, engine: str, cfg: dict[str, Any]) -> None:
    key = "actor_infer.strategy_args.strategy_config"
    extra = {}
    for k, v in cfg.items():
        if engine == "vllm" and k in VLLM_KEYS:
            ctx.write(f"rollout.{k}", v, f"{key}.{k}")
        elif engine == "sglang" and k in SGLANG_KEYS:
            ctx.write(f"rollout.{SGLANG_KEYS[k]}", v, f"{key}.{k}")
        else:
            extra[k] = v
    if extra:
        ctx.write(f"rollout.engine_kwargs.{engine}", extra, key)


ROLL_GPUS_PER_NODE = 8


@derivation(
    "{role}.device_mapping",
    "{role}.world_size",
    "{role}.worker_cls",
    "{env}.system_envs",
    "actor_infer.num_gpus_per_worker",
    "num_gpus_per_node",
    "num_nodes",
    role=(*ROLES, "rewards.*"),
    env=(*ENV_SECTIONS, "rewards.*"),
    fields=("resources.ray.system_envs",),
)
def placement(ctx: Ctx) -> None:
    used: set[int] = set()
    reward_devices: list[int] = []
    reward_keys: list[str] = []  # the device_mapping keys that placed them
    domains = [f"rewards.{name}" for name in ctx.get("rewards") or {}]
    roles = [*ROLES, *domains]
    for role in roles:
        key = f"{role}.device_mapping"
        devices = parse_device_mapping(ctx.get(key), key)
        if devices is None:
            continue
        used.update(devices)
        world = ctx.get(f"{role}.world_size")
        per = ctx.get(f"{role}.num_gpus_per_worker", 1) if role == "actor_infer" else 1
        if world is not None and world * per != len(devices):
            raise ConfigError(
                f"{role}.world_size",
                f"{world} workers × {per} devices do not "
                f"match {len(devices)} devices in device_mapping",
                "remove world_size (ROLL derives it from device_mapping)",
            )
        if role.startswith("rewards.") or role == "reward":
            reward_devices += [d for d in devices if d not in reward_devices]
            reward_keys.append(key)
        else:
            ctx.write(f"resources.{role}", devices, key)
    if reward_devices:
        # an error about them names the file's own key when one role placed them
        source = reward_keys[0] if len(reward_keys) == 1 else "rewards.*.device_mapping"
        ctx.write("resources.reward", reward_devices, source)
    ctx.write("resources.backend", "ray" if len(used) > 1 else "local", "device_mapping")
    per_node = ctx.get("num_gpus_per_node")
    if per_node is None and used and max(used) >= 1:  # ROLL's default: 8 GPUs per node
        per_node = ROLL_GPUS_PER_NODE
        ctx.write("resources.devices_per_node", per_node, "num_gpus_per_node")
        ctx.remark(f"num_gpus_per_node: ROLL's default {per_node} applies (the file omits it)")
    if used and per_node:  # ROLL derives num_nodes from the ids, over the file's own
        nodes = -(-(max(used) + 1) // per_node)
        given = ctx.get("num_nodes")
        if given is not None and given != nodes:
            ctx.replace("resources.nnodes", nodes, "num_nodes")
            ctx.remark(
                f"num_nodes: {nodes}, not the file's {given}: ROLL sets it from the highest "
                f"device id ({max(used)}) and num_gpus_per_node ({per_node})"
            )
        elif given is None:
            ctx.write("resources.nnodes", nodes, "num_gpus_per_node")
    envs = dict(ctx.native_get("resources.ray.system_envs") or {})
    envs_key = ctx.out.source("resources.ray.system_envs")
    for role in (*ENV_SECTIONS, *domains):
        for k, v in (ctx.get(f"{role}.system_envs") or {}).items():
            envs_key = envs_key or f"{role}.system_envs"
            if k in envs and envs[k] != str(v):
                raise ConfigError(
                    f"{role}.system_envs.{k}",
                    f"'{v}' conflicts with '{envs[k]}'",
                    "temper sets one environment for every worker",
                )
            envs[k] = str(v)
    if envs:
        ctx.replace("resources.ray.system_envs", envs, envs_key)
        if "USE_MODELSCOPE" in envs:
            ctx.remark(
                "system_envs.USE_MODELSCOPE: passed to workers; temper loads models "
                "with transformers (local dir or Hugging Face id), not ModelScope"
            )
    for role in ROLES:
        cls = ctx.get(f"{role}.worker_cls")
        if cls is not None and cls not in ROLE_WORKERS[role]:
            raise ConfigError(
                f"{role}.worker_cls",
                f"'{cls}' is a custom ROLL worker class, which cannot run here",
                f"remove worker_cls (temper runs its own {role} role)",
            )


@derivation(
    "{role}.training_args.{arg}",
    "{role}.device_mapping",
    "{role}.strategy_args.strategy_name",
    "{role}.strategy_args.strategy_config",
    role=("actor_train", "critic"),
    arg=(
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "adam_beta1",
        "adam_beta2",
    ),
)
def mini_batch(ctx: Ctx) -> None:
    for role, dst in (("actor_train", "actor"), ("critic", "critic")):
        per = ctx.get(f"{role}.training_args.per_device_train_batch_size")
        ga = ctx.get(f"{role}.training_args.gradient_accumulation_steps")
        if per is None and ga is None:
            continue
        per, ga = per or 1, ga or 1
        devices = parse_device_mapping(ctx.get(f"{role}.device_mapping")) or [0]
        dp = len(devices)
        if ctx.get(f"{role}.strategy_args.strategy_name") == "megatron_train":
            cfg = ctx.get(f"{role}.strategy_args.strategy_config") or {}
            split = math.prod(int(cfg.get(k) or 1) for k in MODEL_PARALLEL_DEGREES)
            if dp % split:
                raise ConfigError(
                    f"{role}.device_mapping",
                    f"{dp} devices are not divisible by TP×PP×CP = {split}",
                    "use a device count that is a multiple of tensor × pipeline × context "
                    "parallel sizes",
                )
            dp //= split
        ctx.write(
            f"{dst}.mini_batch_size",
            per * ga * dp,
            f"{role}.training_args.gradient_accumulation_steps",
        )
        betas = [ctx.get(f"{role}.training_args.adam_beta{i}") for i in (1, 2)]
        if any(b is not None for b in betas):
            ctx.write(
                f"{dst}.optim.betas",
                [b if b is not None else d for b, d in zip(betas, (0.9, 0.999))],
                f"{role}.training_args.adam_beta1",
            )


QUERY_FILTERS = {"no_filter": "no_filter", "mean_filter": "mean_filter", "std_filter": "std_filter"}


@derivation(
    "rewards.*.query_filter_config.type",
    "rewards.*.query_filter_config.filter_args",
    "is_use_additional_prompts",
    "max_additional_running_prompts",
    "rollout_batch_size",
)
def dynamic_sampling(ctx: Ctx) -> None:
    """ROLL's query filters → ``algorithm.filter_groups`` (one rule for every domain), and
    ``is_use_additional_prompts`` → ``data.gen_batch_size``: ROLL keeps up to
    ``max_additional_running_prompts`` prompts running beside the batch to replace the
    groups its filter drops; here each generation round draws that many more. ROLL refills
    without a round limit (``max_num_gen_batches`` 0)."""
    rewards = ctx.get("rewards") or {}
    filters = {n: (spec or {}).get("query_filter_config") or {} for n, spec in rewards.items()}
    active = {n: f for n, f in filters.items() if f.get("type") not in (None, "no_filter")}
    for name, f in active.items():
        choice(QUERY_FILTERS, f"rewards.{name}.query_filter_config.type")(f["type"])
    if active:
        first = next(iter(active))
        key = f"rewards.{first}.query_filter_config.type"
        if len(active) < len(filters) or any(f != active[first] for f in active.values()):
            raise ConfigError(
                key,
                "the reward domains filter prompt groups by different rules; temper filters "
                "every group with one rule (algorithm.filter_groups)",
                "give every domain the same query_filter_config, or none",
            )
        f, args = active[first], active[first].get("filter_args") or {}
        ctx.write("algorithm.filter_groups.enable", True, key)
        if f["type"] == "mean_filter":  # drops mean <= threshold_down or >= threshold_up
            ctx.write("algorithm.filter_groups.std_threshold", -1.0, key)
            ctx.write("algorithm.filter_groups.mean_low", args.get("threshold_down", -1.0), key)
            if args.get("threshold_up") is not None:
                ctx.write("algorithm.filter_groups.mean_high", args["threshold_up"], key)
        else:  # std_filter: drops std <= std_threshold
            ctx.write("algorithm.filter_groups.std_threshold", args.get("std_threshold", -1.0), key)
    if ctx.get("is_use_additional_prompts"):
        if not active:
            ctx.inert(
                "extra prompts replace groups a query filter drops, and no domain sets one",
                "is_use_additional_prompts",
            )
            return
        extra = int(ctx.get("max_additional_running_prompts", 16) or 0)
        batch = int(ctx.get("rollout_batch_size", 128))
        ctx.write("data.gen_batch_size", batch + extra, "max_additional_running_prompts")


def definitions(ctx: Ctx, raw: RawConfig, defs: list[str]) -> None:
    for name in defs:
        value = raw.data[name]
        if name in raw.referenced:
            continue  # its value arrived through the keys that interpolate it
        if any(value is u or (isinstance(value, dict) and value == u) for u in ctx.used):
            continue  # referenced: its value arrived through the referencing key
        ctx.remark(
            f"{name}: accepted, no effect here: a definition from a defaults "
            "file that nothing references"
        )


#: ROLL's env-manager defaults for keys a file omits; not ``format_penalty``: ROLL's
#: default (0) adds no penalty of the manager's, the env's own (the tag's) still applies
ROLL_ENV_MANAGER = {"num_env_groups": 128, "group_size": 1}


@derivation(
    "rollout_batch_size",
    "val_batch_size",
    fields=("agentic.train_env_manager", "agentic.val_env_manager"),
)
def episodes(ctx: Ctx) -> None:
    """ROLL's batch counts trajectories; each env replays batch / envs episodes.

    Natively a step plays ``num_env_groups × group_size`` episodes, so the groups are
    multiplied by the replay count (each replay is a fresh seed, i.e. a new group).
    """
    for mgr, batch_key in (
        ("train_env_manager", "rollout_batch_size"),
        ("val_env_manager", "val_batch_size"),
    ):
        dst = ctx.native_get(f"agentic.{mgr}")
        batch = ctx.get(batch_key)
        if not isinstance(dst, dict) or batch is None or batch < 0:
            continue
        missing = {k: v for k, v in ROLL_ENV_MANAGER.items() if k not in dst}
        for k, v in missing.items():
            ctx.write(f"agentic.{mgr}.{k}", v, mgr)
        dst.update(missing)
        if missing:
            ctx.remark(
                f"{mgr}: ROLL defaults applied for keys the file omits: "
                + ", ".join(f"{k}={v!r}" for k, v in missing.items())
            )
        groups, size = dst["num_env_groups"], dst["group_size"]
        for key, value in (("num_env_groups", groups), ("group_size", size)):
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{mgr}.{key}", f"must be > 0, got {value!r}", "set it > 0")
        envs = groups * size
        if batch % envs:
            raise ConfigError(
                batch_key,
                f"{batch} trajectories are not a multiple of the {envs} environments of "
                f"{mgr} (env_groups {groups} × group_size {size})",
                f"set {batch_key} to a multiple of {envs}",
            )
        replays = batch // envs
        # each replay is a group of its own (credited to the keys that set them)
        groups_key = f"agentic.{mgr}.num_env_groups"
        ctx.replace(groups_key, groups * replays, ctx.out.source(groups_key, batch_key))
        if dst.get("n_groups") is not None:
            n_key = f"agentic.{mgr}.n_groups"
            ctx.replace(n_key, [n * replays for n in dst["n_groups"]], ctx.out.source(n_key))
        if replays > 1:
            ctx.remark(
                f"{mgr}: {envs} environments × {replays} episodes each = {batch_key} "
                f"{batch} -> agentic.{mgr}.num_env_groups = {groups * replays}"
            )


@derivation("async_generation_ratio")
def async_generation(ctx: Ctx) -> None:
    """``async_generation_ratio`` r → ``async_training.staleness`` r: the rollout runs r
    policy versions ahead of training. ROLL takes whole numbers only (its agentic scheduler
    queues ``range(r)`` batches ahead; its RLVR config asserts r ≥ 1)."""
    key = "async_generation_ratio"
    ratio = ctx.get(key)
    if not ratio:
        return
    if isinstance(ratio, bool) or not float(ratio).is_integer() or ratio < 1:
        raise ConfigError(
            key,
            f"{ratio!r} is not a whole number of batches ahead (ROLL's RLVR pipeline asserts "
            "a ratio ≥ 1 and its agentic scheduler queues range(ratio) batches)",
            "set async_generation_ratio to 1, 2, … (batches generated ahead), or 0",
        )
    k = int(ratio)
    ctx.write("async_training.staleness", k, key)
    ctx.remark(
        f"{key}: the rollout runs {k} polic{'y version' if k == 1 else 'y versions'} ahead of "
        f"training (async_training.staleness={k}): batch s is generated whole with the "
        f"weights after max(0, s - {k + 1}) updates. ROLL streams prompts to training as "
        "they finish and continues the ones in flight at a weight update with the new "
        "weights (partial rollout); here the batch's samples and their policy version depend "
        "on the step alone (the same staleness bound; a resume is exact)"
    )
