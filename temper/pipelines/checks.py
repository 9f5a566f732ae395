"""What a run refuses before anything loads, for every pipeline: settings the config
layer accepts on their own but the driver cannot honour in combination (each pipeline
adds its own in its record's ``check``). They run inside ``load_config`` (through the
catalog), so a verl or ROLL user reads each failure in the keys of their own file: one
``ConfigError`` naming the key, the reason and the fix.
"""

from __future__ import annotations

import dataclasses

from temper.algorithms import (
    PolicyLossParamError,
    check_policy_loss,
    estimator_inputs,
    estimator_params,
    kl_estimator_needs_logits,
    own_params,
)
from temper.algorithms.gkd import direct_gradient_estimator_ok
from temper.config.catalog import REWARD_COMPONENTS
from temper.config.derive import Derived
from temper.config.errors import BOUND, Bound, ConfigError
from temper.config.plan import REWARD_MODEL, ROLLOUT
from temper.config.schema import TemperConfig
from temper.config.typed import to_dict
from temper.pipelines.registry import PIPELINES, resolve_pipeline
from temper.pipelines.router_replay_check import check_router_replay
from temper.pipelines.ulysses_check import check_ulysses
from temper.roles.actor import policy_loss_params
from temper.roles.reward_model import REWARD_MODEL_STRATEGIES
from temper.rollout.tools import check_multi_turn

FILTER_METRICS = ("score", "reward")


def check_run(cfg: TemperConfig, plan: Derived) -> None:
    """Raise ``ConfigError`` for the first setting the run could not honour."""
    check_multi_turn(cfg.rollout.multi_turn)  # rollout-layer values, before a model
    _check_reward_normalization(cfg)
    _check_dynamic_sampling(cfg)
    _check_full_kl(cfg)
    _check_checkpoint_contents("actor", cfg.actor.checkpoint_contents)
    _check_checkpoint_contents("critic", cfg.critic.checkpoint_contents)
    _check_pipeline_sections(cfg)
    _check_token_budgets(cfg, plan)
    _check_estimator_inputs(cfg)
    _check_estimator_params(cfg)
    _check_reward_components(cfg)
    _check_policy_loss(cfg)
    _check_rollout_correction(cfg)
    check_router_replay(cfg)
    check_ulysses(cfg, plan)
    _check_distill(cfg, plan)
    _check_async(cfg, plan)
    _check_reward_model_strategy(cfg)
    if cfg.reward.launch_async:
        raise ConfigError(
            "reward.launch_async",
            "rewards are scored (in reward worker processes) before the log-prob phase, "
            "which needs the scores' batch; overlapping the two is not implemented",
            "set reward.launch_async=false",
        )
    if cfg.resources.ray.timeline_json_file and cfg.resources.backend != "ray":
        raise ConfigError(
            "resources.ray.timeline_json_file",
            "a Ray timeline records Ray's tasks; with resources.backend=local no Ray runs",
            "set resources.backend=ray, or remove it (experiment.profile_steps profiles "
            "the local backend)",
        )


def _check_async(cfg: TemperConfig, plan: Derived) -> None:
    """The rollout ahead of training (``async_training``) pushes the trainer's weights
    before every batch that needs a newer version; a checkpoint holds the actor's latest
    weights only, so a sync every N > 1 updates could not resume exactly. Streaming needs
    a pipeline that generates groups a chunk at a time, and one group per prompt."""
    _check_streaming(cfg, plan.shape.groups)
    if cfg.async_training.staleness > 0 and cfg.rollout.model_update_frequency != 1:
        raise ConfigError(
            "rollout.model_update_frequency",
            f"with the rollout ahead of training (async_training.staleness="
            f"{cfg.async_training.staleness}) batch s is generated with the weights after "
            "max(0, s - 1 - staleness) updates, pushed before it; a push every "
            f"{cfg.rollout.model_update_frequency} updates would need older weights than a "
            "checkpoint holds to resume exactly",
            "set rollout.model_update_frequency: 1 (raise async_training.staleness to let "
            "the rollout lag further)",
        )


def _check_streaming(cfg: TemperConfig, per_step: int) -> None:
    at = cfg.async_training
    if at.mode != "streaming":
        streaming_only = {
            "max_off_policy_strategy": (at.max_off_policy_strategy, "wait"),
            "stream_chunk": (at.stream_chunk, 0),
            "partial_rollout_segment": (at.partial_rollout_segment, 0),
            "max_ahead_batches": (at.max_ahead_batches, 0.0),
        }
        for name, (value, default) in streaming_only.items():
            if value != default:
                raise ConfigError(
                    f"async_training.{name}",
                    f"is read by async_training.mode: streaming only (mode is {at.mode})",
                    f"set async_training.mode: streaming, or remove async_training.{name}",
                )
        return
    if at.staleness < 1:
        raise ConfigError(
            "async_training.mode",
            "streaming hands groups to training while the rollout runs ahead of it; with "
            "async_training.staleness 0 nothing runs ahead",
            "set async_training.staleness >= 1 (1: at most one version behind), or mode: fixed",
        )
    if not resolve_pipeline(cfg.pipeline).streams:
        raise ConfigError(
            "async_training.mode",
            f"the {cfg.pipeline} pipeline produces whole batches only; streaming groups is "
            "built for the rlvr and agentic pipelines",
            "set async_training.mode: fixed (whole batches, the same staleness bound)",
        )
    if at.max_ahead_batches and not at.max_ahead_batches >= 1:
        raise ConfigError(
            "async_training.max_ahead_batches",
            f"{at.max_ahead_batches} batches ahead is less than the one batch the trainer "
            "takes next",
            "set it to 0 (no cap) or >= 1",
        )
    if at.stream_chunk > per_step:
        raise ConfigError(
            "async_training.stream_chunk",
            f"{at.stream_chunk} groups per generation call is more than the {per_step} a "
            "step trains on: the rollout could not start a chunk while the trainer waits",
            f"set async_training.stream_chunk <= {per_step} (0: a quarter)",
        )
    _check_partial_rollout(cfg)


def _check_partial_rollout(cfg: TemperConfig) -> None:
    """A partial rollout continues text responses (single-turn, multi-turn tool calls, env
    turns) through ``generate``; stop strings straddling a segment are not built (images:
    the VL env manager's own check)."""
    if cfg.async_training.partial_rollout_segment == 0:
        return
    key = "async_training.partial_rollout_segment"
    if cfg.rollout.stop:
        raise ConfigError(
            key,
            "the engine matches stop strings within one call's text, and a string could "
            "straddle two segments",
            "set it to 0, or stop on token ids (rollout.stop_token_ids) instead of rollout.stop",
        )


def _check_token_budgets(cfg: TemperConfig, plan: Derived) -> None:
    """A token-budget micro-batch holds at least one whole sample: as long as the
    pipeline's samples may be (its record's ``context``: a prompt and its response, an
    episode, an SFT sequence) — for the roles the run has (a critic's budget is read only
    when there is a critic)."""
    context = resolve_pipeline(cfg.pipeline).context(cfg, [])
    if context is None:  # nothing bounds a sample here (an episode without max_model_len)
        return
    seq, keys, what = context
    for key in ("actor", "critic") if plan.use_critic else ("actor",):
        engine = getattr(cfg, key)
        budget = engine.max_token_len_per_device
        if engine.use_dynamic_bsz and budget < seq:
            # the bound in numbers: verl counts the budget per sequence-parallel rank, and
            # its fix is restated so (dialects.in_dialect.SCALES)
            raise ConfigError(
                f"{key}.max_token_len_per_device",
                f"a token budget of {budget} cannot hold {what} of "
                f"up to {seq} tokens ({' + '.join(k.split('.')[-1] for k in keys)})",
                f"raise it to {BOUND}",
                bound=Bound("at_least", seq, budget),
            )


def _check_pipeline_sections(cfg: TemperConfig) -> None:
    """A section only some pipelines read (``agentic``), set under a pipeline that does
    not declare it, is refused — it would be read by nothing."""
    reads = resolve_pipeline(cfg.pipeline).sections
    default = TemperConfig()
    for f in dataclasses.fields(cfg):
        owners = [n for n in PIPELINES.primary_names() if f.name in PIPELINES.get(n).sections]
        if not owners or f.name in reads:
            continue
        if to_dict(getattr(cfg, f.name)) != to_dict(getattr(default, f.name)):
            raise ConfigError(
                f.name,
                f"the {f.name} section configures the {' or '.join(owners)} pipeline; "
                f"pipeline {cfg.pipeline} does not read it",
                f"remove it, or set pipeline: {owners[0]}",
            )


#: Estimator inputs the driver computes itself: a critic's values (validation refuses a
#: disabled critic for an estimator that needs one), the old log-probs and the actor's
#: Σπ² per token (from the same forward; validation refuses it turned off).
DRIVER_INPUTS = frozenset({"values", "old_log_probs", "sum_pi_squared"})

#: What an estimator input is, for the refusal of one the run's pipeline does not provide.
ESTIMATOR_INPUTS = {
    "baseline_rewards": "the reward of a greedy response to each prompt",
    "reward_components": "the reward function's named components of each sample",
    "step_rewards": "the env reward of each env step, one sample per step",
    "episode_index": "the episode of each step sample",
    "step_index": "the position of each step sample in its episode",
    "anchor_index": "the state each step sample started from",
}
#: How a run gets an estimator input its pipeline gives only in some configurations.
FIXES = {
    k: "set agentic.env_manager: step (the agentic pipeline, one sample per env step)"
    for k in ("step_rewards", "episode_index", "step_index", "anchor_index")
}


def _check_estimator_params(cfg: TemperConfig) -> None:
    """A parameter only one estimator reads (``Estimator.reads``: SPPO's ``sppo_beta``),
    set away from its default while another estimator runs, would be read by nothing."""
    algo = cfg.algorithm
    chosen = estimator_params(algo.adv_estimator)
    defaults = type(algo)()
    for param, owner in sorted(own_params().items()):
        if param not in chosen and getattr(algo, param) != getattr(defaults, param):
            raise ConfigError(
                f"algorithm.{param}",
                f"only adv_estimator {owner} reads it; adv_estimator {algo.adv_estimator} does not",
                f"remove it, or set algorithm.adv_estimator: {owner}",
            )


def _check_estimator_inputs(cfg: TemperConfig) -> None:
    """An estimator needs inputs (``Estimator.needs``) the driver or the pipeline's
    producer must put in the batch (``Pipeline.provides``)."""
    name = cfg.algorithm.adv_estimator
    pipeline = resolve_pipeline(cfg.pipeline)
    missing = (
        estimator_inputs(name) - DRIVER_INPUTS - pipeline.provides - pipeline.provides_for(cfg)
    )
    if missing:
        what = "; ".join(f"{m} ({ESTIMATOR_INPUTS.get(m, 'an input')})" for m in sorted(missing))
        fixes = sorted({FIXES[m] for m in missing if m in FIXES})
        raise ConfigError(
            "algorithm.adv_estimator",
            f"{name} needs {what}; a run of pipeline {cfg.pipeline} does not provide it",
            "; ".join(fixes)
            if fixes
            else "choose an estimator this pipeline provides for (grpo, rloo, gae, …)",
        )


def _check_reward_model_strategy(cfg: TemperConfig) -> None:
    """The reward model scores on one of the strategies that serve one: in the driver on
    the local backend, on the Ray backend's ``reward`` group (:mod:`temper.roles.reward_model`)."""
    rm = cfg.reward.model
    uses = resolve_pipeline(cfg.pipeline).uses
    if rm.enable and ROLLOUT in uses and REWARD_MODEL not in uses:  # (eval says its own)
        raise ConfigError(
            "reward.model.enable",
            f"pipeline {cfg.pipeline} does not score samples with a reward model (its "
            "rewards come from elsewhere: environments, preference pairs, a teacher), so "
            "the model would be read by nothing",
            "remove reward.model (an agentic env scores its own episodes; reward.judge "
            "grades them for envs that ask a judge)",
        )
    if rm.enable and rm.strategy not in REWARD_MODEL_STRATEGIES:
        raise ConfigError(
            "reward.model.strategy",
            f"'{rm.strategy}' does not serve a reward model",
            f"use one of {', '.join(REWARD_MODEL_STRATEGIES)}",
        )


def _check_reward_components(cfg: TemperConfig) -> None:
    """An estimator of reward components (GDPO) reads the reward function's components
    alone: what shapes the summed reward (step 1-6 of the shaping phase) would not reach
    its advantages."""
    algo, reward = cfg.algorithm, cfg.reward
    if REWARD_COMPONENTS not in estimator_inputs(algo.adv_estimator):
        return
    shaping = (
        ("algorithm.use_kl_in_reward", algo.use_kl_in_reward),
        ("algorithm.whiten_rewards", algo.whiten_rewards),
        ("algorithm.reward_norm", algo.reward_norm != "none"),
        ("algorithm.use_reward_scaling", algo.use_reward_scaling),
        ("algorithm.reward_clip", algo.reward_clip is not None),
        ("algorithm.overlong_buffer.enable", algo.overlong_buffer.enable),
        ("algorithm.add_len_reward", algo.add_len_reward),
        ("reward.format_penalty", bool(reward.format_penalty)),
        ("reward.model.enable", reward.model.enable),
    )
    for key, on in shaping:
        if on:
            raise ConfigError(
                key,
                f"shapes the summed reward, but adv_estimator {algo.adv_estimator} computes "
                "advantages from the reward components (algorithm.gdpo_reward_keys) alone",
                f"remove {key}, or return its effect as a component of the reward function",
            )


def _check_policy_loss(cfg: TemperConfig) -> None:
    """The policy loss's parameters, as the actor will build them, and what the loss
    itself requires of them (``dro`` a ``dro_beta``)."""
    params = policy_loss_params(cfg.actor)
    try:
        check_policy_loss(cfg.actor.policy_loss, params)
    except PolicyLossParamError as err:
        key = f"actor.policy_loss_kwargs.{err.param}"
        raise ConfigError(key, str(err), f"set {key} to {err.want}") from err


def _check_rollout_correction(cfg: TemperConfig) -> None:
    """Rollout IS weights compare the trainer's old log-probs with the rollout engine's;
    without a recompute they are the engine's own: every weight would be 1. (Rejection
    sampling then compares the current policy with the rollout's before each
    mini-batch's update, as verl's bypass mode does: :class:`temper.roles.actor.Actor`.)"""
    full_kl = cfg.algorithm.use_kl_in_reward and kl_estimator_needs_logits(cfg.algorithm.kl_penalty)
    if cfg.actor.rollout_is_batch_normalize and cfg.actor.rollout_is == "none":
        raise ConfigError(
            "actor.rollout_is_batch_normalize",
            "normalizes the rollout IS weights, but actor.rollout_is is none",
            "set actor.rollout_is (token or sequence), or set it false (the reinforce_is "
            "loss normalizes its own weights with actor.policy_loss_kwargs."
            "reinforce_is_batch_normalize)",
        )
    if cfg.actor.recompute_old_log_prob or full_kl:
        return
    if cfg.actor.rollout_is != "none":
        raise ConfigError(
            "actor.rollout_is",
            "with actor.recompute_old_log_prob false the old log-probs are the rollout "
            "engine's, so every importance weight would be 1",
            "set actor.recompute_old_log_prob=true, or actor.rollout_is=none (the "
            "reinforce_is policy loss weighs by the current policy instead)",
        )


CHECKPOINT_PARTS = ("model", "optimizer", "extra")
HF_PARTS = ("hf", "hf_model")


def _check_distill(cfg: TemperConfig, plan: Derived) -> None:
    """On-policy distillation's teachers: what their signal and placement can honour."""
    teachers = cfg.distill.teachers
    if not teachers:
        return
    if kl_estimator_needs_logits(cfg.distill.kl_penalty):
        raise ConfigError(
            "distill.kl_penalty",
            f"'{cfg.distill.kl_penalty}' needs the logits of both models; the teachers' "
            "signal is estimated on the sampled tokens' log-probs",
            "use kl, abs, mse or low_var_kl",
        )
    _check_direct_distill(cfg)
    if cfg.distill.pure and plan.use_critic:
        raise ConfigError(
            "distill.pure",
            f"pure distillation's advantage is the teachers' signal, so the critic of "
            f"adv_estimator {cfg.algorithm.adv_estimator} would be trained on nothing the "
            "update uses",
            "use an estimator without a critic (reinforce, grpo), or distill.pure: false",
        )


def _check_direct_distill(cfg: TemperConfig) -> None:
    """The direct-gradient (GKD) term: an estimator whose gradient sees the teacher, and
    the top-k forward KL only as a loss term."""
    d = cfg.distill
    if d.topk < 0:
        raise ConfigError("distill.topk", f"{d.topk} is negative", "use 0 or a positive k")
    if d.topk and not d.direct_gradient:
        raise ConfigError(
            "distill.topk",
            "the top-k forward KL is built as a direct gradient only: as an advantage only "
            "the sampled token's log-prob would carry it, and the other top-k tokens' "
            "signal would be lost",
            "set distill.direct_gradient: true, or distill.topk: 0",
        )
    if d.direct_gradient and not d.topk and not direct_gradient_estimator_ok(d.kl_penalty):
        raise ConfigError(
            "distill.kl_penalty",
            f"'{d.kl_penalty}' (log π − log π_t) as a direct gradient is ∇ log π alone: it "
            "does not depend on the teacher",
            "use abs, mse/k2 or low_var_kl/k3 with distill.direct_gradient, or "
            "distill.direct_gradient: false",
        )


def _check_checkpoint_contents(role: str, contents: list[str]) -> None:
    """temper's checkpoints are always resumable (model, optimizer, extra = RNG, sampler,
    schedule) and always include the Hugging Face export ('hf' asks for what is there)."""
    key = f"{role}.checkpoint_contents"
    unknown = [c for c in contents if c not in (*CHECKPOINT_PARTS, *HF_PARTS)]
    if unknown:
        raise ConfigError(
            key,
            f"{unknown} are not checkpoint parts",
            f"use {', '.join(CHECKPOINT_PARTS)} and optionally hf",
        )
    missing = [c for c in CHECKPOINT_PARTS if c not in contents]
    if missing:
        raise ConfigError(
            key,
            f"checkpoints without {', '.join(missing)} could not resume exactly; temper's "
            "always hold the model, optimizer and extra state (and the HF export)",
            f"set it to [{', '.join(CHECKPOINT_PARTS)}] (plus hf if you like)",
        )


def _check_reward_normalization(cfg: TemperConfig) -> None:
    algo = cfg.algorithm
    if algo.use_reward_norm and not algo.use_reward_scaling:
        raise ConfigError(
            "algorithm.use_reward_norm",
            "subtracts the running mean as part of reward scaling (ROLL: 'only applicable "
            "if use_reward_scaling is True')",
            "set algorithm.use_reward_scaling=true too, or algorithm.reward_norm=running instead",
        )
    if algo.use_reward_scaling and algo.reward_norm != "none":
        raise ConfigError(
            "algorithm.use_reward_scaling",
            f"normalizes rewards by running statistics, and reward_norm={algo.reward_norm} "
            "normalizes them again",
            "keep one: reward_norm: running with reward_scale: true is the same scaling",
        )


def _check_dynamic_sampling(cfg: TemperConfig) -> None:
    fg, data = cfg.algorithm.filter_groups, cfg.data
    if fg.metric not in FILTER_METRICS:
        raise ConfigError(
            "algorithm.filter_groups.metric",
            f"'{fg.metric}' is not a per-sample value the filter can read",
            f"use one of: {', '.join(FILTER_METRICS)}",
        )
    if data.gen_batch_size is None:
        return
    if not fg.enable and data.gen_batch_size != data.train_batch_size:
        raise ConfigError(
            "data.gen_batch_size",
            f"{data.gen_batch_size} prompts per generation round, but without dynamic "
            f"sampling a step trains on the first round's train_batch_size "
            f"({data.train_batch_size}) prompts",
            "set algorithm.filter_groups.enable: true, or remove data.gen_batch_size",
        )
    if data.gen_batch_size < data.train_batch_size:
        raise ConfigError(
            "data.gen_batch_size",
            f"{data.gen_batch_size} prompts per generation round are fewer than the "
            f"{data.train_batch_size} groups a step trains on",
            f"set it ≥ data.train_batch_size ({data.train_batch_size})",
        )


def _check_full_kl(cfg: TemperConfig) -> None:
    """The exact KL needs the reference's logits next to the actor's, micro-batch by
    micro-batch, in the actor's process."""
    algo, actor = cfg.algorithm, cfg.actor
    keys = []
    if algo.use_kl_in_reward and kl_estimator_needs_logits(algo.kl_penalty):
        keys.append("algorithm.kl_penalty")
    if actor.use_kl_loss and kl_estimator_needs_logits(actor.kl_loss_type):
        keys.append("actor.kl_loss_type")
    if keys and cfg.resources.backend == "ray":
        raise ConfigError(
            keys[0],
            "the exact KL over the vocabulary ('full') needs the reference's logits in the "
            "actor's process for every micro-batch; on the ray backend the reference is "
            "another worker group",
            "use resources.backend=local, or a sampled estimator (low_var_kl, kl, mse)",
        )
    for role in ("actor", "reference"):
        if keys and getattr(cfg, role).strategy == "megatron":
            raise ConfigError(
                keys[0],
                "the exact KL over the vocabulary ('full') compares logits in the Hugging "
                f"Face engines' forward; the megatron engine ({role}.strategy) does not",
                f"use {role}.strategy torch, fsdp2 or deepspeed, or a sampled estimator "
                "(low_var_kl, kl, mse)",
            )
