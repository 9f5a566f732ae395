"""ROLL's policy-gradient worker (``actor_train.pg_variant``) -> ``actor.policy_loss``.

ROLL reads ``pg_variant`` only in its policy-gradient actor workers
(``roll/pipeline/rlvr/actor_pg_worker.py``, ``roll/pipeline/agentic/agentic_actor_pg_worker.py``),
chosen with ``actor_train.worker_cls``; its other actor workers run the PPO loss and
ignore it. Per variant (``ratio r = π_θ/π_old``, ``sg`` = stop-gradient), ROLL's token
loss and temper's loss with the same formula:

=========  ==========================================================  =================
variant    ROLL's token loss                                           temper
=========  ==========================================================  =================
vanilla    ``-A·log π_θ`` (the default)                                ``gpg``
ppo        PPO clip (+ ``dual_clip_loss``), as ROLL's PPO worker       ``vanilla``
tis        ``-sg[clip(r, 0, 1)]·A·log π_θ``                            ``cispo``, ε_low 1,
                                                                       ε_high 0
cispo      ``-sg[clip(r, 0.9, 1.1)]·A·log π_θ``                        ``cispo``, ε 0.1
kimi15     ``-A·log π_θ + τ/2·(log π_θ - log π_old)²``, τ = 0.1        ``dro``, β = 0.1
topr       samples with score > 0 ``-w₊·A·log π_θ``, the others        ``topr_score``
           ``-w₋·sg[clip(r, 0, 1)]·A·log π_θ`` (split by the sample's
           score, not by the advantage's sign as temper's ``topr``)
=========  ==========================================================  =================

The variants' parameters (``tis_lower_bound``/``tis_upper_bound``, ``cispo_epsilon_low``/
``cispo_epsilon_high``/``cispo_use_unified_mask``, ``kimi15_tau``) are read with
``getattr(actor_train, key, default)``, but (unlike ``topr_positive_weight`` /
``topr_negative_weight``, ``w₊``/``w₋``) they are not fields of ROLL's
``WorkerConfig``, and its loader (dacite, not strict) drops them: the defaults above are
what ROLL runs. A file that sets one to another value is refused (:data:`PARAM_RULES`).
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core.derivation import derivation
from temper.config.dialects.core.rules import Refuse
from temper.config.errors import ConfigError

KEY = "actor_train.pg_variant"
PG_WORKERS = frozenset(
    {
        "roll.pipeline.rlvr.actor_pg_worker.ActorPGWorker",
        "roll.pipeline.agentic.agentic_actor_pg_worker.ActorWorker",
    }
)
# ROLL's built-in values of the variants' parameters (what its workers' getattr returns).
DEFAULTS: dict[str, Any] = {
    "tis_lower_bound": 0.0,
    "tis_upper_bound": 1.0,
    "cispo_epsilon_low": 0.1,
    "cispo_epsilon_high": 0.1,
    "cispo_use_unified_mask": False,
    "kimi15_tau": 0.1,
}
# variant -> (temper policy loss, actor keys, policy_loss_kwargs)
_LOSSES: dict[str, tuple[str, dict[str, float], dict[str, Any]]] = {
    "vanilla": ("gpg", {}, {}),
    "ppo": ("vanilla", {}, {}),
    "tis": (
        "cispo",
        {
            "clip_ratio_low": 1.0 - DEFAULTS["tis_lower_bound"],
            "clip_ratio_high": DEFAULTS["tis_upper_bound"] - 1.0,
        },
        {},
    ),
    "cispo": (
        "cispo",
        {
            "clip_ratio_low": DEFAULTS["cispo_epsilon_low"],
            "clip_ratio_high": DEFAULTS["cispo_epsilon_high"],
        },
        {},
    ),
    "kimi15": ("dro", {}, {"dro_beta": DEFAULTS["kimi15_tau"]}),
    "topr": ("topr_score", {}, {}),  # + topr_positive_weight / topr_negative_weight
}
# PPO-only keys that a non-ppo variant does not read
_PPO_KEYS = ("pg_clip", "dual_clip_loss", "use_pg_clip_range", "pg_clip_low", "pg_clip_high")


def _param_rule(name: str, default: Any) -> Refuse:
    return Refuse(
        f"not a field of ROLL's WorkerConfig: ROLL's loader drops it and its "
        f"policy-gradient worker uses {default!r}",
        f"remove it (temper, like ROLL, uses {default!r})",
        ok=lambda v, _ctx: v is None or v == default,
        why=f"ROLL's built-in value {default!r}",
    )


PARAM_RULES = {name: _param_rule(name, default) for name, default in DEFAULTS.items()}


@derivation(
    "actor_train.pg_variant",
    "actor_train.worker_cls",
    "actor_train.topr_{side}_weight",
    "pg_clip",
    "dual_clip_loss",
    "use_pg_clip_range",
    "pg_clip_low",
    "pg_clip_high",
    side=("positive", "negative"),
    fields=("actor.policy_loss",),
)
def pg_variant(ctx: Any) -> None:
    """Set ``actor.policy_loss`` (and its parameters) from ROLL's PG worker's variant."""
    variant = ctx.get(KEY)
    cls = ctx.get("actor_train.worker_cls")
    if cls not in PG_WORKERS:
        if variant is not None:
            ctx.inert(
                "read by ROLL's policy-gradient workers only (actor_train.worker_cls "
                "roll.pipeline.rlvr.actor_pg_worker.ActorPGWorker); this file's actor "
                "runs the PPO loss",
                KEY,
            )
        return
    src = KEY if ctx.has(KEY) else "actor_train.worker_cls"
    variant = "vanilla" if variant is None else variant
    if variant not in _LOSSES:
        valid = ", ".join(sorted(_LOSSES))
        raise ConfigError(KEY, f"'{variant}' is not one of ROLL's variants", f"use one of: {valid}")
    loss, actor, kwargs = _LOSSES[variant]
    if ctx.out.source("actor.policy_loss") == "importance_sampling":  # the PPO worker's key
        ctx.inert("ROLL's policy-gradient workers do not read it", "importance_sampling")
        ctx.replace("actor.policy_loss", loss, src)
    else:
        ctx.write("actor.policy_loss", loss, src)
    if variant == "ppo":
        return
    for key in _PPO_KEYS:
        if ctx.has(key):
            ctx.inert(f"pg_variant {variant} has no PPO clip", key)
    for name, value in actor.items():  # the variant's bounds replace PPO's clip range
        ctx.replace(f"actor.{name}", value, src)
    for name, value in kwargs.items():
        ctx.write(f"actor.policy_loss_kwargs.{name}", value, src)
    if variant == "topr":  # WorkerConfig fields, read by the PG worker
        for side in ("positive", "negative"):
            key = f"actor_train.topr_{side}_weight"
            weight = ctx.get(key, 1.0)
            ctx.write(f"actor.policy_loss_kwargs.topr_{side}_weight", float(weight), key)
