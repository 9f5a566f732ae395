"""The ROLL dialect: a ROLL pipeline YAML (RLVR or agentic) -> the native schema.

The generic walker visits every key of the input against ``roll_table.TOP``: mapped,
noted, rejected, or read by one of the derivations in ``roll_derive`` (the arithmetic and
cross-key rules: model path, mini-batch size, strategies, placement, rewards).
Unknown keys raise a ``ConfigError`` with "did you mean". Top-level keys that came
from ``defaults:`` files and are not ROLL settings (``deepspeed_zero2``, envs.yaml's
``custom_env``) are definitions: unreferenced ones are noted.

Placement: ROLL always runs on Ray; here ``resources.backend`` is ``ray`` when the
device mappings use more than one device, else ``local`` (one process).
"""

from __future__ import annotations

from temper.config.catalog import Catalog
from temper.config.dialects import Translation
from temper.config.dialects import roll_derive as derive
from temper.config.dialects.roll_derive import Ctx
from temper.config.dialects.roll_devices import parse_device_mapping
from temper.config.dialects.roll_dpo import DPO_TABLE, is_dpo, translate_roll_dpo
from temper.config.dialects.roll_sft import SFT_TABLE, is_sft, translate_roll_sft
from temper.config.dialects.roll_table import ROLL_DEFAULTS, TOP
from temper.config.dialects.roll_walk import KeyTable
from temper.config.loader import RawConfig

__all__ = ["parse_device_mapping", "translate_roll"]

RL_TABLE = KeyTable(TOP)
REVERSE = RL_TABLE.reverse


def translate_roll(raw: RawConfig, catalog: Catalog | None = None) -> Translation:
    """Translate a ROLL pipeline config (see the module docstring) — RLVR, agentic, SFT
    (:mod:`roll_sft`) or DPO (:mod:`roll_dpo`); ROLL's rules read no registry, so ``catalog`` (the dialect
    interface's) is not needed."""
    if is_sft(raw.data):
        return translate_roll_sft(raw)
    if is_dpo(raw.data):
        return translate_roll_dpo(raw)
    given = dict(raw.data)
    applied = {k: v for k, v in ROLL_DEFAULTS.items() if k not in given}
    if isinstance(given.get("validation"), dict) and "eval_steps" in given["validation"]:
        applied.pop("eval_steps", None)
    data = {**applied, **given}
    ctx = Ctx(data)
    derive.env_manager_sampling(ctx)
    defs = []
    for key, value in data.items():
        if not RL_TABLE.is_rule(key) and (key in raw.from_defaults or key in raw.referenced):
            defs.append(key)  # a definition other keys interpolate (or a defaults file's)
            continue
        RL_TABLE.walk(ctx, value, (str(key),))
    agentic = "train_env_manager" in data
    ctx.set("pipeline", "agentic" if agentic else "rlvr", "train_env_manager")
    derive.model(ctx)
    derive.lengths(ctx, agentic)
    derive.algorithm(ctx)
    derive.data(ctx)
    derive.strategies(ctx)
    derive.placement(ctx)
    derive.mini_batch(ctx)
    derive.rewards(ctx)
    derive.dynamic_sampling(ctx)
    if agentic:
        derive.episodes(ctx)
    derive.definitions(ctx, raw, defs)
    if applied:
        ctx.notes.append(
            "ROLL defaults applied for keys the file omits: "
            + ", ".join(f"{k}={v!r}" for k, v in applied.items())
        )
    return Translation(native=ctx.native, notes=ctx.notes, sources=dict(ctx.src), table=REVERSE)


def key_meaning(key: str) -> tuple[tuple[str, ...], str] | None:
    """What ROLL key ``key`` becomes here: (native keys it sets, how), or None when the
    table has no such key (``temper check --explain``; the RL pipelines' table first,
    then the SFT pipeline's, then the DPO pipeline's)."""
    return RL_TABLE.meaning(key) or SFT_TABLE.meaning(key) or DPO_TABLE.meaning(key)
