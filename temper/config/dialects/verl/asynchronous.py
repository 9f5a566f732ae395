"""verl's asynchronous vocabulary -> ``async_training.staleness`` (issue 23).

temper's asynchronous mode has a fixed schedule: with ``async_training.staleness`` k,
batch s (1-based) is generated with the weights after max(0, s − 1 − k) updates while
the steps before it train. verl's asynchronous trainers map onto it as follows.

- ``trainer.v1.trainer_mode: colocate_async | separate_async`` (verl 0.9's V1 trainer):
  ``on_train_begin`` submits ``num_warmup_batches`` W batches and every step submits one
  more, so a batch is trained about W versions after it was started; the replay buffer
  never trains a sample older than ``max_off_policy_threshold`` T − 1 versions
  (``replay_buffer.py``: span = step − tag + 1 ≤ T). Here k = min(W, T − 1). verl streams
  finished groups in finish order and continues in-flight generations with the new
  weights (partial rollout); temper generates each batch whole with the weights its
  schedule names: the same bound, a deterministic order, a bit-identical resume.
- ``separate_async`` trains the step's batch as ``parameter_sync_step`` P mini-batch
  updates and pushes the weights once per step; verl asserts ``train_batch_size = P ×
  ppo_mini_batch_size`` (``trainer_separate_async.py``), so temper's step (its mini-batch
  updates, then one push) is the same. Its rollout runs on a pool of its own,
  ``actor_rollout_ref.rollout.nnodes × n_gpus_per_node``, beside the trainer's.
- verl's one-step-off recipe (``verl/experimental/one_step_off_policy``, whose config adds
  a top-level ``rollout`` section: the rollout's own pool) runs k = 1 exactly: await
  batch s, push the weights, start batch s + 1, train on batch s — temper's schedule.
- ``algorithm.rollout_correction.bypass_mode`` takes the rollout's log-probs as the old
  log-probs (no actor recompute) and replaces the policy loss with its own: with
  ``loss_type: ppo_clip`` the vanilla PPO-clip loss, whose ratio is π/π_rollout, without IS
  weights (``compute_policy_loss_bypass_mode`` computes them for metrics only); with
  ``loss_type: reinforce`` REINFORCE with those weights, truncated, computed from the
  current policy (``actor.policy_loss: reinforce_is``).
- verl's fully-async trainer (``verl.experimental.fully_async_policy``, its
  ``async_training`` section) runs as ``async_training.mode: streaming``:
  :mod:`verl.fully_async`.
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core.apply import unsupported
from temper.config.dialects.core.derivation import derivation
from temper.config.dialects.verl import fully_async as fa

V1 = "trainer.v1"
ASYNC_MODES = ("colocate_async", "separate_async")
RO = "actor_rollout_ref.rollout"
ACT = "actor_rollout_ref.actor"
RC = "algorithm.rollout_correction"
SAMPLER = f"{V1}.sampler"

#: verl's defaults (ppo_trainer.yaml's trainer.v1 block)
WARMUP_DEFAULT = 1
THRESHOLD_DEFAULT = 8

DIFFERS = (
    "verl streams finished groups in finish order and continues in-flight generations "
    "with the new weights (partial rollout); temper generates each batch whole with the "
    "weights its fixed schedule names (batch s: the weights after max(0, s-1-k) updates) "
    "— the same staleness bound, a deterministic order, a bit-identical resume"
)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# --------------------------------------------------------------------------- which trainer


def one_step_off(ctx: Any) -> bool:
    """verl's one-step-off recipe: its config adds a top-level ``rollout`` section (the
    rollout's own pool), which no other trainer config of verl has but the fully-async
    one (told apart by its ``async_training`` section)."""
    return isinstance(ctx.get("rollout"), dict) and not fa.fully_async(ctx)


def own_pool_trainer(ctx: Any) -> str | None:
    """The trainer whose rollout runs on a pool of its own, set by the top-level
    ``rollout`` section (one-step-off, fully-async), or None."""
    if fa.fully_async(ctx):
        return "fully-async"
    return "one-step-off" if one_step_off(ctx) else None


def v1_mode(ctx: Any) -> str | None:
    """The V1 trainer mode verl runs, or None where ``trainer.v1`` is not read (the legacy
    trainer, ``trainer.use_v1: false``; the one-step-off and fully-async trainers)."""
    if ctx.get("trainer.use_v1", True) is False or own_pool_trainer(ctx):
        return None
    return str(ctx.get(f"{V1}.trainer_mode", "sync"))


#: the class each trainer with a pool of its own runs, which never reads ``trainer.v1``
OWN_POOL_CLASS = {"one-step-off": "OneStepOffRayTrainer", "fully-async": "FullyAsyncTrainer"}


def _not_read(ctx: Any) -> str:
    trainer = own_pool_trainer(ctx)
    if trainer:
        return f"verl's {trainer} trainer ({OWN_POOL_CLASS[trainer]}) never reads trainer.v1"
    return "trainer.use_v1 is false: the legacy trainer never reads it"


def use_v1(_v: Any, ctx: Any) -> None:
    """``trainer.use_v1``: which of verl's trainers runs (V1 or legacy); both run the
    same synchronous step unless a V1 async mode is chosen."""
    if own_pool_trainer(ctx):
        ctx.note(f"no effect here ({_not_read(ctx)})")
        return
    ctx.note(
        "no effect here (verl's V1 trainer and its legacy trainer run the same step, "
        "temper's loop; trainer.v1.trainer_mode chooses the asynchronous modes)"
    )


def trainer_mode(v: Any, ctx: Any) -> None:
    """verl's V1 trainer mode: ``sync`` is temper's loop; ``colocate_async`` and
    ``separate_async`` set ``async_training.staleness`` to ``num_warmup_batches`` (capped
    at ``max_off_policy_threshold`` − 1); not read by the legacy or one-step-off trainer."""
    if v1_mode(ctx) is None:
        ctx.note(f"no effect here ({_not_read(ctx)})")
        return
    if v == "sync":
        ctx.note("verl's V1 sync trainer: temper's loop runs the same synchronous step")
        return
    if v not in ASYNC_MODES:
        raise unsupported(ctx.key, v, ("sync", *ASYNC_MODES))
    ctx.note(f"verl's {v} trainer runs as async_training.staleness (see its num_warmup_batches)")
    ctx.note(f"{v}: {DIFFERS}")
    if v == "colocate_async":
        ctx.note(
            "colocate_async: temper's rollout holds its own copy of the weights rather than "
            "time-sharing the devices with the trainer (sleep/wake)"
        )


@derivation(
    f"{V1}.{{mode}}.num_warmup_batches", f"{SAMPLER}.max_off_policy_threshold", mode=ASYNC_MODES
)
def _staleness(ctx: Any, mode: str) -> None:
    """``async_training.staleness`` of a V1 async mode: min(W, T − 1)."""
    key = f"{V1}.{mode}.num_warmup_batches"
    warmup = ctx.get(key, WARMUP_DEFAULT)
    if not _int(warmup) or warmup < 0:
        raise ctx.error_at(
            key,
            f"must be an integer >= 0 (got {warmup!r})",
            "set it to 0 (synchronous) or more (batches started ahead of training)",
        )
    t_key = f"{SAMPLER}.max_off_policy_threshold"
    threshold = ctx.get(t_key, THRESHOLD_DEFAULT)
    if not _int(threshold) or threshold <= 0:
        raise ctx.error_at(
            t_key,
            f"must be a positive integer (verl's replay buffer asserts it; got {threshold!r})",
            "set it to a positive integer (verl's default is 8)",
        )
    k = min(warmup, threshold - 1)
    if warmup > threshold - 1:
        ctx.note(
            f"verl trains no sample older than max_off_policy_threshold - 1 = {threshold - 1} "
            f"versions: num_warmup_batches {warmup} runs as async_training.staleness {k}",
            key,
        )
    ctx.write("async_training.staleness", k, key)
    ctx.note(
        f"async_training.staleness {k}: batch s is generated with the weights after "
        f"max(0, s-1-{k}) updates (verl: num_warmup_batches {warmup} started ahead of training"
        + ("; 0 is synchronous" if k == 0 else "")
        + ")",
        key,
    )


def mode_option(mode: str, on: Any) -> Any:
    """A ``trainer.v1.<mode>.*`` or sampler option: ``on(v, ctx)`` when ``mode`` (a mode
    name, or ``"async"`` for either async mode) runs, else a note that nothing reads it."""

    def fn(v: Any, ctx: Any) -> None:
        running = v1_mode(ctx)
        if running is None:
            ctx.note(f"no effect here ({_not_read(ctx)})")
        elif running == mode or (mode == "async" and running in ASYNC_MODES):
            on(v, ctx)
        else:
            reader = "the async trainers" if mode == "async" else f"verl's {mode} trainer"
            ctx.note(f"no effect here (read by {reader} only; trainer_mode is {running})")

    first = " ".join((on.__doc__ or "").split("\n\n")[0].split())
    running = "either async mode" if mode == "async" else mode
    fn.__doc__ = f"{first} Read when trainer_mode is {running}; noted otherwise."
    return fn


def warmup(v: Any, ctx: Any) -> None:
    """Batches verl starts ahead of training: ``async_training.staleness`` is this, capped
    at ``trainer.v1.sampler.max_off_policy_threshold`` − 1 (0: synchronous)."""
    if not _int(v) or v < 0:  # the final pass sets the staleness from it (and its default)
        raise ctx.error(
            f"must be an integer >= 0 (got {v!r})",
            "set it to 0 (synchronous) or more (batches started ahead of training)",
        )


SYNC_STEP_DEFAULT = 4  # trainer.v1.separate_async.parameter_sync_step


def parameter_sync_step(v: Any, ctx: Any) -> None:
    """Mini-batch updates per weight push; verl asserts ``train_batch_size =
    parameter_sync_step × ppo_mini_batch_size``, which makes it temper's step (its
    mini-batch updates, then one push)."""
    if not _int(v) or v < 1:
        raise ctx.error(f"must be a positive integer (got {v!r})", "set it to 1 or more")
    ctx.note(
        f"verl's separate_async trains the step's batch as {v} mini-batch updates and "
        "pushes the weights once per step: so does temper's step "
        "(train_batch_size / ppo_mini_batch_size updates, then one push)"
    )


@derivation(
    f"{V1}.separate_async.parameter_sync_step",
    "data.train_batch_size",
    f"{ACT}.ppo_mini_batch_size",
)
def _sync_step_fits(ctx: Any) -> None:
    """verl asserts ``train_batch_size = parameter_sync_step × ppo_mini_batch_size``
    (``trainer_separate_async.py``)."""
    key = f"{V1}.separate_async.parameter_sync_step"
    steps = ctx.get(key, SYNC_STEP_DEFAULT)
    batch = ctx.get("data.train_batch_size")
    mini = ctx.get(f"{ACT}.ppo_mini_batch_size")
    if _int(steps) and _int(batch) and _int(mini) and batch != steps * mini:
        fix = f"set data.train_batch_size: {steps * mini}"
        if batch % mini == 0:
            fix += f", or parameter_sync_step: {batch // mini}"
        raise ctx.error_at(
            key,
            f"verl's separate_async trainer asserts data.train_batch_size ({batch}) = "
            f"parameter_sync_step ({steps}) × {ACT}.ppo_mini_batch_size ({mini})",
            fix,
        )


def hybrid_switch(v: Any, ctx: Any) -> None:
    """Lends the trainer's idle devices to the rollout (verl's hybrid rollout): refused
    when true (not built)."""
    if v not in (False, None):
        raise ctx.error(
            f"lending the trainer's idle devices to the rollout (hybrid rollout) is not "
            f"built (got {v!r})",
            "set enable_switch: false",
        )
    ctx.note("no effect here (hybrid rollout is off: the trainer's devices only train)")


def hybrid_option(_v: Any, ctx: Any) -> None:
    """Tunes verl's hybrid rollout, read with ``enable_switch`` only (which must be false
    here): no effect."""
    ctx.note(
        "no effect here (tunes hybrid rollout, which temper does not build; verl reads it "
        "with hybrid_rollout.enable_switch only, which must be false)"
    )


ON_POLICY = "sync sampling is on-policy: the off-policy bound is read by the async trainers only"


def _sampling(ctx: Any) -> str:
    return ON_POLICY if v1_mode(ctx) is not None else _not_read(ctx)


def off_policy_threshold(v: Any, ctx: Any) -> None:
    """The replay buffer's bound T (verl asserts T > 0 in every mode): an async mode's
    ``async_training.staleness`` is at most T − 1."""
    if not _int(v) or v <= 0:
        raise ctx.error(
            f"must be a positive integer (verl's replay buffer asserts it; got {v!r})",
            "set it to a positive integer (verl's default is 8)",
        )
    if v1_mode(ctx) in ASYNC_MODES:
        ctx.note(f"bounds async_training.staleness: at most threshold - 1 = {v - 1} versions")
    else:
        ctx.note(f"no effect here ({_sampling(ctx)})")


#: what verl's V1 replay buffer does at the bound T (``replay_buffer.py``), and why
#: temper's fixed schedule never reaches it
STRATEGY_AT_BOUND = {
    "drop": "verl evicts a finished group that spans more than T versions and samples a "
    "fresh prompt in its place",
    "wait": "verl stops sampling while a group in flight spans T versions, until it finishes",
}


def off_policy_strategy(v: Any, ctx: Any) -> None:
    """What verl's V1 replay buffer does with a group at the bound T: ``drop`` evicts and
    replaces it, ``wait`` blocks sampling until it finishes. No effect here: the fixed
    schedule never produces such a group."""
    if v not in STRATEGY_AT_BOUND:
        raise ctx.error(f"must be drop or wait (got {v!r})", "set it to drop or wait")
    if v1_mode(ctx) in ASYNC_MODES:
        # Streaming (whose wait/drop this key could name) ties the look-ahead and the bound
        # to one k, where verl's are num_warmup_batches and this threshold: the fixed
        # schedule keeps both as verl's file gives them, and an exact resume.
        ctx.note(
            f"no effect here ({v}: {STRATEGY_AT_BOUND[v]}; temper's fixed schedule trains "
            "each batch at most async_training.staleness = min(num_warmup_batches, T - 1) "
            "versions after its weights, a span of at most T, so no group reaches that "
            "point; async_training.mode: streaming is temper's rollout that drops or waits)"
        )
    else:
        ctx.note(f"no effect here ({_sampling(ctx)})")


# --------------------------------------------------------------------------- pools


def _pool_size(ctx: Any, key: str, default: int, what: str, pool: str) -> int:
    value = ctx.get(key, default)
    if not _int(value) or value <= 0:
        raise ctx.error_at(
            key,
            f"{what} runs the {pool} on a pool of its own and asserts its size is a positive "
            f"integer (got {value!r})",
            f"set {key} to the pool's size (1 or more)",
        )
    return int(value)


@derivation(
    "trainer.nnodes",
    "trainer.n_gpus_per_node",
    "{pool}.nnodes",
    "{pool}.n_gpus_per_node",
    # its callers' pools: the recipes' rollout, V1's rollout, on-policy distillation's teachers
    pool=("rollout", RO, "distillation"),
)
def separate_pool(
    ctx: Any,
    nodes_key: str,
    gpus_key: str,
    what: str,
    *,
    pool: str = "rollout",
    role: str = "resources.actor_infer",
) -> None:
    """The trainer's pool (``trainer.nnodes × n_gpus_per_node``) and ``pool``'s own
    (``nodes_key × gpus_key``; the rollout's, or on-policy distillation's teachers') as
    temper's device ids: the trainer's first, the other's after them, as ``role`` (each a
    contiguous range of ``nnodes × devices_per_node``)."""
    trainer = f"verl's {what} trainer"
    nt = _pool_size(ctx, "trainer.nnodes", 1, trainer, pool)
    gt = _pool_size(ctx, "trainer.n_gpus_per_node", 8, trainer, pool)
    nr = _pool_size(ctx, nodes_key, 0, trainer, pool)
    gr = _pool_size(ctx, gpus_key, gt, trainer, pool)
    if nt == nr:  # each node holds both pools' devices (verl's one-node scripts)
        nnodes, per_node = nt, gt + gr
    elif gt == gr:  # whole nodes for each pool
        nnodes, per_node = nt + nr, gt
    else:
        raise ctx.error_at(
            nodes_key,
            f"a trainer pool of {nt} nodes × {gt} devices beside a {pool} pool of {nr} nodes "
            f"× {gr} devices does not fit temper's placement (resources.nnodes × "
            "devices_per_node, each role a contiguous range of device ids)",
            "give both pools the same node count or the same devices per node",
        )
    train, roll = nt * gt, nr * gr
    key = gpus_key
    ctx.replace("resources.nnodes", nnodes, key)
    ctx.replace("resources.devices_per_node", per_node, key)
    ctx.write("resources.actor_train", list(range(train)), key)
    ctx.write(role, list(range(train, train + roll)), key)
    ctx.note(
        f"{what}: the {pool} pool ({nr}×{gr}) beside the trainer's ({nt}×{gt}) is "
        f"{role} {train}..{train + roll - 1} of {nnodes}×{per_node} devices, "
        f"the trainer's resources.actor_train 0..{train - 1}"
        + (
            " (temper numbers devices node by node, so a node may hold both pools' devices)"
            if nnodes > 1 and nt == nr
            else ""
        ),
        key,
    )


def rollout_pool_key(v: Any, ctx: Any) -> None:
    """verl's one-step-off and fully-async trainers: the rollout's own pool
    (``rollout.nnodes × rollout.n_gpus_per_node``), placed as ``resources.actor_infer``
    after the trainer's devices."""
    if not _int(v) or v <= 0:
        raise ctx.error(f"must be a positive integer (got {v!r})", "give the rollout pool's size")


def standalone_rollout(v: Any, ctx: Any) -> None:
    """The standalone rollout pool of verl's separate_async trainer (``nnodes ×
    n_gpus_per_node``), placed as ``resources.actor_infer`` after the trainer's devices;
    with the other trainers nnodes is 0 (the rollout shares the trainer's devices)."""
    trainer = own_pool_trainer(ctx)
    if trainer:
        ctx.note(
            f"no effect here (verl's {trainer} main sets it from the top-level rollout "
            "section: the rollout's own pool)"
        )
        return
    if v1_mode(ctx) == "separate_async":
        ctx.note("the standalone rollout pool of verl's separate_async trainer: see resources")
        return
    nodes = ctx.get(f"{RO}.nnodes", 0)
    if ctx.leaf == "nnodes" and v not in (0, None):
        raise ctx.error(
            f"standalone rollout nodes are read by verl's separate_async trainer only (got {v!r})",
            "set nnodes: 0, or trainer.v1.trainer_mode: separate_async",
        )
    why = (
        "the rollout shares the trainer's devices (hybrid engine)"
        if ctx.leaf == "nnodes"
        else f"read for standalone rollout nodes only (nnodes is {nodes or 0})"
    )
    ctx.note(f"accepted at its inert value ({why})")


def hybrid_engine(v: Any, ctx: Any) -> None:
    """True: the actor, rollout and reference share all devices (colocated placement);
    verl's one-step-off and fully-async trainers assert false (their rollout runs on a pool
    of its own)."""
    trainer = own_pool_trainer(ctx)
    if trainer:
        if v is not False:
            raise ctx.error(
                f"verl's {trainer} trainer asserts hybrid_engine is false: its rollout "
                f"runs on its own pool, rollout.nnodes × rollout.n_gpus_per_node (got {v!r})",
                "set actor_rollout_ref.hybrid_engine: false",
            )
        ctx.note(f"accepted (the {trainer} trainer's rollout runs on its own pool)")
        return
    if v is not True:
        raise ctx.error(
            "only the hybrid engine (colocated actor and rollout) is expressible in verl "
            f"terms outside the one-step-off recipe (got {v!r})",
            "remove it; place roles natively with resources.actor_infer",
        )
    ctx.note(
        "accepted at its inert value (actor, rollout and reference share all devices: "
        "colocated placement)"
    )


@derivation(
    "rollout",
    "async_training",
    "trainer.use_v1",
    f"{V1}.trainer_mode",
    f"{RC}.bypass_mode",
    f"{RC}.loss_type",
)
def finish(ctx: Any) -> None:
    """The final pass: the staleness and placement of an asynchronous trainer (the
    fully-async trainer's: :func:`verl_fully_async.finish`); bypass mode's REINFORCE
    loss."""
    if bypass_on(ctx) and ctx.get(f"{RC}.loss_type", "ppo_clip") == "reinforce":
        _reinforce(ctx)
    mode = v1_mode(ctx)
    if fa.fully_async(ctx):
        fa.finish(ctx)
        separate_pool(ctx, "rollout.nnodes", "rollout.n_gpus_per_node", "fully-async")
    elif one_step_off(ctx):
        ctx.write("async_training.staleness", 1, "rollout.nnodes")
        ctx.note(
            "verl's one-step-off recipe: async_training.staleness 1 (batch s is generated "
            "with the weights after max(0, s-2) updates while step s-1 trains), as verl "
            "runs it: whole batches, weights pushed before each, a deterministic order",
            "rollout.nnodes",
        )
        separate_pool(ctx, "rollout.nnodes", "rollout.n_gpus_per_node", "one-step-off")
    elif mode in ASYNC_MODES:
        _staleness(ctx, mode)
        if mode == "separate_async":
            _separate_async(ctx)


@derivation(f"{RO}.checkpoint_engine.backend", "reward.reward_model.enable", "reward_model.enable")
def _separate_async(ctx: Any) -> None:
    """verl's separate_async trainer: its rollout pool, and what it asserts of the weight
    sync and the reward model."""
    _sync_step_fits(ctx)
    separate_pool(ctx, f"{RO}.nnodes", f"{RO}.n_gpus_per_node", "separate_async")
    backend = ctx.get(f"{RO}.checkpoint_engine.backend", "naive")
    if backend == "naive":
        raise ctx.error_at(
            f"{RO}.checkpoint_engine.backend",
            "verl's separate_async trainer asserts a weight-sync backend other than naive "
            "(its rollout runs on its own pool)",
            "set checkpoint_engine.backend: nccl",
        )
    reward_model = ctx.get("reward.reward_model.enable") or ctx.get("reward_model.enable")
    if reward_model:
        raise ctx.error_at(
            f"{V1}.trainer_mode",
            "verl's separate_async trainer asserts the reward model has a pool of its own "
            "(reward_model.enable_resource_pool), which is not expressible here",
            "use trainer_mode: colocate_async, or a rule-based reward",
        )


# --------------------------------------------------------------------------- bypass mode


def bypass_on(ctx: Any) -> bool:
    return ctx.get(f"{RC}.bypass_mode", False) is True


def bypass_mode(v: Any, ctx: Any) -> None:
    """``rollout_correction.bypass_mode``: true takes the rollout's log-probs as the old
    log-probs (``actor.recompute_old_log_prob: false``) with verl's PPO-clip loss."""
    if v in (False, None):
        ctx.note("accepted at its inert value (old log-probs are recomputed)")
        return
    if v is not True:
        raise ctx.error(f"must be true or false (got {v!r})", "set bypass_mode: false")
    mode = ctx.get(f"{ACT}.policy_loss.loss_mode", "vanilla")
    if mode != "vanilla":
        raise ctx.error(
            f"verl's bypass mode replaces policy_loss.loss_mode ({mode!r}) with its own loss "
            "(loss_type ppo_clip: the vanilla PPO-clip loss), so the file's loss would not run",
            f"set {ACT}.policy_loss.loss_mode: vanilla (what verl runs), or bypass_mode: false",
        )
    if ctx.get(f"{RO}.calculate_log_probs", True) is False:
        raise ctx.error(
            "verl's bypass mode needs the rollout's log-probs (it raises without them)",
            f"set {RO}.calculate_log_probs: true",
        )
    if ctx.get("algorithm.use_kl_in_reward") and ctx.get("algorithm.kl_penalty") == "full":
        raise ctx.error(
            "the exact (full) KL in the reward needs the actor's forward pass, which bypass "
            "mode skips",
            "set algorithm.kl_penalty: low_var_kl (or kl), or bypass_mode: false",
        )
    ctx.write("actor.recompute_old_log_prob", False)
    ctx.note(
        "verl's bypass mode: the rollout's log-probs are the old log-probs (no actor "
        "recompute; actor.recompute_old_log_prob: false), and loss_type's loss replaces "
        "the policy loss (ppo_clip: the vanilla PPO-clip loss, ratio pi/pi_rollout)"
    )


def loss_type(v: Any, ctx: Any) -> None:
    """Bypass mode's loss: ``ppo_clip`` (the vanilla PPO-clip loss, ratio π/π_rollout, no IS
    weights) or ``reinforce`` (``actor.policy_loss: reinforce_is``: REINFORCE with the
    truncated IS weights π/π_rollout that ``rollout_is`` names, no clipping)."""
    if not bypass_on(ctx):
        ctx.note("no effect here (read in bypass mode only, which is off)")
        return
    if v not in ("ppo_clip", "reinforce", None):
        raise ctx.error(f"must be ppo_clip or reinforce (got {v!r})", "set loss_type: ppo_clip")
    if v == "reinforce":
        ctx.note(
            "reinforce: actor.policy_loss reinforce_is, -sg[w]·A·log pi with w the truncated "
            "IS weight pi/pi_rollout at rollout_is's level (none: plain REINFORCE)"
        )
    else:
        ctx.note("ppo_clip: the vanilla PPO-clip loss with old log-probs from the rollout")


@derivation(
    f"{RC}.rollout_is",
    f"{RC}.rollout_is_batch_normalize",
    fields=("actor.rollout_is_threshold", "actor.rollout_is_threshold_low"),
)
def _reinforce(ctx: Any) -> None:
    """Bypass mode's REINFORCE loss: ``actor.policy_loss: reinforce_is`` with
    ``rollout_is``'s level, thresholds and batch normalization (verl computes the weights
    inside the loss, from the current log-probs)."""
    key = f"{RC}.loss_type"
    level = ctx.get(f"{RC}.rollout_is") or "none"
    if level != "none" and ctx.get(f"{RC}.rollout_is_batch_normalize", False):
        ctx.write("actor.policy_loss_kwargs.reinforce_is_batch_normalize", True, key)
    ctx.replace("actor.policy_loss", "reinforce_is", key)
    ctx.write("actor.policy_loss_kwargs.reinforce_is_level", level, key)
    if level != "none":
        high = ctx.out.written("actor.rollout_is_threshold", 2.0).value
        low = ctx.out.written("actor.rollout_is_threshold_low").value
        ctx.write("actor.policy_loss_kwargs.reinforce_is_threshold", high, key)
        if low is not None:
            ctx.write("actor.policy_loss_kwargs.reinforce_is_threshold_low", low, key)


def rollout_is_batch_normalize(v: Any, ctx: Any) -> Any:
    """``rollout_is_batch_normalize``: divide the IS weights by their batch mean. In bypass
    mode the weights are the loss's own (REINFORCE) or none (ppo_clip)."""
    if not v:
        return v
    if not ctx.get(f"{RC}.rollout_is"):
        ctx.note("no effect here (rollout_is is null: there are no IS weights to normalize)")
        return False
    if not bypass_on(ctx):
        return v
    if ctx.get(f"{RC}.loss_type", "ppo_clip") == "reinforce":
        ctx.note(
            "normalizes bypass mode's REINFORCE weights (actor.policy_loss_kwargs."
            "reinforce_is_batch_normalize) over each whole mini-batch, with one extra forward "
            "per mini-batch; verl normalizes within each micro-batch, which depends on the split"
        )
    else:
        ctx.note("no effect here (bypass mode applies no rollout IS weights to this loss)")
    return False


def rollout_is(v: Any, ctx: Any) -> Any:
    """``rollout_is``: the IS weights' level (null: off). In bypass mode (ppo_clip) verl
    computes them for metrics only and trains without them: off here."""
    from temper.config.dialects.verl.transforms import choice

    if v is None:
        return None
    level = choice("token", "sequence")(v, ctx)
    if not bypass_on(ctx):
        return level
    if ctx.get(f"{RC}.loss_type", "ppo_clip") == "reinforce":
        ctx.note(
            "the level of bypass mode's REINFORCE weights (actor.policy_loss_kwargs."
            "reinforce_is_level), computed in the loss from the current policy"
        )
    else:
        ctx.note(
            "no effect here (verl's bypass mode with loss_type ppo_clip computes these IS "
            "weights for metrics only: the PPO ratio pi/pi_rollout already corrects for the "
            "rollout, so the loss applies none)"
        )
    return "none"
