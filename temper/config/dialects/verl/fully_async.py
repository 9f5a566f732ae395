"""verl's fully-async trainer (``verl.experimental.fully_async_policy``) ->
``async_training.mode: streaming`` (issue 23).

verl runs a rollouter on a pool of its own (``rollout.nnodes × n_gpus_per_node``) that
draws one prompt at a time (``data.gen_batch_size: 1``; ``data.train_batch_size: 0``,
both asserted) and queues each finished group; a trainer that takes ``require_batches ×
ppo_mini_batch_size`` groups per local step, updates on them, and pushes its weights to
the rollouter every ``trigger_parameter_sync_step`` local steps. Its parameter version
(the step it logs, validates and saves at) counts those pushes. Here:

- **a step is one push cycle**: ``data.train_batch_size`` B = trigger_parameter_sync_step
  × require_batches × ppo_mini_batch_size prompts, trained as B / ppo_mini_batch_size
  mini-batch updates, then one weight push — as for the V1 separate_async trainer's
  ``parameter_sync_step``. Old log-probs are those of the weights the cycle started
  with in both (verl restores them for every local step after the first; under
  ``bypass_mode`` they are the rollout's).
- **staleness**: verl's rollouter pauses once ``(1 + t) × C`` samples (t =
  ``staleness_threshold``, C = B, one cycle's) were started since the last push, counting
  those still queued or in flight then. The trainer takes C per cycle, so at most t × C
  samples outlive a push; taken in the order they finish, a sample is trained at most
  ⌈t⌉ pushes after the one whose weights started it. ``async_training.staleness`` k =
  ⌈t⌉ with ``max_off_policy_strategy: wait`` (verl pauses the rollout, it never drops):
  the same version bound, held for every group (verl's bound is on counts, so a long
  generation overtaken by shorter ones may be older there), and
  ``async_training.max_ahead_batches`` 1 + t stops the rollout at (1 + t) × C groups
  queued or in flight, as verl stops. t = 0 starts no sample beyond the cycle's:
  temper's synchronous loop (staleness 0).
- **partial rollout**: verl aborts the requests in flight at a push and resumes them
  under the new weights; here generations run ``partial_rollout_segment`` tokens at a
  time with the newest weights pushed between segments. The segment is a quarter of
  ``data.max_response_length`` (rounded up): a response in flight takes up newer weights
  within a quarter of its longest length, at the cost of prefilling its prefix again up
  to three times.
- **length**: ``rollout.total_rollout_steps`` counts prompts (verl's TODO renames it
  ``total_rollout_samples``): ``experiment.max_steps`` = ⌊total_rollout_steps / B⌋, as
  verl's ``total_train_steps``.

Refused: dynamic resource scheduling (trainer devices lent to the rollout), a reward
model (verl asserts a pool of its own for it), and what verl asserts.
"""

from __future__ import annotations

import math
from typing import Any

from temper.config.dialects.core.derivation import derivation
from temper.config.dialects.core.rules import Call, Map, Note, Refuse, Rule, Use

AT = "async_training"
ACT = "actor_rollout_ref.actor"
RO = "actor_rollout_ref.rollout"

#: verl's defaults where the section leaves a key out (``config.async_training.get``)
THRESHOLD_DEFAULT = 1
TRIGGER_DEFAULT = 4
REQUIRE_DEFAULT = 1
RESPONSE_LENGTH_DEFAULT = 512  # verl's data.max_response_length
#: a partial rollout's segment is this fraction of the response length (module docstring)
SEGMENTS_PER_RESPONSE = 4


def fully_async(ctx: Any) -> bool:
    """verl's fully-async trainer: the only config of verl with an ``async_training``
    section."""
    return isinstance(ctx.get(AT), dict)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _given(ctx: Any, key: str, default: Any) -> Any:
    """The file's value of ``key`` (null kept: verl asserts on it), ``default`` without it."""
    return ctx.get(key) if ctx.has(key) else default


def _positive_int(v: Any, ctx: Any, key: str) -> None:
    if not _int(v) or v < 1:
        raise ctx.error_at(
            key, f"must be an integer >= 1 (verl asserts it; got {v!r})", "set it to 1 or more"
        )


def _flag(v: Any, ctx: Any, key: str | None = None) -> None:
    if not isinstance(v, bool):
        reason, fix = f"must be true or false (got {v!r})", "set it to true or false"
        raise ctx.error_at(key, reason, fix) if key else ctx.error(reason, fix)


def trainer_validates(v: Any, ctx: Any) -> None:
    """Validation on the trainer's devices (a rollout replica there) instead of the
    rollouter's: where it runs only."""
    _flag(v, ctx)
    ctx.note(
        "no effect here (where validation runs: temper validates on the rollout worker "
        "between generation calls, after pushing the trainer's weights — the same weights "
        "either way)"
    )


def gen_batch_size(v: Any, ctx: Any) -> Any:
    """Prompts per generation round of dynamic sampling; the fully-async rollouter asserts
    1 (it draws one prompt at a time), which sets nothing here."""
    if not fully_async(ctx):
        return v
    if v != 1:
        raise ctx.error(
            f"verl's fully-async rollouter asserts gen_batch_size is 1 (got {v!r})",
            "set data.gen_batch_size: 1",
        )
    ctx.note(
        "verl's rollouter draws one prompt at a time; temper's streaming rollout draws a "
        "step's prompts and generates async_training.stream_chunk of them per call, each "
        "group handed to training as its call finishes"
    )
    return None


def filter_groups(v: Any, ctx: Any) -> Any:
    """``algorithm.filter_groups.enable``: verl's fully-async trainer reads no
    ``filter_groups`` (its rollouter hands every group to the trainer), so a file that turns
    it on never filtered there; temper's streaming would, and run another algorithm."""
    if v and fully_async(ctx):
        raise ctx.error(
            "verl's fully-async trainer does not read algorithm.filter_groups: it trains "
            "every group, so this file's dynamic sampling never ran",
            "set algorithm.filter_groups.enable: false (what verl runs); temper's own "
            "async_training.mode: streaming filters groups as they finish",
        )
    return v


def standalone_memory(v: Any, ctx: Any) -> None:
    """The memory share of the rollout's own replicas (null: ``gpu_memory_utilization``);
    without dynamic resource scheduling every replica of the fully-async rollouter is one."""
    if v is None:
        ctx.note("accepted at its inert value (rollout.gpu_memory_utilization applies)")
    elif not fully_async(ctx):
        ctx.note("no effect here (read by verl's fully-async trainer only)")
    # else: the final pass sets rollout.gpu_memory_utilization from it


# --------------------------------------------------------------------------- final pass


@derivation(
    f"{AT}.trigger_parameter_sync_step",
    f"{AT}.require_batches",
    f"{ACT}.ppo_mini_batch_size",
    f"{RO}.standalone_gpu_memory_utilization",
    "data.train_batch_size",
    f"{RO}.calculate_log_probs",
    "reward.reward_model.enable",
    "reward_model.enable",
)
def finish(ctx: Any) -> None:
    """The fully-async trainer's step, staleness, partial rollout and length (module
    docstring); its rollout pool is placed by the caller (``verl_async.separate_pool``)."""
    _asserts(ctx)
    trigger = _given(ctx, f"{AT}.trigger_parameter_sync_step", TRIGGER_DEFAULT)
    require = _given(ctx, f"{AT}.require_batches", REQUIRE_DEFAULT)
    _positive_int(trigger, ctx, f"{AT}.trigger_parameter_sync_step")
    _positive_int(require, ctx, f"{AT}.require_batches")
    mini = ctx.get(f"{ACT}.ppo_mini_batch_size")
    if not _int(mini) or mini < 1:
        raise ctx.error_at(
            f"{ACT}.ppo_mini_batch_size",
            f"verl's fully-async trainer takes require_batches × ppo_mini_batch_size prompts "
            f"per local step, so it must be a positive integer (got {mini!r})",
            "set it to the prompts of one mini-batch update",
        )
    batch = trigger * require * mini
    key = f"{AT}.trigger_parameter_sync_step"
    ctx.replace("data.train_batch_size", batch, key)
    ctx.note(
        f"temper's step is one cycle of verl's fully-async trainer: trigger_parameter_sync_"
        f"step {trigger} × require_batches {require} × ppo_mini_batch_size {mini} = "
        f"data.train_batch_size {batch} prompts, trained as {trigger * require} mini-batch "
        "updates, then one weight push; steps, test_freq and save_freq count pushes as "
        "verl's parameter version does",
        key,
    )
    _staleness(ctx)
    _length(ctx, batch)
    memory = ctx.get(f"{RO}.standalone_gpu_memory_utilization")
    if memory is not None:
        ctx.replace(
            "rollout.gpu_memory_utilization", memory, f"{RO}.standalone_gpu_memory_utilization"
        )
        ctx.note(
            "the rollout's own replicas' memory share (every replica is one without dynamic "
            "resource scheduling): rollout.gpu_memory_utilization",
            f"{RO}.standalone_gpu_memory_utilization",
        )


def _asserts(ctx: Any) -> None:
    """What verl's fully-async trainer asserts, and the reward model it runs only on a pool
    temper cannot express."""
    if ctx.get("data.train_batch_size") != 0:
        raise ctx.error_at(
            "data.train_batch_size",
            "verl's fully-async rollouter asserts it is 0: a step's prompts are "
            "trigger_parameter_sync_step × require_batches × ppo_mini_batch_size "
            f"(got {ctx.get('data.train_batch_size')!r})",
            "set data.train_batch_size: 0",
        )
    if ctx.get(f"{RO}.calculate_log_probs", True) is False:
        raise ctx.error_at(
            f"{RO}.calculate_log_probs",
            "verl's fully-async rollouter asserts the rollout computes its log-probs",
            f"set {RO}.calculate_log_probs: true",
        )
    for enable in ("reward.reward_model.enable", "reward_model.enable"):
        if not ctx.get(enable):
            continue
        raise ctx.error_at(
            enable,
            "verl's fully-async trainer asserts a reward model runs on a pool of its own "
            "(reward_model.enable_resource_pool), which is not expressible here",
            "use a rule-based or function reward",
        )


@derivation(f"{AT}.staleness_threshold", f"{AT}.partial_rollout", "data.max_response_length")
def _staleness(ctx: Any) -> None:
    """Samples the rollouter may start beyond one cycle's, as a fraction ``t`` of it:
    ``async_training.staleness`` ⌈t⌉ (0: synchronous); generations in flight at a weight
    push continue under the new weights: ``async_training.partial_rollout_segment``, a
    quarter of the response length."""
    key = f"{AT}.staleness_threshold"
    threshold = _given(ctx, key, THRESHOLD_DEFAULT)
    if not _number(threshold) or threshold < 0:
        raise ctx.error_at(
            key,
            f"must be a number >= 0 (verl asserts it; got {threshold!r})",
            "set it to 0 (on-policy) or more (e.g. 0.1: a tenth of a cycle's samples ahead)",
        )
    partial_key = f"{AT}.partial_rollout"
    partial = _given(ctx, partial_key, True)
    _flag(partial, ctx, partial_key)
    if threshold == 0:
        ctx.write("async_training.staleness", 0, key)
        ctx.note(
            "staleness_threshold 0: verl's rollouter starts no sample beyond the cycle's, "
            "so each is trained with the weights that generated it: temper's synchronous "
            "loop (async_training.staleness 0)",
            key,
        )
        if partial:
            ctx.note(
                "no effect here (staleness_threshold 0: no generation is in flight at a "
                "weight push, so none is continued)",
                partial_key,
            )
        return
    k = math.ceil(threshold)
    ctx.write("async_training.staleness", k, key)
    ctx.write("async_training.mode", "streaming", key)
    ctx.write("async_training.max_off_policy_strategy", "wait", key)
    ctx.write("async_training.max_ahead_batches", 1 + threshold, key)
    ctx.note(
        f"async_training.staleness {k} = ceil(staleness_threshold {threshold:g}), mode "
        "streaming, max_off_policy_strategy wait: verl keeps at most "
        f"{threshold:g} × a cycle's samples past a push, so a sample is trained at most "
        f"{k} pushes after its weights (temper bounds every group so); "
        f"async_training.max_ahead_batches {1 + threshold:g}: the rollout runs at most "
        f"{1 + threshold:g} cycles of groups ahead, as verl's",
        key,
    )
    if not partial:
        ctx.note(
            "partial_rollout false: a generation call finishes with the weights it started "
            "with (async_training.partial_rollout_segment 0)",
            partial_key,
        )
        return
    length = ctx.get("data.max_response_length", RESPONSE_LENGTH_DEFAULT)
    segment = max(1, math.ceil(length / SEGMENTS_PER_RESPONSE))
    ctx.write("async_training.partial_rollout_segment", segment, partial_key)
    ctx.note(
        f"async_training.partial_rollout_segment {segment} (a quarter of "
        f"max_response_length {length}): verl aborts the generations in flight at a weight "
        "push and resumes them under the new weights; temper generates this many tokens at "
        "a time and pushes the newest weights between segments (and between the turns of "
        "a multi-turn exchange)",
        partial_key,
    )


@derivation("rollout.total_rollout_steps", fields=("experiment.max_steps",))
def _length(ctx: Any, batch: int) -> None:
    """Prompts the rollouter generates in all: ``experiment.max_steps`` = ⌊total / batch⌋;
    null: every prompt, ``total_epochs`` times."""
    key = "rollout.total_rollout_steps"
    total = ctx.get(key)
    if total is not None and (not _int(total) or total < 1):
        raise ctx.error_at(
            key, f"must be a positive integer or null (got {total!r})", "set it to 1 or more"
        )
    steps_key = "trainer.total_training_steps"
    if ctx.out.written("experiment.max_steps").key.endswith(steps_key):
        ctx.out.drop("experiment.max_steps")  # verl's fully-async trainer never reads it
        ctx.note(
            f"no effect here (verl's fully-async trainer counts its steps from {key})",
            steps_key,
        )
    if total is None:
        ctx.note(
            "null: every prompt total_epochs times, in steps of data.train_batch_size "
            "prompts (verl: the same count, its total_train_steps)",
            key,
        )
        return
    steps = total // batch
    if steps < 1:
        raise ctx.error_at(
            key,
            f"{total} prompts are fewer than one step's {batch} (trigger_parameter_sync_step "
            "× require_batches × ppo_mini_batch_size): verl would train no step",
            f"set {key}: {batch} or more (a multiple of {batch})",
        )
    ctx.replace("experiment.max_steps", steps, key)
    ctx.note(
        f"experiment.max_steps {steps} = floor({total} prompts / {batch} per step), verl's "
        "total_train_steps; verl stops sooner if total_epochs passes over the data end "
        "first, temper runs max_steps whatever the epochs",
        key,
    )


DYNAMIC = "dynamic resource scheduling (the trainer's devices lent to the rollout)"

RULES: dict[str, Rule] = {
    f"{AT}.staleness_threshold": Use(
        "async_training.staleness ⌈t⌉ (0: synchronous), mode streaming, max_ahead_batches 1 + t",
        by=_staleness,
    ),
    f"{AT}.trigger_parameter_sync_step": Use(
        "data.train_batch_size = this × require_batches × ppo_mini_batch_size (one step, one "
        "weight push)",
        by=finish,
    ),
    f"{AT}.require_batches": Use(
        "a factor of data.train_batch_size (mini-batches per local trainer step)", by=finish
    ),
    f"{AT}.partial_rollout": Use(
        "async_training.partial_rollout_segment, a quarter of data.max_response_length",
        by=_staleness,
    ),
    f"{AT}.use_trainer_do_validate": Call(trainer_validates),
    f"{AT}.use_dynamic_resource_scheduling": Refuse(
        f"{DYNAMIC} is not built",
        "set use_dynamic_resource_scheduling: false",
        ok=(False, None),
        why="the trainer's devices only train",
    ),
    **{
        f"{AT}.dynamic_schedule_{k}": Note(
            "read with use_dynamic_resource_scheduling only, which must be false here"
        )
        for k in ("policy", "deactivate_ratio", "enable_rebalance")
    },
    f"{AT}.concurrent_samples_per_replica": Note(
        "caps the requests each rollout server runs at once (throughput); temper's "
        "streaming rollout sends async_training.stream_chunk prompts per generation call, "
        "and the staleness bound does not depend on either"
    ),
    "rollout.total_rollout_steps": Use(
        "experiment.max_steps = ⌊prompts / data.train_batch_size⌋ (null: total_epochs)",
        by=_length,
    ),
    "rollout.n": Note(
        "no code of verl reads the top-level rollout.n (the fully-async config declares "
        "it); actor_rollout_ref.rollout.n sets the responses per prompt"
    ),
    "data.gen_batch_size": Map("data.gen_batch_size", gen_batch_size),
    f"{ACT}.use_rollout_log_probs": Note(
        "verl's actor config declares it but no code of verl reads it; "
        "algorithm.rollout_correction.bypass_mode decides whether the old log-probs are "
        "the rollout's"
    ),
    f"{RO}.standalone_gpu_memory_utilization": Call(standalone_memory),
}
