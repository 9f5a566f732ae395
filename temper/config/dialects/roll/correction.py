"""ROLL's ``train_infer_correction`` (trainer vs rollout-engine log-probs) -> the actor's
``rollout_is`` (importance weights) and ``rollout_rs`` (rejection filters).

ROLL (``roll/utils/train_infer_corrections.py``) compares ``old_log_probs`` with the
engine's ``infer_logprobs``: ``lr_t = log π_old − log π_infer``, ratios at four
granularities — ``token`` ``exp(lr_t)``, ``geometric`` ``exp(mean_t lr_t)``, ``sequence``
``exp(Σ_t lr_t)``, ``segment`` ``exp(mean lr_t)`` over each run of consecutive response
tokens — and the same granularities of ``diff_t = π_old − π_infer`` (probabilities; mean,
sum, per-run mean).

* ``is_weight`` (enabled): the ratio at ``weight_type``, clamped to ``[0, upper_bound]``
  (default 1.2), multiplies the token loss -> ``actor.rollout_is`` (``token``,
  ``geometric``, ``sequence``, ``segment``) with ``rollout_is_threshold = upper_bound``;
* ``filters``: each enabled filter keeps a token iff its ratio at ``agg_type`` lies in
  ``[ratio_low, ratio_high]`` (``ratio_enabled``, default on, 0.8/1.2) and its diff in
  ``[diff_low, diff_high]`` (``diff_enabled``, default off, −0.2/0.2); the rejected tokens
  leave ``response_mask`` -> one ``actor.rollout_rs`` filter per enabled test
  (``stat: ratio`` / ``prob_diff``; levels token, sequence_mean, sequence_sum,
  segment_mean).

ROLL applies both after the advantages, in the actor's loss; so does temper. Without
``enable_old_logprobs_recompute`` ROLL's ``old_log_probs`` are the trainer's own first
forward of the update (cached), not the engine's: temper recomputes them
(``actor.recompute_old_log_prob``), which is the same forward. ROLL
clamps nothing before ``exp``; temper clamps each ``lr_t`` to ±20 (a ratio beyond
e^20 is rejected or truncated either way).
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core.derivation import derivation
from temper.config.errors import ConfigError

KEY = "train_infer_correction"
IS_LEVELS = {
    "token": "token",
    "geometric": "geometric",
    "sequence": "sequence",
    "segment": "segment",
}
RS_LEVELS = {
    "token": "token",
    "geometric": "sequence_mean",
    "sequence": "sequence_sum",
    "segment": "segment_mean",
}
# a filter's fields and ROLL's defaults (TrainInferFilterConfig)
FILTER_DEFAULTS: dict[str, Any] = {
    "enabled": False,
    "agg_type": "token",
    "ratio_enabled": True,
    "ratio_low": 0.8,
    "ratio_high": 1.2,
    "diff_enabled": False,
    "diff_low": -0.2,
    "diff_high": 0.2,
}


def _level(table: dict[str, str], value: Any, key: str) -> str:
    if value not in table:
        raise ConfigError(
            key, f"'{value}' is not one of ROLL's granularities", f"use one of: {', '.join(table)}"
        )
    return table[value]


def _filters(ctx: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, given in enumerate(ctx.get(f"{KEY}.filters") or []):
        key = f"{KEY}.filters[{i}]"
        given = given or {}
        for name in given:
            if name not in FILTER_DEFAULTS:
                raise ConfigError(
                    f"{key}.{name}",
                    "not a field of ROLL's filter config (ROLL's loader drops it)",
                    f"remove it; a filter has: {', '.join(FILTER_DEFAULTS)}",
                )
        f = {**FILTER_DEFAULTS, **given}
        if not f["enabled"]:
            continue
        level = _level(RS_LEVELS, f["agg_type"], f"{key}.agg_type")
        for test, stat in (("ratio", "ratio"), ("diff", "prob_diff")):
            if f[f"{test}_enabled"]:
                low, high = float(f[f"{test}_low"]), float(f[f"{test}_high"])
                out.append({"stat": stat, "level": level, "low": low, "high": high})
    return out


@derivation(
    "train_infer_correction.is_weight.{k}",
    "train_infer_correction.filters",
    k=("enabled", "weight_type", "upper_bound"),
    explains=("enable_old_logprobs_recompute", "entropy_loss_coef"),
    fields=("pipeline",),
)
def train_infer_correction(ctx: Any) -> None:
    """Importance weights and rejection filters of ROLL's train/infer correction."""
    weight = f"{KEY}.is_weight"
    if ctx.get(f"{weight}.enabled"):
        kind = ctx.get(f"{weight}.weight_type", "token")
        ctx.write("actor.rollout_is", _level(IS_LEVELS, kind, f"{weight}.weight_type"), weight)
        bound = ctx.get(f"{weight}.upper_bound", 1.2)  # ROLL's default, not temper's 2.0
        if bound is None:
            raise ConfigError(
                f"{weight}.upper_bound",
                "untruncated importance weights are not supported",
                "set an upper bound, e.g. 1.2 (ROLL's default)",
            )
        ctx.write("actor.rollout_is_threshold", float(bound), f"{weight}.upper_bound")
    else:
        for name in ("weight_type", "upper_bound"):
            if ctx.has(f"{weight}.{name}"):
                ctx.inert("importance weights are off (enabled: false)", f"{weight}.{name}")
    filters = _filters(ctx)
    if filters:
        ctx.write("actor.rollout_rs", filters, f"{KEY}.filters")
    no_recompute = ctx.get("enable_old_logprobs_recompute") is False
    rlvr = ctx.native_get("pipeline") == "rlvr"
    if filters and no_recompute and rlvr and (ctx.get("entropy_loss_coef") or 0) > 0:
        ctx.remark(
            f"{KEY}.filters: ROLL's RLVR workers without enable_old_logprobs_recompute "
            "average the entropy bonus over every response token; temper, as ROLL "
            "with it, over the tokens the filters keep"
        )
