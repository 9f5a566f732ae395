"""verl 0.9's ``distillation`` section (``verl/trainer/config/distillation``) → the native
``distill`` section: on-policy distillation in verl's PPO trainer.

What verl computes, and what temper builds of it:

- ``enabled: false`` (every PPO file of the 2026-08 snapshot composes the section so): the
  rest is read by nothing;
- ``distillation_loss.use_policy_gradient: true``: the per-token distillation loss of an
  estimator ``loss_mode`` (``kl``/``k1``, ``abs``, ``mse``/``k2``, ``low_var_kl``/``k3``,
  after ``loss_max_clamp``) is the negative advantage of a
  policy-gradient loss — temper's ``distill.kl_penalty`` and its cap. With
  ``use_task_rewards: false`` that is the whole loss (``distill.pure``); with ``true`` the
  task's PPO loss (with its KL loss and entropy bonus, which pure mode drops: they must
  be off) is added, the distillation term weighted by ``distillation_loss_coef``
  (temper subtracts ``coef × KL`` from the task advantage: one clipped loss instead of two,
  the same gradient while the ratio is inside the clip range);
- ``use_policy_gradient: false`` (verl's default; GKD, the distillation loss as a direct
  gradient term): the per-token loss is differentiated through the student's log-probs,
  aggregated with the actor's ``loss_agg_mode`` and added to the actor's loss —
  ``distill.direct_gradient``; the whole loss without task rewards (the advantage is 0),
  ``distillation_loss_coef`` times it beside the task's PPO loss with them. Its loss is a
  sampled-token estimator (``kl``/``k1`` refused, as verl refuses it: its gradient does not
  see the teacher) or ``forward_kl_topk``, the forward KL over the teachers' ``topk`` most
  likely tokens (``distill.topk``; both models' log-probs floored at
  ``log_prob_min_clamp``, the sum at 0), which temper builds as a direct gradient only
  (verl warns that as a policy gradient it moves the sampled token alone);
- in both modes the per-token loss is capped at ``±loss_max_clamp``, and verl's
  sampled-token estimators read no ``log_prob_min_clamp`` (only the top-k loss does), so
  the translation writes it only for ``forward_kl_topk``; ``policy_loss_mode`` other than
  vanilla is refused, as verl refuses it;
- ``teacher_models.<name>``: ``model_path`` and ``key`` (the value of the sample's
  ``teacher_key`` field it takes: temper routes by ``data.tag_key``); verl drops the
  default ``teacher_model`` entry when others are added, and so does this translation;
  ``num_replicas`` and ``inference.*`` configure verl's teacher inference servers — here a
  teacher is a forward-only engine built as the reference's;
- ``nnodes`` / ``n_gpus_per_node``: verl's teacher resource pool of its own (``nnodes >
  0``) becomes ``resources.reference``, device ids after the trainer's (temper places the
  teachers, and a reference, there; Ray backend); ``nnodes: 0`` puts the teachers on the
  trainer's devices.
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core.derivation import derivation
from temper.config.dialects.core.rules import Call, Rule
from temper.config.errors import ConfigError

SECTION = "distillation"
LOSS = f"{SECTION}.distillation_loss"
ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
TOPK_MODE = "forward_kl_topk"  # the forward KL over the teachers' top-k log-probs
CHUNKED = ("use_chunked_topk", "chunked_topk_chunk_size")
DEFAULT_TEACHER = "teacher_model"  # verl pops it when other teachers are added
SERVED = (
    "configures verl's teacher inference server; here a teacher is a forward-only engine "
    "built as the reference's (reference.strategy)"
)


def _off(section: dict[str, Any], ctx: Any) -> None:
    ctx.note("no effect here (distillation.enabled is false)", SECTION)


def _teachers(section: dict[str, Any], ctx: Any) -> dict[str, dict[str, Any]]:
    models = dict(section.get("teacher_models") or {})
    if len(models) > 1 and DEFAULT_TEACHER in models:
        models.pop(DEFAULT_TEACHER)
        ctx.note(
            "dropped, as verl drops it when other teachers are added",
            f"{SECTION}.teacher_models.{DEFAULT_TEACHER}",
        )
    if not models:
        raise ConfigError(
            f"{SECTION}.teacher_models",
            "distillation is enabled without a teacher",
            f"set {SECTION}.teacher_models.{DEFAULT_TEACHER}.model_path",
        )
    for name, teacher in models.items():
        key = f"{SECTION}.teacher_models.{name}"
        if not isinstance(teacher, dict) or not teacher.get("model_path"):
            raise ConfigError(
                f"{key}.model_path", "a teacher needs its model", "set it to a model path"
            )
        for k in teacher:
            if k in ("num_replicas", "inference"):
                ctx.note(SERVED, f"{key}.{k}")
            elif k == "_target_":
                ctx.note("verl's dataclass target; no effect here", f"{key}.{k}")
            elif k not in ("model_path", "key"):
                raise ConfigError(f"{key}.{k}", "unknown verl key", "remove it")
    return models


def _loss(section: dict[str, Any], ctx: Any) -> float:
    """The loss section's writes; returns each teacher's coefficient (a ConfigError for
    what is not built, and for what verl itself refuses)."""
    loss = section.get("distillation_loss") or {}
    mode = loss.get("loss_mode", "k3")
    if mode not in (*ESTIMATORS, TOPK_MODE):
        raise ConfigError(
            f"{LOSS}.loss_mode",
            f"'{mode}' is not one of verl's distillation losses",
            f"use one of: {', '.join((*ESTIMATORS, TOPK_MODE))}",
        )
    if loss.get("policy_loss_mode", "vanilla") != "vanilla":  # verl refuses it in any mode
        raise ConfigError(
            f"{LOSS}.policy_loss_mode",
            "verl builds the distillation policy loss with vanilla only",
            "set it to vanilla",
        )
    if loss.get("use_policy_gradient", False):
        _policy_gradient(loss, mode, ctx)
    else:
        _direct_gradient(loss, mode, ctx)
    pure = not loss.get("use_task_rewards", True)
    actor = "actor_rollout_ref.actor"
    if pure and (ctx.get(f"{actor}.use_kl_loss", False) or ctx.get(f"{actor}.entropy_coeff", 0)):
        raise ConfigError(
            f"{LOSS}.use_task_rewards",
            "without task rewards verl drops the actor's whole PPO loss, its KL loss and "
            "entropy bonus with it; temper would keep them",
            f"set {actor}.use_kl_loss=false and {actor}.entropy_coeff=0, or use_task_rewards=true",
        )
    coef = float(loss.get("distillation_loss_coef", 1.0))
    ctx.write("distill.pure", pure, f"{LOSS}.use_task_rewards")
    ctx.write("distill.loss_max_clamp", loss.get("loss_max_clamp"), LOSS)
    if mode == TOPK_MODE:
        ctx.write("distill.log_prob_min_clamp", loss.get("log_prob_min_clamp"), LOSS)
    elif loss.get("log_prob_min_clamp") is not None:
        ctx.note(
            "no effect here, as in verl: its sampled-token estimators do not clamp the "
            f"log-probs (loss_mode is {mode})",
            f"{LOSS}.log_prob_min_clamp",
        )
    if pure and "distillation_loss_coef" in loss:
        ctx.note(
            "no effect here (verl reads it only with use_task_rewards)",
            f"{LOSS}.distillation_loss_coef",
        )
    for k in CHUNKED:
        if k in loss:
            ctx.note("verl's memory/speed trade for the top-k loss; no effect here", f"{LOSS}.{k}")
    for k in loss:
        if k not in KNOWN_LOSS_KEYS:
            raise ConfigError(f"{LOSS}.{k}", "unknown verl key", "remove it")
    return 1.0 if pure else coef


def _policy_gradient(loss: dict[str, Any], mode: str, ctx: Any) -> None:
    """``use_policy_gradient: true``: the estimator's negative as the advantage of the
    actor's clipped loss (distill.kl_penalty)."""
    if mode == TOPK_MODE:
        raise ConfigError(
            f"{LOSS}.use_policy_gradient",
            f"{TOPK_MODE} as a policy gradient moves only the sampled token's log-prob (verl "
            "warns that the other top-k tokens' signal is lost); temper builds it as a "
            "direct gradient only",
            f"set {LOSS}.use_policy_gradient=false",
        )
    for k in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
        actor = ctx.get(f"actor_rollout_ref.actor.{k}", 0.2)
        if k in loss and loss[k] != actor:
            raise ConfigError(
                f"{LOSS}.{k}",
                f"{loss[k]} differs from actor_rollout_ref.actor.{k} ({actor}); the "
                "distillation term shares the actor's clipped loss here",
                f"give both the same value, {actor}",
            )
    ctx.write("distill.kl_penalty", mode, f"{LOSS}.loss_mode")
    if "topk" in loss:
        ctx.note(f"no effect here (read by {TOPK_MODE}; loss_mode is {mode})", f"{LOSS}.topk")


def _direct_gradient(loss: dict[str, Any], mode: str, ctx: Any) -> None:
    """``use_policy_gradient: false`` (verl's default; GKD): the loss differentiated
    through the student (distill.direct_gradient), on the sampled token or over the
    teacher's top-k tokens (distill.topk)."""
    if mode in ("kl", "k1"):  # verl refuses it: ∇(log π − log π_t) = ∇ log π
        raise ConfigError(
            f"{LOSS}.loss_mode",
            f"backpropagating {mode} directly is wrong: its gradient with respect to the "
            "student does not depend on the teacher's log-probs",
            f"use low_var_kl/k3 or {TOPK_MODE} with use_policy_gradient=false, or set "
            f"{LOSS}.use_policy_gradient=true",
        )
    ctx.write("distill.direct_gradient", True, f"{LOSS}.use_policy_gradient")
    if mode == TOPK_MODE:
        topk = loss.get("topk", 32)
        if topk is None or int(topk) <= 0:
            raise ConfigError(
                f"{LOSS}.topk",
                f"{TOPK_MODE} needs the number of the teachers' top tokens",
                "set it to a positive k (verl's default is 32)",
            )
        ctx.write("distill.topk", int(topk), f"{LOSS}.topk")
    else:
        ctx.write("distill.kl_penalty", mode, f"{LOSS}.loss_mode")
        if "topk" in loss:
            ctx.note(f"no effect here (read by {TOPK_MODE}; loss_mode is {mode})", f"{LOSS}.topk")
    for k in ("clip_ratio", "clip_ratio_low", "clip_ratio_high"):
        if k in loss:
            ctx.note("no effect here (verl reads it only with use_policy_gradient)", f"{LOSS}.{k}")


def check_topk_server(teacher: dict[str, Any], key: str, topk: int) -> None:
    """verl's own checks of a teacher's inference server for the top-k loss: vLLM or
    SGLang, and vLLM's ``max_logprobs`` (when set) at least ``topk``."""
    inference = teacher.get("inference") or {}
    name = inference.get("name", "vllm")
    if name not in ("vllm", "sglang"):
        raise ConfigError(
            f"{key}.inference.name",
            f"verl serves a teacher's top-k log-probs with vllm or sglang, not {name}",
            "set it to vllm or sglang",
        )
    kwargs = (inference.get("engine_kwargs") or {}).get("vllm") or {}
    limit = kwargs.get("max_logprobs")
    if name == "vllm" and limit is not None and int(limit) < topk:
        raise ConfigError(
            f"{key}.inference.engine_kwargs.vllm.max_logprobs",
            f"vLLM's max_logprobs ({limit}) is below {LOSS}.topk ({topk})",
            f"raise it to at least {topk}, or leave it unset",
        )


KNOWN_LOSS_KEYS = (
    "_target_",
    "loss_mode",
    "topk",
    "use_task_rewards",
    "distillation_loss_coef",
    "loss_max_clamp",
    "log_prob_min_clamp",
    "use_policy_gradient",
    "policy_loss_mode",
    "clip_ratio",
    "clip_ratio_low",
    "clip_ratio_high",
    *CHUNKED,
)
KNOWN = (
    "_target_",
    "enabled",
    "distillation_loss",
    "n_gpus_per_node",
    "nnodes",
    "teacher_models",
    "teacher_key",
)


def distillation(section: Any, ctx: Any) -> None:
    """verl 0.9's on-policy distillation: off, read by nothing; on, policy-gradient OPD
    or the direct-gradient (GKD) loss becomes the distill section (module docstring)."""
    if not isinstance(section, dict):
        raise ConfigError(SECTION, "must be a mapping", "see verl's distillation.yaml")
    for k in section:
        if k not in KNOWN:
            raise ConfigError(f"{SECTION}.{k}", "unknown verl key", "remove it")
    if not section.get("enabled", False):
        _off(section, ctx)
        return
    if (section.get("nnodes") or 0) > 0:  # placed in the final pass (finish)
        ctx.note("the teachers' own pool: resources.reference (see the placement note)")
    else:
        ctx.note(
            "the teachers share the actor's devices (nnodes is 0)", f"{SECTION}.n_gpus_per_node"
        )
    coef = _loss(section, ctx)
    loss = section.get("distillation_loss") or {}
    for name, teacher in _teachers(section, ctx).items():
        key = f"{SECTION}.teacher_models.{name}"
        if loss.get("loss_mode", "k3") == TOPK_MODE:
            check_topk_server(teacher, key, int(loss.get("topk", 32)))
        ctx.write(f"distill.teachers.{name}.model_path", teacher["model_path"], f"{key}.model_path")
        ctx.write(f"distill.teachers.{name}.kl_coef", coef, f"{LOSS}.distillation_loss_coef")
        tag = teacher.get("key")
        ctx.write(f"distill.teachers.{name}.tags", [] if tag is None else [str(tag)], f"{key}.key")
    ctx.write("data.tag_key", section.get("teacher_key", "data_source"), f"{SECTION}.teacher_key")


@derivation(f"{SECTION}.enabled", f"{SECTION}.nnodes")
def finish(ctx: Any) -> None:
    """The final pass: the teachers' own pool (``distillation.nnodes`` > 0) beside the
    trainer's, as ``resources.reference`` (temper places teachers on the reference's
    devices) — after the trainer's pool is counted."""
    section = ctx.get(SECTION)
    if not isinstance(section, dict) or not section.get("enabled", False):
        return
    if (section.get("nnodes") or 0) > 0:
        from temper.config.dialects.verl.asynchronous import separate_pool

        separate_pool(
            ctx,
            f"{SECTION}.nnodes",
            f"{SECTION}.n_gpus_per_node",
            "on-policy distillation",
            pool="teachers",
            role="resources.reference",
        )


RULES: dict[str, Rule] = {SECTION: Call(distillation)}
