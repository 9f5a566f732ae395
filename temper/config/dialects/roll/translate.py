"""The ROLL dialect: a ROLL pipeline YAML (RLVR or agentic, with on-policy distillation's
teachers or without: :mod:`roll.opd`) -> the native schema.

The generic walker visits every key of the input against ``roll_table.TOP``: mapped,
noted, rejected, or read by one of the derivations in ``roll.derive`` (the arithmetic and
cross-key rules: model path, mini-batch size, strategies, placement, rewards).
Unknown keys raise a ``ConfigError`` with "did you mean". Top-level keys that came
from ``defaults:`` files and are not ROLL settings (``deepspeed_zero2``, envs.yaml's
``custom_env``) are definitions: unreferenced ones are noted.

Placement: ROLL always runs on Ray; here ``resources.backend`` is ``ray`` when the
device mappings use more than one device, else ``local`` (one process).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temper.config.catalog import Catalog
from temper.config.dialects import Translation
from temper.config.dialects.core.rules import meaning
from temper.config.dialects.core.walk import KeyTable
from temper.config.dialects.roll import derive, rlvr_rollout
from temper.config.dialects.roll import gem as roll_gem
from temper.config.dialects.roll import gigpo as roll_gigpo
from temper.config.dialects.roll.context import translation, walk_file
from temper.config.dialects.roll.derive import Ctx
from temper.config.dialects.roll.devices import parse_device_mapping
from temper.config.dialects.roll.distill import DISTILL_TABLE, is_distill, translate_roll_distill
from temper.config.dialects.roll.dpo import DPO_TABLE, is_dpo, translate_roll_dpo
from temper.config.dialects.roll.mock import rollout_mock
from temper.config.dialects.roll.opd import is_opd, rewrite_opd, user_key
from temper.config.dialects.roll.sft import SFT_TABLE, is_sft, translate_roll_sft
from temper.config.dialects.roll.table import ROLL_DEFAULTS, TOP
from temper.config.errors import ConfigError
from temper.config.loader import RawConfig

__all__ = ["parse_device_mapping", "translate_roll"]

RL_TABLE = KeyTable(TOP)
REVERSE = RL_TABLE.reverse


def translate_roll(raw: RawConfig, catalog: Catalog | None = None) -> Translation:
    """Translate a ROLL pipeline config (see the module docstring) — RLVR, agentic, SFT
    (:mod:`roll.sft`), DPO (:mod:`roll.dpo`), offline distillation (:mod:`roll.distill`) or on-policy distillation (:mod:`roll.opd`),
    whose messages name the file's own keys (``student_train``, ``teacher``), not those of
    the RL file it is rewritten into. ROLL's rules read no registry, so ``catalog`` (the
    dialect interface's) is not needed."""
    if is_sft(raw.data):
        return translate_roll_sft(raw)
    if is_dpo(raw.data):
        return translate_roll_dpo(raw)
    if is_distill(raw.data) and not is_opd(raw.data):
        return translate_roll_distill(raw)
    if not is_opd(raw.data):
        return _translate(raw, dict(raw.data), command=raw.command)
    given, distill, notes = rewrite_opd(raw.data)
    renamed = distill.pop("renamed")
    try:
        out = _translate(raw, given, distill, notes)
    except ConfigError as err:
        raise ConfigError(
            user_key(err.key, renamed), err.reason, err.template, bound=err.bound
        ) from err
    out.sources = {dst: user_key(src, renamed) for dst, src in out.sources.items()}
    return out


def _translate(
    raw: RawConfig,
    given: dict[str, Any],
    distill: dict[str, Any] | None = None,
    opd_notes: Sequence[str] = (),
    command: str = "train",
) -> Translation:
    """An RLVR or agentic file ``given`` (with ``distill``'s teachers: an OPD file
    rewritten by :func:`rewrite_opd`); an RLVR file read by ``temper eval``
    (``command``) is ROLL's RLVR rollout pipeline (:mod:`roll.rlvr_rollout`)."""
    # ROLL's agentic rollout pipeline: the env managers and actor_infer, no actor_train
    rollout_only = {"train_env_manager", "actor_infer"} <= set(given) and "actor_train" not in given
    validation_rollout = rlvr_rollout.is_rlvr_rollout(command, given)
    if validation_rollout:
        rlvr_rollout.roll_assertions(given)
    defaults = {"max_steps": ROLL_DEFAULTS["max_steps"]} if rollout_only else ROLL_DEFAULTS
    if validation_rollout:  # only the defaults of what the rollout reads
        defaults = {k: ROLL_DEFAULTS[k] for k in rlvr_rollout.DEFAULTS_READ}
    applied = {k: v for k, v in defaults.items() if k not in given}
    if isinstance(given.get("validation"), dict) and "eval_steps" in given["validation"]:
        applied.pop("eval_steps", None)
    data = {**applied, **given}
    ctx = Ctx(data, rlvr_rollout.UNBUILT if validation_rollout else None)
    derive.env_manager_sampling(ctx)
    defs = walk_file(RL_TABLE, ctx, raw)
    agentic = "train_env_manager" in data
    pipeline = "agentic_rollout" if rollout_only else "agentic" if agentic else "rlvr"
    if validation_rollout:
        pipeline = rlvr_rollout.PIPELINE
    ctx.write("pipeline", pipeline, "actor_infer" if rollout_only else "train_env_manager")
    derive.model(ctx)
    derive.lengths(ctx, agentic)
    derive.algorithm(ctx)
    roll_gigpo.env_manager(ctx)
    roll_gem.tool_wrappers(ctx)
    roll_gigpo.gigpo(ctx)
    derive.data(ctx)
    derive.strategies(ctx)
    derive.placement(ctx)
    derive.mini_batch(ctx)
    derive.rewards(ctx)
    derive.dynamic_sampling(ctx)
    derive.async_generation(ctx)
    rollout_mock(ctx)
    if agentic:
        derive.episodes(ctx)
    derive.definitions(ctx, raw, defs)
    if rollout_only:
        ctx.remark(
            "actor_infer without actor_train: ROLL's agentic rollout pipeline (episodes, no "
            "training), temper's agentic_rollout, run by temper generate; a file that trains "
            "names actor_train"
        )
        drop_training_keys(ctx)
    if validation_rollout:
        rlvr_rollout.drop_training_keys(ctx)
    if distill is not None:
        ctx.write("distill.teachers", distill["teachers"], "teacher")
        kl = ctx.native_get("algorithm.kl_penalty")
        if kl is not None:  # ROLL's OPD estimates each teacher's KL with kl_penalty
            ctx.write("distill.kl_penalty", kl, "kl_penalty")
        mode = "is_pure_opd" if distill["pure"] else "use_opd"
        ctx.write("distill.pure", distill["pure"], "student_train" if distill["pure"] else mode)
        for line in opd_notes:
            ctx.remark(line)
    return translation(ctx, applied, RL_TABLE)


#: What ROLL's agentic rollout pipeline reads, as temper keys (prefixes).
ROLLOUT_READS = (
    "pipeline",
    "model.",
    "rollout.",
    "agentic.",
    "reward.judge.",  # an env's LLM judge (DeepEyes)
    *(f"experiment.{k}" for k in ("seed", "device", "max_steps", "output_dir", "trackers")),
    *(f"experiment.{k}" for k in ("tracker_kwargs", "project_name", "experiment_name")),
    *(f"experiment.{k}" for k in ("logging_steps", "rollout_data_dir")),
)


def drop_training_keys(ctx: Ctx) -> None:
    """ROLL's agentic rollout pipeline (``AgenticRolloutPipeline``) builds actor_infer and
    the train env manager only: what the file's other keys set (training, validation,
    checkpoints, the devices of the roles) is read by nothing there; it is dropped here,
    with a note."""
    unread = {
        dst: src
        for dst, src in ctx.out.sources().items()
        if not dst.startswith(ROLLOUT_READS) or dst.startswith("agentic.val_env_manager")
    }
    for dst in unread:
        ctx.out.drop(dst)
    placed = sorted({src for dst, src in unread.items() if dst.startswith("resources.")})
    dropped = sorted(set(unread.values()) - set(placed))
    if placed:
        ctx.remark(
            f"{', '.join(placed)}: ROLL spreads actor_infer over these devices; temper's "
            "agentic rollout plays every episode with one engine in this process (the same "
            "episodes, at one engine's speed)"
        )
    if dropped:
        ctx.remark(
            f"{', '.join(dropped)}: accepted, no effect here: ROLL's agentic rollout "
            "pipeline trains, validates and checkpoints nothing"
        )


def key_meaning(key: str) -> tuple[tuple[str, ...], str] | None:
    """What ROLL key ``key`` becomes here: (native keys it sets, how), or None when the
    table has no such key (``temper check --explain``; the RL pipelines' table first,
    then the SFT pipeline's, then the DPO pipeline's)."""
    for table in (RL_TABLE, SFT_TABLE, DPO_TABLE, DISTILL_TABLE):
        rule = table.rule(key)
        if rule is not None:
            return meaning(rule)
    return None
