"""Checks that a typed config describes a run that can happen, before anything loads.

Each failure is a ``ConfigError`` naming the key, the reason and the fix. Names that
live in registries of higher layers (advantage estimators, losses, reward functions,
engines) are checked against ``names``, which the caller (CLI, pipelines) collects
from those registries — the config layer imports nothing of temper.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from temper.config.derive import derive, placement, total_devices, uses_critic, uses_reference
from temper.config.errors import ConfigError, unknown_name
from temper.config.schema import TemperConfig

# config key -> attribute path in TemperConfig, for registry-name checks
NAMED_KEYS = {
    "adv_estimator": "algorithm.adv_estimator",
    "policy_loss": "actor.policy_loss",
    "kl_penalty": "algorithm.kl_penalty",
    "kl_loss_type": "actor.kl_loss_type",
    "loss_agg_mode": "actor.loss_agg_mode",
    "critic_loss_agg_mode": "critic.loss_agg_mode",
    "reward_function": "reward.function",
}


def _get(cfg: object, path: str) -> object:
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


#: What each training strategy is, for messages about engines this build lacks.
ENGINE_NAMES = {
    "torch": "single-process torch",
    "fsdp2": "FSDP2",
    "deepspeed": "DeepSpeed",
    "megatron": "Megatron-Core",
}


def validate(cfg: TemperConfig, names: Mapping[str, Sequence[str]] | None = None) -> None:
    """Raise ConfigError for the first problem found."""
    if names:
        _check_engines(cfg, names)
    _check_ranges(cfg)
    _check_roles(cfg)
    _check_placement(cfg)
    _check_agentic(cfg, names or {})
    derive(cfg)  # batch arithmetic
    if names:
        _check_names(cfg, names)


def _check_engines(cfg: TemperConfig, names: Mapping[str, Sequence[str]]) -> None:
    """Every role's training engine is one this build registered (before any arithmetic
    that only makes sense for an engine that exists). The local backend runs every role
    in one process on the torch engine whatever the strategy (``roles.builder``), so only
    a multi-device (Ray) run needs the named engine."""
    valid = names.get("strategy")
    if not valid or cfg.resources.backend == "local":
        return
    roles = [("actor", cfg.actor.strategy)]
    if uses_critic(cfg):
        roles.append(("critic", cfg.critic.strategy))
    if uses_reference(cfg):
        roles.append(("reference", cfg.reference.strategy))
    if cfg.reward.model.enable:
        roles.append(("reward.model", cfg.reward.model.strategy))
    for role, strategy in roles:
        if strategy not in valid:
            what = ENGINE_NAMES.get(strategy, strategy)
            raise ConfigError(
                f"{role}.strategy",
                f"the '{strategy}' training engine ({what}) is not in this build of temper",
                f"set {role}.strategy to an engine this build has: {', '.join(valid)}",
            )


def _check_names(cfg: TemperConfig, names: Mapping[str, Sequence[str]]) -> None:
    for registry, path in NAMED_KEYS.items():
        valid = names.get(registry.removeprefix("critic_"))
        if not valid:
            continue
        value = _get(cfg, path)
        if value not in valid:
            raise unknown_name(path, str(value), valid)
    for name, route in cfg.reward.routes.items():
        valid = names.get("reward_function")
        if valid and route.function not in valid:
            raise unknown_name(f"reward.routes.{name}.function", route.function, valid)


def _positive(key: str, value: float, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        bound = "≥ 0" if allow_zero else "> 0"
        raise ConfigError(key, f"must be {bound}, got {value}", f"set {key} {bound}")


def _check_ranges(cfg: TemperConfig) -> None:
    _positive("data.train_batch_size", cfg.data.train_batch_size)
    _positive("data.max_prompt_length", cfg.data.max_prompt_length)
    _positive("rollout.n", cfg.rollout.n)
    _positive("rollout.response_length", cfg.rollout.response_length)
    _positive(
        "rollout.update_weights_bucket_megabytes", cfg.rollout.update_weights_bucket_megabytes
    )
    _positive("rollout.temperature", cfg.rollout.temperature, allow_zero=True)
    if not 0 < cfg.rollout.top_p <= 1:
        raise ConfigError("rollout.top_p", f"must be in (0, 1], got {cfg.rollout.top_p}", "")
    _positive("experiment.total_epochs", cfg.experiment.total_epochs)
    if cfg.experiment.max_steps is not None:
        _positive("experiment.max_steps", cfg.experiment.max_steps)
    _positive("actor.ppo_epochs", cfg.actor.ppo_epochs)
    _positive("actor.clip_ratio", cfg.actor.clip_ratio)
    _positive("actor.optim.lr", cfg.actor.optim.lr, allow_zero=True)
    _positive("model.lora.rank", cfg.model.lora.rank, allow_zero=True)
    if cfg.actor.clip_ratio_c is not None and cfg.actor.clip_ratio_c <= 1:
        raise ConfigError(
            "actor.clip_ratio_c",
            f"the dual-clip constant must be > 1, got {cfg.actor.clip_ratio_c}",
            "use e.g. 3.0, or null to turn dual clipping off",
        )
    if cfg.experiment.resume_mode == "resume_path" and not cfg.experiment.resume_from_path:
        raise ConfigError(
            "experiment.resume_from_path",
            "resume_mode is resume_path but no path is given",
            "set experiment.resume_from_path to a checkpoint directory",
        )
    seq = cfg.data.max_prompt_length + cfg.rollout.response_length
    if cfg.rollout.max_model_len is not None and cfg.rollout.max_model_len < seq:
        raise ConfigError(
            "rollout.max_model_len",
            f"{cfg.rollout.max_model_len} is shorter than max_prompt_length + response_length "
            f"= {seq}",
            f"raise rollout.max_model_len to ≥ {seq} or shorten prompts/responses",
        )
    _check_pixels(cfg.data.image_min_pixels, cfg.data.image_max_pixels)
    for key in ("actor", "critic"):
        engine = getattr(cfg, key)
        if engine.use_dynamic_bsz and engine.max_token_len_per_device < seq:
            raise ConfigError(
                f"{key}.max_token_len_per_device",
                f"a token budget of {engine.max_token_len_per_device} cannot hold one sample of "
                f"up to {seq} tokens (max_prompt_length + response_length)",
                f"raise it to ≥ {seq}",
            )


def _check_pixels(low: int | None, high: int | None) -> None:
    """Image resize limits (vision-language data): positive, and min ≤ max."""
    for key, value in (("data.image_min_pixels", low), ("data.image_max_pixels", high)):
        if value is not None:
            _positive(key, value)
    if low is not None and high is not None and low > high:
        raise ConfigError(
            "data.image_min_pixels",
            f"{low} is larger than data.image_max_pixels ({high})",
            "set image_min_pixels ≤ image_max_pixels",
        )


def _check_roles(cfg: TemperConfig) -> None:
    if not cfg.model.path:
        raise ConfigError(
            "model.path", "no policy model given", "set model.path to a model directory or hub id"
        )
    if cfg.pipeline == "rlvr" and not cfg.data.train_files and not cfg.experiment.val_only:
        raise ConfigError(
            "data.train_files", "no training data given", "set data.train_files to a file or list"
        )
    if cfg.critic.enable is False and cfg.algorithm.adv_estimator == "gae":
        raise ConfigError(
            "critic.enable",
            "adv_estimator gae needs a critic (value model) but the critic is disabled",
            "set critic.enable=true, or choose a critic-free estimator such as grpo",
        )
    kl_used = cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
    if kl_used and cfg.reference.enable is False:
        key = "actor.use_kl_loss" if cfg.actor.use_kl_loss else "algorithm.use_kl_in_reward"
        raise ConfigError(
            "reference.enable",
            f"{key} needs reference log-probs but the reference is disabled",
            f"set reference.enable=true or {key}=false",
        )
    if cfg.reward.function == "custom" and not cfg.reward.custom_function.path:
        raise ConfigError(
            "reward.custom_function.path",
            "reward.function is custom but no file is given",
            "set reward.custom_function.path to a Python file defining compute_score",
        )
    if uses_critic(cfg) and cfg.critic.ppo_epochs <= 0:
        raise ConfigError("critic.ppo_epochs", "must be positive", "set it to 1 or more")


def _check_placement(cfg: TemperConfig) -> None:
    n = total_devices(cfg)
    _positive("resources.nnodes", cfg.resources.nnodes)
    _positive("resources.devices_per_node", cfg.resources.devices_per_node)
    for role in ("actor_train", "actor_infer", "reference", "critic", "reward"):
        ids = getattr(cfg.resources, role)
        if ids is None:
            continue
        key = f"resources.{role}"
        if not ids:
            raise ConfigError(key, "an empty device list", "list at least one device id")
        if len(set(ids)) != len(ids):
            raise ConfigError(key, f"device ids repeat: {ids}", "list each device once")
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise ConfigError(
                key,
                f"device ids {bad} are outside the {n} devices of resources "
                f"(nnodes × devices_per_node)",
                f"use ids in 0..{n - 1} or raise resources.devices_per_node",
            )
        if sorted(ids) != list(range(min(ids), max(ids) + 1)):
            raise ConfigError(
                key,
                f"device ids {ids} are not contiguous",
                "use a contiguous range, e.g. list(range(0, 4))",
            )
    if cfg.resources.backend == "ray" and cfg.model.lora.rank > 0 and uses_reference(cfg):
        raise ConfigError(
            "model.lora.rank",
            "on the ray backend a LoRA reference (the actor's weights with adapters off) "
            "would live in another worker group; this build does not share it across groups",
            "use resources.backend=local, full fine-tuning (model.lora.rank=0), or drop the "
            "KL terms (actor.use_kl_loss=false, algorithm.use_kl_in_reward=false)",
        )
    if cfg.resources.backend == "local":
        for role, ids in placement(cfg).items():
            if len(ids) > 1:
                raise ConfigError(
                    "resources.backend",
                    f"the local backend runs every role in this one process, but {role} is "
                    f"placed on {len(ids)} devices",
                    "set resources.backend=ray for multi-device placement",
                )
    if cfg.resources.backend == "ray" and cfg.resources.devices_per_infer_worker > 1:
        raise ConfigError(
            "resources.devices_per_infer_worker",
            f"{cfg.resources.devices_per_infer_worker} devices per rollout engine "
            "(tensor-parallel rollout) is not supported on the ray backend: each actor_infer "
            "rank runs one whole engine on one device",
            "set it to 1 (ROLL actor_infer.num_gpus_per_worker: 1)",
        )
    infer = cfg.resources.actor_infer
    per = cfg.resources.devices_per_infer_worker
    if infer is not None and len(infer) % per:
        raise ConfigError(
            "resources.devices_per_infer_worker",
            f"{len(infer)} rollout devices cannot be split into engines of {per}",
            "use a divisor of the number of actor_infer devices",
        )


def _check_agentic(cfg: TemperConfig, names: Mapping[str, Sequence[str]]) -> None:
    if cfg.pipeline != "agentic":
        return
    env_types = names.get("env_type")
    for which in ("train_env_manager", "val_env_manager"):
        mgr = getattr(cfg.agentic, which)
        key = f"agentic.{which}"
        _positive(f"{key}.group_size", mgr.group_size)
        _positive(f"{key}.num_env_groups", mgr.num_env_groups)
        for tag in mgr.tags:
            if tag not in cfg.agentic.custom_envs:
                known = ", ".join(sorted(cfg.agentic.custom_envs)) or "none defined"
                raise ConfigError(
                    f"{key}.tags",
                    f"environment tag '{tag}' is not defined in agentic.custom_envs ({known})",
                    "define it under agentic.custom_envs or fix the tag",
                )
            env_type = cfg.agentic.custom_envs[tag].env_type
            if env_types and env_type not in env_types:
                raise ConfigError(
                    f"agentic.custom_envs.{tag}.env_type",
                    f"the environment '{env_type}' (tag {tag}) is not in this build of temper",
                    f"use an environment it has ({', '.join(env_types)}), or register one "
                    "with temper.envs.registry.register_env",
                )
        if mgr.n_groups is not None:
            if len(mgr.n_groups) != len(mgr.tags):
                raise ConfigError(
                    f"{key}.n_groups",
                    f"{len(mgr.n_groups)} group counts for {len(mgr.tags)} tags",
                    "give one count per tag",
                )
            if sum(mgr.n_groups) != mgr.num_env_groups:
                raise ConfigError(
                    f"{key}.n_groups",
                    f"group counts sum to {sum(mgr.n_groups)}, not num_env_groups "
                    f"({mgr.num_env_groups})",
                    "make them add up",
                )
