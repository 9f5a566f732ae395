"""Checks of one section at a time and of the batch arithmetic, before anything loads.

Each failure is a ``ConfigError`` naming the key, the reason and the fix. Values that are
the names of a registry of a higher layer (advantage estimators, losses, engines,
pipelines, …) are checked against the :class:`~temper.config.catalog.Catalog`, which the
caller builds from those registries — the config layer imports nothing of temper. What a
pipeline cannot honour in combination is its own ``check`` (``Catalog.check``); what this
machine and its files cannot do is the pre-flight's (``temper.pipelines.preflight``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from typing import Any

from temper.config.catalog import ANCHOR_STATES, REWARD_COMPONENTS, SUM_PI_SQUARED, VALUES, Catalog
from temper.config.derive import (
    Derived,
    derive,
    placement,
    total_devices,
    uses_critic,
)
from temper.config.errors import ConfigError, unknown_name
from temper.config.plan import NO_POLICY, NO_TRAINING
from temper.config.schema import OptimConfig, TemperConfig


def validate(cfg: TemperConfig, catalog: Catalog) -> Derived:
    """Raise ConfigError for the first problem found; return the run's plan."""
    check_names(cfg, catalog)
    check_finite(cfg)
    _check_ranges(cfg)
    _check_roles(cfg, catalog)
    _check_reward_components(cfg, catalog)
    _check_step_advantages(cfg, catalog)
    _check_reward_workers(cfg)
    _check_placement(cfg, catalog)
    return derive(cfg, catalog)  # batch arithmetic


def check_names(cfg: TemperConfig, catalog: Catalog) -> None:
    """Every field marked ``registry=...`` in the schema holds a name of that registry
    (sections inside mappings, such as ``reward.routes.<name>``, included)."""

    def walk(section: Any, prefix: str) -> None:
        for f in dataclasses.fields(section):
            value = getattr(section, f.name)
            key = f"{prefix}{f.name}"
            registry = f.metadata.get("registry")
            if registry is not None:
                off = f.metadata.get("off")
                valid = [*catalog.names(registry), *([off] if off else [])]
                for item in value if isinstance(value, list) else [value]:
                    if item not in valid:
                        raise unknown_name(key, str(item), valid)
            elif dataclasses.is_dataclass(value):
                walk(value, f"{key}.")
            elif isinstance(value, dict):
                for name, item in value.items():
                    if dataclasses.is_dataclass(item):
                        walk(item, f"{key}.{name}.")
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    if dataclasses.is_dataclass(item):
                        walk(item, f"{key}[{i}].")

    walk(cfg, "")


@functools.cache
def _float_fields(cls: Any) -> frozenset[str]:
    """The fields of dataclass ``cls`` typed to hold floats (``float``, ``float | None``,
    ``list[float]``, ``dict[str, float]``); ``Any`` (free keyword arguments) is not one."""
    out = set()
    for name, tp in typing.get_type_hints(cls).items():
        args = {tp, *typing.get_args(tp)}
        if float in args or any(float in typing.get_args(a) for a in args):
            out.add(name)
    return frozenset(out)


def check_finite(cfg: Any, prefix: str = "") -> None:
    """Every float the schema types (learning rates, betas, loss coefficients, clip
    ranges, timeouts, scores, weights, …) is a finite number: no key gives NaN or an
    infinity a meaning (each has its own off switch), and one in an optimizer or a loss
    turns the first step's weights or rewards into NaN."""
    cls: Any = type(cfg)  # functools.cache wants a hashable; a class is one
    floats = _float_fields(cls)
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            check_finite(value, f"{key}.")
        elif isinstance(value, dict):
            for name, item in value.items():
                if dataclasses.is_dataclass(item):
                    check_finite(item, f"{key}.{name}.")
                elif f.name in floats:
                    _finite(f"{key}.{name}", item)
        elif isinstance(value, list) and f.name in floats:
            for i, item in enumerate(value):
                _finite(f"{key}[{i}]", item)
        elif f.name in floats:
            _finite(key, value)


def _finite(key: str, value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(
            key, f"must be a finite number, got {value}", f"set {key} to a finite number"
        )


def _check_optim(key: str, optim: OptimConfig) -> None:
    """What AdamW refuses when it is built, refused at load instead."""
    _positive(f"{key}.lr", optim.lr, allow_zero=True)
    _positive(f"{key}.eps", optim.eps, allow_zero=True)
    _positive(f"{key}.weight_decay", optim.weight_decay, allow_zero=True)
    betas = optim.betas
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ConfigError(
            f"{key}.betas",
            f"Adam takes two betas (the decay rates of the gradient's first and second "
            f"moments), each in [0, 1); got {betas}",
            f"set {key}.betas to two numbers in [0, 1), e.g. [0.9, 0.999]",
        )
    if optim.warmup_from_one and not optim.zero_indexed_step:
        raise ConfigError(
            f"{key}.warmup_from_one",
            "zero_indexed_step: false already counts every step from 1; with both, the "
            "warmup would count the update being taken twice",
            f"set {key}.zero_indexed_step: true, or warmup_from_one: false",
        )


#: numpy's legacy seeding takes 0 ≤ seed < 2**32 (torch and random take any int).
MAX_SEED = 2**32 - 1


def _positive(key: str, value: float, allow_zero: bool = False) -> None:
    if value < 0 or (value == 0 and not allow_zero):
        bound = "≥ 0" if allow_zero else "> 0"
        raise ConfigError(key, f"must be {bound}, got {value}", f"set {key} {bound}")


def _check_ranges(cfg: TemperConfig) -> None:
    _positive("data.train_batch_size", cfg.data.train_batch_size)
    _positive("async_training.staleness", cfg.async_training.staleness, allow_zero=True)
    _positive("async_training.wait_timeout", cfg.async_training.wait_timeout)
    _positive("async_training.stream_chunk", cfg.async_training.stream_chunk, allow_zero=True)
    _positive(
        "async_training.partial_rollout_segment",
        cfg.async_training.partial_rollout_segment,
        allow_zero=True,
    )
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
    _check_optim("actor.optim", cfg.actor.optim)
    _check_optim("critic.optim", cfg.critic.optim)
    if not 0 <= cfg.experiment.seed <= MAX_SEED:
        raise ConfigError(
            "experiment.seed",
            f"{cfg.experiment.seed} is not a seed numpy takes (0 to 2**32 - 1)",
            "set experiment.seed to a number in that range, e.g. 42",
        )
    _positive("model.lora.rank", cfg.model.lora.rank, allow_zero=True)
    if cfg.model.lora.adapter_path is not None and not cfg.model.lora.adapter_path.strip():
        raise ConfigError(  # verl hands "" to peft, which fails; an unset variable's value
            "model.lora.adapter_path",
            "it is empty (no adapter directory given)",
            "set it to a saved peft adapter's directory, or remove it to start fresh adapters",
        )
    _positive("actor.rollout_is_threshold", cfg.actor.rollout_is_threshold)
    low, high = cfg.actor.rollout_is_threshold_low, cfg.actor.rollout_is_threshold
    if low is not None and not 0 < low <= high:
        raise ConfigError(
            "actor.rollout_is_threshold_low",
            f"the IcePop band [{low}, {high}] needs 0 < low ≤ actor.rollout_is_threshold",
            "set a lower bound in (0, rollout_is_threshold], e.g. 0.5, or null to truncate",
        )
    for i, f in enumerate(cfg.actor.rollout_rs):
        key = f"actor.rollout_rs[{i}]"
        if f.low is None and f.high is None:
            raise ConfigError(
                key, "a filter without bounds rejects nothing", "set low, high or both"
            )
        if f.low is not None and f.high is not None and f.low > f.high:
            raise ConfigError(
                f"{key}.low", f"{f.low} > high {f.high} rejects every token", "set low ≤ high"
            )
    if cfg.actor.clip_ratio_c is not None and cfg.actor.clip_ratio_c <= 1:
        raise ConfigError(
            "actor.clip_ratio_c",
            f"the dual-clip constant must be > 1, got {cfg.actor.clip_ratio_c}",
            "use e.g. 3.0, or null to turn dual clipping off",
        )
    minutes = cfg.experiment.save_every_minutes
    if minutes is not None and not minutes >= 0:  # NaN too: it would never save
        raise ConfigError(
            "experiment.save_every_minutes",
            f"must be ≥ 0 minutes (0 or null: off), got {minutes}",
            "set experiment.save_every_minutes to e.g. 10, or 0 to save per save_freq only",
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
    _check_pixels("image", cfg.data.image_min_pixels, cfg.data.image_max_pixels)
    _check_pixels("video", cfg.data.video_min_pixels, cfg.data.video_max_pixels)
    for key, value in (
        ("data.video_total_pixels", cfg.data.video_total_pixels),
        ("data.video_fps", cfg.data.video_fps),
    ):
        if value is not None:
            _positive(key, value)
    if cfg.data.video_max_frames < 2:
        raise ConfigError(
            "data.video_max_frames",
            f"{cfg.data.video_max_frames} is below 2, the frames of one temporal patch",
            "set data.video_max_frames ≥ 2",
        )


def _check_pixels(kind: str, low: int | None, high: int | None) -> None:
    """Image or video-frame resize limits (vision-language data): positive, min ≤ max."""
    lkey, hkey = f"data.{kind}_min_pixels", f"data.{kind}_max_pixels"
    for key, value in ((lkey, low), (hkey, high)):
        if value is not None:
            _positive(key, value)
    if low is not None and high is not None and low > high:
        raise ConfigError(
            lkey,
            f"{low} is larger than {hkey} ({high})",
            f"set {kind}_min_pixels ≤ {kind}_max_pixels",
        )


def _check_roles(cfg: TemperConfig, catalog: Catalog) -> None:
    if not cfg.model.path and NO_POLICY not in catalog.pipeline_uses(cfg):
        raise ConfigError(
            "model.path", "no policy model given", "set model.path to a model directory or hub id"
        )
    estimator = cfg.algorithm.adv_estimator
    if cfg.critic.enable is False and VALUES in catalog.needs("adv_estimator", estimator):
        raise ConfigError(
            "critic.enable",
            f"adv_estimator {estimator} needs a critic (value model) but the critic is disabled",
            "set critic.enable=true, or choose a critic-free estimator such as grpo",
        )
    reads_spq = SUM_PI_SQUARED in catalog.needs("adv_estimator", estimator)
    if cfg.actor.calculate_sum_pi_squared is False and reads_spq:
        raise ConfigError(
            "actor.calculate_sum_pi_squared",
            f"adv_estimator {estimator} needs Σπ² per token from the actor but it is off",
            "set actor.calculate_sum_pi_squared=true (or leave it unset)",
        )
    if reads_spq and not cfg.actor.recompute_old_log_prob:
        raise ConfigError(
            "actor.recompute_old_log_prob",
            f"adv_estimator {estimator} needs Σπ² from the actor's old-log-prob pass, which "
            "false skips (the old log-probs are then the rollout engine's)",
            "set actor.recompute_old_log_prob=true, or choose another estimator (grpo, rloo)",
        )
    if cfg.actor.calculate_sum_pi_squared and not reads_spq:
        raise ConfigError(
            "actor.calculate_sum_pi_squared",
            f"only the optimal-token-baseline estimators read Σπ²; adv_estimator {estimator} "
            "does not",
            "set it to false, or algorithm.adv_estimator=optimal_token_baseline",
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
    if cfg.reward.custom_function.path and cfg.reward.function not in ("custom", "auto"):
        raise ConfigError(  # the file would be read by nothing
            "reward.custom_function.path",
            f"is set but reward.function is '{cfg.reward.function}'",
            "set reward.function=custom (or auto) to use the file, or unset the path",
        )
    if uses_critic(cfg, catalog) and cfg.critic.ppo_epochs <= 0:
        raise ConfigError("critic.ppo_epochs", "must be positive", "set it to 1 or more")


def _check_reward_workers(cfg: TemperConfig) -> None:
    """Every reward call has a deadline, or the user said it has none.

    A worker process (``num_workers`` ≥ 1) is killed at ``timeout_s``; a reward run in
    the trainer's own process (``num_workers: 0``, for a debugger or prints) cannot be
    stopped — a signal there can only interrupt Python between instructions, and
    math-verify's own SIGALRM timeouts would clash with one. So in-process rewards are
    refused unless ``timeout_s: null`` says no deadline is wanted, and a null is refused
    for workers, which always keep one: no hang without a deadline, none by surprise.
    """
    workers, timeout = cfg.reward.num_workers, cfg.reward.timeout_s
    if workers < 0:
        raise ConfigError(
            "reward.num_workers",
            f"must be ≥ 0, got {workers}",
            "set reward.num_workers to the reward processes to run, e.g. 2",
        )
    if timeout is not None and not timeout > 0:
        raise ConfigError(
            "reward.timeout_s",
            f"must be > 0 seconds, got {timeout}",
            "set reward.timeout_s to the seconds a sample's reward may take, e.g. 10",
        )
    if workers == 0 and timeout is not None:
        raise ConfigError(
            "reward.num_workers",
            f"0 runs reward functions in the trainer's process, where nothing can stop a call "
            f"at its deadline (reward.timeout_s, {timeout:g} s): a reward that hangs would "
            "hang the run",
            "set reward.num_workers=1 or more to keep the deadline; or, in a native config, "
            "reward.timeout_s=null as well, to run rewards in this process without one "
            "(debugging)",
        )
    if workers > 0 and timeout is None:
        raise ConfigError(
            "reward.timeout_s",
            "null (no deadline) is for rewards run in the trainer's process "
            "(reward.num_workers=0, debugging); in workers a reward that hangs is stopped "
            "at its deadline",
            "set reward.timeout_s to the seconds a sample's reward may take, e.g. 10",
        )


def _check_reward_components(cfg: TemperConfig, catalog: Catalog) -> None:
    """``gdpo_reward_keys`` name the components an estimator that reads them combines;
    set for one that does not, they would be read by nothing."""
    algo = cfg.algorithm
    keys, weights = algo.gdpo_reward_keys, algo.gdpo_reward_weights
    reads = REWARD_COMPONENTS in catalog.needs("adv_estimator", algo.adv_estimator)
    if reads and not keys:
        raise ConfigError(
            "algorithm.gdpo_reward_keys",
            f"adv_estimator {algo.adv_estimator} normalizes each reward component in its "
            "group, and no component is named",
            "list the fields your reward function returns beside 'score', e.g. "
            "[accuracy_reward, format_reward]",
        )
    if keys and not reads:
        raise ConfigError(
            "algorithm.gdpo_reward_keys",
            f"adv_estimator {algo.adv_estimator} reads the summed score, not reward components",
            "remove it, or choose an estimator of reward components (gdpo)",
        )
    if len(set(keys)) != len(keys):
        raise ConfigError(
            "algorithm.gdpo_reward_keys", f"components repeat: {keys}", "name each once"
        )
    if weights is not None and len(weights) != len(keys):
        raise ConfigError(
            "algorithm.gdpo_reward_weights",
            f"{len(weights)} weights for {len(keys)} reward components "
            "(algorithm.gdpo_reward_keys)",
            "give one weight per component, or remove it (all 1)",
        )


#: The GiGPO keys and their defaults: read only by an estimator of anchor states.
GIGPO_KEYS = {"gigpo_step_gamma": 0.95, "gigpo_episode_weight": 1.0, "gigpo_step_weight": 1.0}


def _check_step_advantages(cfg: TemperConfig, catalog: Catalog) -> None:
    """The ``gigpo_*`` keys weigh and discount an estimator of step samples grouped by
    anchor state; set for another estimator they would be read by nothing."""
    algo = cfg.algorithm
    reads = ANCHOR_STATES in catalog.needs("adv_estimator", algo.adv_estimator)
    for key, default in GIGPO_KEYS.items():
        if not reads and getattr(algo, key) != default:
            raise ConfigError(
                f"algorithm.{key}",
                f"adv_estimator {algo.adv_estimator} has no step-level advantage to weigh "
                "or discount",
                "remove it, or set algorithm.adv_estimator: gigpo",
            )
    if not 0.0 <= algo.gigpo_step_gamma <= 1.0:
        raise ConfigError(
            "algorithm.gigpo_step_gamma",
            f"{algo.gigpo_step_gamma} is not a discount in [0, 1]",
            "set it in [0, 1] (ROLL's default is 0.95)",
        )


def _check_placement(cfg: TemperConfig, catalog: Catalog) -> None:
    if NO_TRAINING in catalog.pipeline_uses(cfg):
        return  # generate, eval: no roles are placed (their checks refuse resources.*)
    n = total_devices(cfg)
    _positive("resources.nnodes", cfg.resources.nnodes)
    _positive("resources.devices_per_node", cfg.resources.devices_per_node)
    # every Ray wait ends at rpc_timeout: 0 or less would fail each at once
    _positive("resources.ray.rpc_timeout", cfg.resources.ray.rpc_timeout)
    if cfg.resources.ray.num_cpus is not None:
        _positive("resources.ray.num_cpus", cfg.resources.ray.num_cpus)
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
    if cfg.resources.backend == "local":
        for role, ids in placement(cfg).items():
            if len(ids) > 1:
                raise ConfigError(
                    "resources.backend",
                    f"the local backend runs every role in this one process, but {role} is "
                    f"placed on {len(ids)} devices",
                    "set resources.backend=ray for multi-device placement",
                )
    per, tp = cfg.resources.devices_per_infer_worker, cfg.rollout.tensor_parallel_size
    if per > 1 and per != tp:  # an engine spans exactly its tensor-parallel ranks
        raise ConfigError(
            "resources.devices_per_infer_worker",
            f"{per} devices per rollout engine, but rollout.tensor_parallel_size is {tp}: an "
            "engine spans its tensor-parallel ranks, one device each",
            f"set it to {tp} (or 1), or rollout.tensor_parallel_size to {per}",
        )
    infer = cfg.resources.actor_infer
    per = cfg.resources.devices_per_infer_worker
    if infer is not None and len(infer) % per:
        raise ConfigError(
            "resources.devices_per_infer_worker",
            f"{len(infer)} rollout devices cannot be split into engines of {per}",
            "use a divisor of the number of actor_infer devices",
        )
