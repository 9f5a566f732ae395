"""verl's rejection sampling (``algorithm.rollout_correction.rollout_rs`` with
``rollout_rs_threshold``) -> ``actor.rollout_rs``.

verl (``verl/trainer/ppo/rollout_corr_helper.py``, ``compute_rollout_rejection_mask``)
takes ``lr_t = clamp(log π_old − log π_rollout, ±20)`` and, per comma-separated option,
a divergence per token — ``k1 = −lr_t``, ``k2 = ½·lr_t²``, ``k3 = exp(lr_t) − 1 − lr_t`` —
at ``token`` level or as the sequence's ``seq_sum`` / ``seq_mean`` / ``seq_max`` (k2, k3
only). A ``k1`` option keeps ``log lo ≤ k1 ≤ log hi`` (threshold ``"lo_hi"``, or ``hi``
with ``lo = 1/hi``): ``π_rollout/π_old = exp(k1)`` in ``[lo, hi]``, so temper's ratio
``ρ = π_old/π_rollout`` (``stat: ratio``) in ``[1/hi, 1/lo]`` (the same up to the
rounding of the bounds); a k2/k3 option keeps ``value ≤ hi``.
One threshold serves every option, or one per option. A token failing any option leaves
``response_mask``.

verl rejects before it computes the advantages, temper after them (in the actor, as
ROLL): the advantages of the kept tokens are the same when they do not read the mask —
``grpo`` and ``rloo`` (a score per response, broadcast) — and no critic trains on it.
Other estimators are refused.
"""

from __future__ import annotations

from typing import Any

MODES = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)
_LEVELS = {"token": "token", "seq_sum": "sequence_sum", "seq_mean": "sequence_mean"}
_LEVELS["seq_max"] = "sequence_max"
ESTIMATORS = ("grpo", "rloo")  # advantages of kept tokens do not read the mask
RC = "algorithm.rollout_correction"


def _threshold_specs(options: list[str], spec: Any, ctx: Any) -> list[str]:
    if isinstance(spec, bool) or not isinstance(spec, int | float | str):
        raise ctx.error(
            f"rollout_rs_threshold must be a number or a string, got {spec!r}", "e.g. '2.0'"
        )
    specs = [spec] if not isinstance(spec, str) else [s.strip() for s in spec.split(",")]
    specs = [str(s) for s in specs if str(s)]
    if len(specs) not in (1, len(options)):
        raise ctx.error(
            f"{len(specs)} thresholds for {len(options)} rollout_rs options",
            "give one threshold for all options, or one per option",
        )
    return specs * len(options) if len(specs) == 1 else specs


def _filter(option: str, spec: str, ctx: Any) -> dict[str, Any]:
    prefix, kind = option.rsplit("_", 1)
    level = _LEVELS[prefix]
    try:
        if kind == "k1":
            lo_s, hi_s = spec.split("_", 1) if "_" in spec else (None, spec)
            hi = float(hi_s)
            lo = float(lo_s) if lo_s is not None else 1.0 / hi
            if not 0 < lo <= hi:
                raise ValueError
            return {"stat": "ratio", "level": level, "low": 1.0 / hi, "high": 1.0 / lo}
        hi = float(spec) if "_" not in spec else -1.0  # float() reads "1_0" as 10
        if not hi > 0:
            raise ValueError
    except ValueError:
        raise ctx.error(
            f"threshold {spec!r} of option {option} is not a positive bound"
            + (" or 'lo_hi' with 0 < lo ≤ hi" if kind == "k1" else ""),
            "e.g. 2.0" + (" or '0.5_2.0'" if kind == "k1" else ""),
        ) from None
    return {"stat": kind, "level": level, "low": None, "high": hi}


def rollout_rs(v: Any, ctx: Any) -> None:
    """Rejection modes with ``rollout_rs_threshold`` -> ``actor.rollout_rs`` filters (k1:
    ratio bounds ``[1/hi, 1/lo]``; k2, k3: upper bounds); with adv_estimator grpo or rloo
    only (verl rejects before the advantages, temper after), except in bypass mode, where
    verl rejects inside the loss too."""
    if v is None:
        ctx.note("accepted at its inert value (no rejection sampling)")
        return
    options = list(dict.fromkeys(o.strip() for o in str(v).split(",") if o.strip()))
    for option in options:
        if option not in MODES:
            raise ctx.error(
                f"'{option}' is not one of verl's rejection modes", f"use: {', '.join(MODES)}"
            )
    if not options:
        raise ctx.error("no rejection mode given", f"use: {', '.join(MODES)}, or null")
    estimator = ctx.get("algorithm.adv_estimator", "gae")
    bypass = ctx.get(f"{RC}.bypass_mode", False) is True  # verl rejects in the loss then
    if estimator not in ESTIMATORS and not bypass:
        raise ctx.error(
            f"verl rejects tokens before computing advantages, temper after; with "
            f"adv_estimator {estimator} the kept tokens' advantages would differ",
            f"use adv_estimator {' or '.join(ESTIMATORS)}, or set rollout_rs: null",
        )
    spec = ctx.get(f"{RC}.rollout_rs_threshold")
    if spec is None:
        raise ctx.error("rejection sampling needs rollout_rs_threshold", "set it, e.g. 2.0")
    specs = _threshold_specs(options, spec, ctx)
    ctx._write("actor.rollout_rs", [_filter(o, s, ctx) for o, s in zip(options, specs)])
    if bypass:
        ctx.note(
            "bypass mode: the old log-probs are the rollout's, so the filters compare the "
            "current policy with the rollout's, before each mini-batch's update (one extra "
            "forward; verl computes them within each micro-batch's loss)"
        )


def rollout_rs_threshold(v: Any, ctx: Any) -> None:
    """Read with ``rollout_rs``; inert while rejection sampling is off."""
    if ctx.get(f"{RC}.rollout_rs") is None:
        ctx.note("no effect here (rollout_rs is off)")
