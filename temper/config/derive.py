"""Values every run derives from its config, and the batch arithmetic behind them.

``derive(cfg, catalog)`` computes them once, as part of validation (raising
``ConfigError`` on impossible arithmetic); ``explain(cfg, derived)`` gives the rows
``temper check`` prints: name, value, formula.

The arithmetic (samples = responses, or episodes):

    samples_per_step   = the pipeline's step shape: data.train_batch_size × rollout.n
                         (rlvr), num_env_groups × group_size (agentic)
    dp(role)           = devices(role) / (TP × PP × CP)     (megatron)
                       = devices(role) / sp                   (fsdp2, deepspeed)
                       = 1                                    (torch: one process)

``ulysses_sequence_parallel_size`` = sp > 1 on fsdp2/deepspeed: groups of sp ranks split
every sequence's columns (Ulysses attention, :mod:`temper.training.ulysses`), so a group
is one data-parallel rank: dp = devices / sp. ``micro_batch_size_per_device`` counts a
group's samples (verl's and ROLL's meaning) and a token budget a device's share of them
(the group's budget is sp times it, as verl multiplies it).
    mini_batch_size    = actor.mini_batch_size or samples_per_step
    per_rank_mini      = mini_batch_size / dp
    grad_accum         = per_rank_mini / micro_batch_size_per_device
    optimizer steps    = ppo_epochs × samples_per_step / mini_batch_size   (per RL step)

This matches document 001 (DeepSpeed: per_device × accumulation × world; Megatron:
the same divided by TP × PP × CP) and documents 002/004 (verl ppo_mini_batch_size ×
n split into micro-batches of ppo_micro_batch_size_per_gpu).
"""

from __future__ import annotations

from temper.config.catalog import (
    CRITIC,
    MEGATRON_PARALLEL,
    ONE_PROCESS,
    REFERENCE,
    VALUES,
    Catalog,
)
from temper.config.errors import BOUND, Bound, ConfigError, nearest_divisor
from temper.config.plan import (
    NO_TRAINING,
    REFERENCE_ALWAYS,
    Derived,
    StepShape,
    TrainArithmetic,
)
from temper.config.schema import TemperConfig, TrainEngineConfig

__all__ = ["Derived", "StepShape", "TrainArithmetic", "derive", "explain", "prompt_groups"]

ROLES = ("actor_train", "actor_infer", "reference", "critic", "reward")


def total_devices(cfg: TemperConfig) -> int:
    return cfg.resources.nnodes * cfg.resources.devices_per_node


def placement(cfg: TemperConfig) -> dict[str, list[int]]:
    """Device ids per role; unset roles share the actor's devices (colocated)."""
    res = cfg.resources
    everything = list(range(total_devices(cfg)))
    train = list(res.actor_train) if res.actor_train is not None else everything
    out = {"actor_train": train}
    for role in ROLES[1:]:
        ids = getattr(res, role)
        out[role] = list(ids) if ids is not None else list(train)
    return out


def uses_critic(cfg: TemperConfig, catalog: Catalog) -> bool:
    """``critic.enable``, or (unset) whether the advantage estimator needs values — for
    a pipeline whose step can use a critic at all."""
    if CRITIC not in catalog.pipeline_uses(cfg):
        return False
    if cfg.critic.enable is not None:
        return cfg.critic.enable
    return VALUES in catalog.needs("adv_estimator", cfg.algorithm.adv_estimator)


def uses_reference(cfg: TemperConfig, catalog: Catalog) -> bool:
    """``reference.enable``, or (unset) whether a KL term needs one — for a pipeline
    whose step can use a reference at all."""
    uses = catalog.pipeline_uses(cfg)
    if REFERENCE not in uses:
        return False
    if REFERENCE_ALWAYS in uses:  # the pipeline's check refuses reference.enable: false
        return True
    if cfg.reference.enable is not None:
        return cfg.reference.enable
    return cfg.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward


def _dp_size(engine: TrainEngineConfig, devices: int, key: str, catalog: Catalog) -> int:
    """Data-parallel ranks of a role: its devices over the devices one model replica
    spans, as the engine's registry entry declares (:mod:`temper.config.catalog`)."""
    needs = catalog.needs("strategy", engine.strategy)
    if ONE_PROCESS in needs:
        if devices > 1:
            raise ConfigError(
                f"{key}.strategy",
                f"the {engine.strategy} engine trains in one process but {devices} devices "
                "are placed",
                f"set {key}.strategy=fsdp2 (or deepspeed/megatron), or place one device",
            )
        return 1
    if MEGATRON_PARALLEL in needs:
        model_parallel = engine.megatron.model_parallel_size
        if devices % model_parallel:
            raise ConfigError(  # the leaf key, so a dialect names the user's own
                f"{key}.megatron.tensor_model_parallel_size",
                f"{devices} devices are not divisible by TP×PP×CP = {model_parallel} (tensor "
                "× pipeline × context parallel sizes)",
                "choose parallel sizes whose product divides the role's device count",
            )
        experts = engine.megatron.expert_model_parallel_span
        if devices % experts:  # Megatron-Core's expert groups cut the devices again
            raise ConfigError(
                f"{key}.megatron.expert_model_parallel_size",
                f"{devices} devices are not divisible by ETP×EP×PP = {experts} (expert "
                "tensor × expert × pipeline parallel sizes)",
                "choose an expert-parallel size (and expert_tensor_parallel_size) whose "
                "product with the pipeline size divides the role's device count",
            )
        return devices // model_parallel
    sp = engine.ulysses_sequence_parallel_size
    if devices % sp:  # verl's and ROLL's own rule, kept so their files mean the same here
        raise ConfigError(
            f"{key}.ulysses_sequence_parallel_size",
            f"{devices} devices are not divisible by the sequence-parallel size {sp}",
            "choose a size that divides the role's device count",
        )
    return devices // sp


def train_arithmetic(
    engine: TrainEngineConfig,
    key: str,
    role: str,
    devices: int,
    samples: int,
    catalog: Catalog,
    at_least: bool = False,
) -> TrainArithmetic:
    """Mini/micro-batch arithmetic of one trained role; errors name the key and fix.

    A mini-batch fix carries its numbers (:class:`~temper.config.errors.Bound`, in
    samples): a dialect that counts the key otherwise restates them in its units."""
    dp = _dp_size(engine, devices, key, catalog)
    mini = engine.mini_batch_size if engine.mini_batch_size is not None else samples
    if mini <= 0:
        raise ConfigError(f"{key}.mini_batch_size", "must be positive", "set a positive size")
    if mini > samples and not at_least:
        raise ConfigError(
            f"{key}.mini_batch_size",
            f"{mini} samples per mini-batch exceed the {samples} samples of a step "
            f"(train_batch_size × n)",
            f"set {key}.mini_batch_size {BOUND} or raise data.train_batch_size",
            bound=Bound("at_most", samples, mini),
        )
    if samples % mini and not at_least:
        raise ConfigError(
            f"{key}.mini_batch_size",
            f"{samples} samples per step (train_batch_size × n) are not divisible by {mini}",
            f"set {key}.mini_batch_size to {BOUND}",
            bound=Bound("divisor_of", samples, mini),
        )
    if mini % dp:
        raise ConfigError(
            f"{key}.mini_batch_size",
            f"{mini} samples cannot be split evenly over {dp} data-parallel ranks",
            f"set {key}.mini_batch_size to {BOUND}",
            bound=Bound("multiple_of", dp, mini),
        )
    per_rank = mini // dp
    micro: int | None = None
    accum: int | None = None
    if not engine.use_dynamic_bsz:
        micro = engine.micro_batch_size_per_device
        if micro <= 0:
            raise ConfigError(
                f"{key}.micro_batch_size_per_device", "must be positive", "set it to 1 or more"
            )
        if micro > per_rank:
            # one micro-batch holds the rank's whole share (as verl's split of a rank's
            # mini-batch into micro-batches of this size gives it)
            micro = per_rank
        elif per_rank % micro:
            raise ConfigError(
                f"{key}.micro_batch_size_per_device",
                f"the {per_rank} samples each rank gets per mini-batch are not divisible "
                f"by {micro}",
                f"use a divisor of {per_rank}, e.g. {nearest_divisor(per_rank, micro)}",
            )
        accum = per_rank // micro
    steps = engine.ppo_epochs * max(samples // mini, 1 if at_least else 0)
    return TrainArithmetic(role, devices, dp, mini, per_rank, micro, accum, steps)


def prompt_groups(cfg: TemperConfig) -> StepShape:
    """The step shape of a prompt-driven pipeline: ``train_batch_size`` prompts, ``n``
    responses each."""
    prompts = cfg.data.train_batch_size
    return StepShape(
        groups=prompts,
        samples=prompts * cfg.rollout.n,
        rows=(
            ("prompts per step", str(prompts), "data.train_batch_size"),
            (
                "samples per step",
                str(prompts * cfg.rollout.n),
                f"prompts per step × rollout.n ({cfg.rollout.n})",
            ),
        ),
    )


def derive(cfg: TemperConfig, catalog: Catalog) -> Derived:
    """The run's plan; raises ConfigError on impossible arithmetic. The step's shape is
    the pipeline's, an engine's way of splitting devices its registry entry's."""
    shape = catalog.step_shape(cfg)
    samples = shape.samples
    place = placement(cfg)
    critic_on = uses_critic(cfg, catalog)
    # generate, eval: no actor is placed (their checks refuse resources.*), so none splits
    trains = NO_TRAINING not in catalog.pipeline_uses(cfg)
    devices = len(place["actor_train"]) if trains else 1
    actor = train_arithmetic(
        cfg.actor, "actor", "actor_train", devices, samples, catalog, shape.at_least
    )
    critic = None
    if critic_on:
        critic = train_arithmetic(
            cfg.critic, "critic", "critic", len(place["critic"]), samples, catalog, shape.at_least
        )
    return Derived(
        shape=shape,
        max_steps=cfg.experiment.max_steps,
        total_devices=total_devices(cfg),
        placement=place,
        use_critic=critic_on,
        use_reference=uses_reference(cfg, catalog),
        actor=actor,
        critic=critic,
        uses=catalog.pipeline_uses(cfg),
    )


#: Policy losses that draw random numbers while the trainer computes them.
RANDOM_LOSSES = ("clip_cov",)


def _streaming_row(cfg: TemperConfig, b: int) -> tuple[str, str, str]:
    """The "schedule" row of ``async_training.mode: streaming`` (``b`` groups a step)."""
    at = cfg.async_training
    chunk = at.stream_chunk if at.stream_chunk > 0 else max(1, b // 4)
    bound = (
        "a chunk starts only when each of its groups will train at most "
        f"{at.staleness} versions after its weights (max_off_policy_strategy wait: none dropped)"
        if at.max_off_policy_strategy == "wait"
        else f"up to {(at.staleness + 1) * b} groups queued; a group more than "
        f"{at.staleness} versions old at its turn is dropped (max_off_policy_strategy drop)"
    )
    return (
        "schedule",
        f"streaming, at most {at.staleness} version{'s' if at.staleness > 1 else ''} behind",
        f"{b} groups a step (a prompt's responses, an env group's episodes), generated "
        f"{chunk} at a time with the newest pushed weights and handed to training as they "
        f"finish; {bound}; timing decides "
        "what is generated with which version, so a resume regenerates the groups not yet "
        "trained (none lost or repeated) rather than repeating the run bit for bit",
    )


def _shared_rng_caveat(cfg: TemperConfig) -> str:
    """Where the rollout runs ahead on a thread of this process with the Hugging Face
    engine (which samples from torch's global generator), a trainer that draws random
    numbers too (LoRA dropout, a random policy loss) interleaves with it by timing."""
    local_hf = cfg.resources.backend == "local" and cfg.rollout.engine in ("hf", "auto")
    draws = (cfg.model.lora.rank > 0 and cfg.model.lora.dropout > 0) or (
        cfg.actor.policy_loss in RANDOM_LOSSES
    )
    if not (local_hf and draws):
        return ""
    return (
        "; but this trainer draws random numbers (LoRA dropout or a random policy loss) "
        "from the generator the hf rollout samples with on its thread, so runs are not "
        "bit-reproducible: use rollout.engine vllm or resources.backend ray for that"
    )


def explain(cfg: TemperConfig, d: Derived) -> list[tuple[str, str, str]]:
    """Rows (name, value, how it is derived) for ``temper check``."""
    rows: list[tuple[str, str, str]] = list(d.shape.rows)
    if NO_TRAINING in d.uses:  # generate, eval: what a call takes is the whole story
        return rows
    steps = str(d.max_steps) if d.max_steps is not None else "from data"
    how = (
        "experiment.max_steps"
        if d.max_steps is not None
        else f"experiment.total_epochs ({cfg.experiment.total_epochs}) × ⌊train rows / rows per step⌋"
    )
    rows.append(("steps", steps, how))
    for arith, key in ((d.actor, "actor"), (d.critic, "critic")):
        if arith is None:
            continue
        engine = getattr(cfg, key)
        sp = engine.ulysses_sequence_parallel_size
        rows.append(
            (
                f"{key} data-parallel size",
                str(arith.dp),
                f"{arith.devices} devices, strategy {engine.strategy}"
                + (f", / sequence-parallel size {sp}" if sp > 1 else ""),
            )
        )
        if sp > 1:
            rows.append(
                (
                    f"{key} sequence parallelism",
                    f"{sp} ranks per sequence",
                    "Ulysses: each of a group's ranks runs 1/"
                    f"{sp} of every sequence's tokens; a group is one "
                    "data-parallel rank",
                )
            )
        rows.append(
            (
                f"{key} mini-batch (samples)",
                str(arith.mini_batch_size),
                f"{key}.mini_batch_size" if engine.mini_batch_size else "samples per step",
            )
        )
        if arith.grad_accum is not None:
            rows.append(
                (
                    f"{key} gradient accumulation",
                    str(arith.grad_accum),
                    f"mini-batch / dp ({arith.dp}) / micro_batch_size_per_device "
                    f"({arith.micro_batch_size})",
                )
            )
        else:
            rows.append(
                (
                    f"{key} micro-batches",
                    "by token budget",
                    f"{key}.max_token_len_per_device = {engine.max_token_len_per_device}",
                )
            )
        rows.append(
            (
                f"{key} optimizer steps per step",
                str(arith.optimizer_steps_per_rl_step),
                f"ppo_epochs ({engine.ppo_epochs}) × samples per step / mini-batch",
            )
        )
    if CRITIC in d.uses:
        critic_how = (
            "critic.enable"
            if cfg.critic.enable is not None
            else f"adv_estimator {cfg.algorithm.adv_estimator} "
            + ("needs values" if d.use_critic else "needs no values")
        )
        rows.append(("critic", "on" if d.use_critic else "off", critic_how))
    if REFERENCE in d.uses:
        rows.append(
            (
                "reference",
                "on" if d.use_reference else "off",
                f"the {cfg.pipeline} step always compares with it"
                if REFERENCE_ALWAYS in d.uses
                else "reference.enable or use_kl_loss or use_kl_in_reward",
            )
        )
    for name, teacher in cfg.distill.teachers.items():  # on-policy distillation
        tags = ", ".join(teacher.tags) if teacher.tags else "every tag"
        rows.append(
            (
                f"teacher {name}",
                teacher.model_path,
                f"kl_coef {teacher.kl_coef:g}, scores {tags}; on the reference's devices, "
                f"engine reference.strategy ({cfg.reference.strategy})",
            )
        )
    k = cfg.async_training.staleness
    if k > 0 and cfg.async_training.mode == "streaming":
        rows.append(_streaming_row(cfg, d.shape.groups))
    elif k > 0:
        rows.append(
            (
                "schedule",
                "one-step-off" if k == 1 else f"rollout {k} versions ahead",
                f"async_training.staleness={k}: batch s is generated with the weights after "
                f"max(0, s - {k + 1}) updates while the steps before it train (the rollout "
                "holds its own copy of the weights, pushed before each batch that needs a "
                "newer one); fixed by the step number, so a resume is exact"
                + _shared_rng_caveat(cfg),
            )
        )
    rows.append(
        (
            "devices",
            str(d.total_devices),
            f"resources.nnodes ({cfg.resources.nnodes}) × devices_per_node "
            f"({cfg.resources.devices_per_node}), backend {cfg.resources.backend}",
        )
    )
    for role, ids in d.placement.items():
        if role == "critic" and not d.use_critic:
            continue
        if role == "reference" and not d.use_reference:
            continue
        if role == "reward" and not cfg.reward.model.enable:
            continue
        if role == "actor_infer" and not d.use_rollout:
            continue
        rows.append((f"placement {role}", _ids(ids), f"resources.{role}"))
    return rows


def _ids(ids: list[int]) -> str:
    if ids and ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 2:
        return f"{ids[0]}..{ids[-1]}"
    return ",".join(map(str, ids))
