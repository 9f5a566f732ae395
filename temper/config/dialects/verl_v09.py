"""The verl key table: keys verl 0.9 (main from 2026-06 on) added to the trainer config.

- ``model_engine`` (``dp|megatron|torchtitan|veomni``) is a Hydra defaults group of
  ``ppo_trainer.yaml``: its option picks the per-role files (``${model_engine}_actor``, …),
  whose ``strategy`` keys then say the engine — verl's Python never reads
  ``model_engine`` itself. Here it sets the actor's strategy too, so a file whose
  ``strategy`` disagrees with it is refused instead of running another engine than
  the one the user picked.
- ``trainer.use_v1`` / ``trainer.v1.*``: verl's V1 trainer. Its ``sync`` mode and the
  legacy trainer (``use_v1: false``) run the same synchronous step, which is temper's
  loop. ``colocate_async`` / ``separate_async`` run rollouts ahead of training:
  asynchronous training is not built yet (issue 23 builds it), so they are refused; each
  of their options is inert under ``sync`` (verl reads ``trainer.v1.<mode>`` for the
  chosen mode only), and so is the replay buffer's off-policy bound (sync sampling is
  on-policy: ``replay_buffer.py`` calls ``max_off_policy_strategy`` a no-op there). The
  invariant ``train_batch_size = parameter_sync_step × ppo_mini_batch_size`` holds for
  ``separate_async`` only, which is refused, so it is not checked.
- ``reward``: the section that replaces ``reward_model`` / ``custom_reward_function`` /
  ``sandbox_fusion`` / ``reward_manager``. Its keys set the native fields the legacy keys
  set, weakly: verl 0.9 keeps the legacy sections (all null, ``legacy_reward_impl.yaml``)
  and ``migrate_legacy_reward_impl`` copies every non-null legacy value over the new key,
  so a legacy key that is set wins here too (with a note).
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects import verl_rules as r
from temper.config.dialects.verl_rules import Call, Gated, Inert, Map, Note, Rule
from temper.config.dialects.verl_versions import reward_kwargs, reward_model_server

#: verl's ``model_engine`` options temper runs -> the actor ``strategy`` their files set
#: (``actor/dp_actor.yaml``: fsdp; ``actor/megatron_actor.yaml``: megatron).
MODEL_ENGINE_STRATEGY = {"dp": "fsdp", "megatron": "megatron"}


def _model_engine(v: Any, ctx: Any) -> Any:
    r.refuse_other_engine(v, ctx)
    r.choice(*MODEL_ENGINE_STRATEGY)(v, ctx)
    ctx.note(
        "model_engine picks verl's per-role config files; it sets actor.strategy as the "
        "actor's strategy key does (dp: fsdp2)"
    )
    # dp is verl's FSDP engine, which temper runs as FSDP2 (as strategy: fsdp does)
    return "fsdp2" if v == "dp" else v


V1 = "trainer.v1"
ASYNC_MODES = ("colocate_async", "separate_async")
ASYNC_REASON = (
    "asynchronous (off-policy) generation, which runs rollouts ahead of training, is not "
    "built yet (issue 23 builds it)"
)
ASYNC_FIX = f"set {V1}.trainer_mode: sync (every step generates with the current weights)"


def _v1_on(ctx: Any) -> bool:
    """verl reads ``trainer.v1`` only with the V1 trainer (``use_v1``, default true)."""
    return ctx.get("trainer.use_v1", True) is not False


def _trainer_mode(v: Any, ctx: Any) -> None:
    """verl's V1 trainer mode: sync runs as temper's loop; colocate_async and
    separate_async are refused (asynchronous training is not built yet: issue 23); with
    trainer.use_v1 false it is not read."""
    if not _v1_on(ctx):
        ctx.note("no effect here (trainer.use_v1 is false: the legacy trainer never reads it)")
        return
    if v in ASYNC_MODES:
        raise ctx.error(f"{ASYNC_REASON} (got {v!r})", ASYNC_FIX)
    r.choice("sync", *ASYNC_MODES)(v, ctx)
    ctx.note("verl's V1 sync trainer: temper's loop runs the same synchronous step")


def _mode_off(mode: str) -> Any:
    """Inert predicate: ``trainer.v1.<mode>.*`` is read only when that mode runs."""
    return lambda _v, ctx: not _v1_on(ctx) or ctx.get(f"{V1}.trainer_mode", "sync") != mode


def _async_option(mode: str) -> Inert:
    return Inert(
        _mode_off(mode),
        f"read only by verl's {mode} trainer; trainer_mode is sync",
        ASYNC_REASON,
        ASYNC_FIX,
    )


def _positive_int(v: Any, _ctx: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


ON_POLICY = "sync sampling is on-policy: the off-policy bound is read by the async trainers only"
HYBRID = (
    "enable_switch",
    "switch_threshold_ratio",
    "adaptive_switch_threshold",
    "switch_threshold_step_up",
    "switch_threshold_step_down",
    "switch_threshold_release_steps",
    "switch_cost_window_size",
)


def _fully_async(_v: Any, ctx: Any) -> None:
    """verl's fully-async trainer (``verl.experimental.fully_async_policy``): a separate
    rollouter streaming samples to the trainer, bounded by ``staleness_threshold``."""
    raise ctx.error(
        f"verl's fully-async trainer: {ASYNC_REASON}",
        "train with verl's synchronous trainer's config (ppo_trainer): remove async_training "
        "and run the same file's other sections",
    )


RULES: dict[str, Rule] = {
    "model_engine": Map("actor.strategy", _model_engine),
    "async_training": Call(_fully_async),
    "trainer.use_v1": Note(
        "verl's V1 sync trainer and its legacy trainer run the same synchronous step, "
        "temper's loop; its samples keep their submission order either way"
    ),
    f"{V1}.trainer_mode": Call(_trainer_mode),
    f"{V1}.sync": Inert(
        (None, {}),
        "the sync trainer takes no options",
        "verl's sync trainer has no options",
        "set sync: {}",
    ),
    f"{V1}.colocate_async.num_warmup_batches": _async_option("colocate_async"),
    f"{V1}.separate_async.num_warmup_batches": _async_option("separate_async"),
    f"{V1}.separate_async.parameter_sync_step": _async_option("separate_async"),
    **{f"{V1}.separate_async.hybrid_rollout.{k}": _async_option("separate_async") for k in HYBRID},
    f"{V1}.sampler.max_off_policy_threshold": Inert(
        _positive_int,
        ON_POLICY,
        "must be a positive integer (verl's replay buffer asserts it)",
        "set it to a positive integer (verl's default is 8)",
    ),
    f"{V1}.sampler.max_off_policy_strategy": Inert(
        ("drop", "wait"), ON_POLICY, "must be drop or wait", "set it to drop or wait"
    ),
    f"{V1}.sampler.sync_refill_failed_groups": Inert(
        (False, None),
        "failed groups are not replaced",
        "replacing failed groups with fresh prompts is not supported",
        "set sync_refill_failed_groups: false",
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


MANAGERS = r.choice("naive", "batch", "dapo", "prime")
SEPARATE_POOL = "a separate reward-model pool is not supported"

REWARD_RULES: dict[str, Rule] = {
    f"{RW}.num_workers": Map("reward.num_workers", weak=True),
    f"{RW}.custom_reward_function.path": Map("reward.custom_function.path", weak=True),
    f"{RW}.custom_reward_function.name": Map("reward.custom_function.name", weak=True),
    # a legacy custom_reward_function (older verl: with reward_kwargs) moves here whole
    f"{RW}.custom_reward_function.reward_kwargs": Map("reward.custom_function.kwargs", weak=True),
    f"{RW}.reward_manager.name": Map("reward.reward_manager", MANAGERS, weak=True),
    f"{RW}.reward_manager.source": Inert(
        ("register", None),
        "built-in reward managers",
        "custom reward managers are not supported",
        "set source: register",
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
    f"{RWM}.enable_resource_pool": Inert(
        (False, None),
        "the reward model shares the actor's devices",
        "a separate reward-model pool is not expressible in verl terms",
        "remove it; set resources.reward natively",
    ),
    f"{RWM}.n_gpus_per_node": Inert(
        _pool_off, "enable_resource_pool is off", SEPARATE_POOL, "remove it"
    ),
    f"{RWM}.nnodes": Inert(_pool_off, "enable_resource_pool is off", SEPARATE_POOL, "remove it"),
    f"{RWM}.rollout": Call(reward_model_server),
    f"{RW}.reward_kwargs": Call(reward_kwargs),
}
RULES |= REWARD_RULES
