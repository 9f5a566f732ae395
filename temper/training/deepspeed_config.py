"""The DeepSpeed config of a role: its ``deepspeed`` section, completed by temper.

A role's ``deepspeed`` section is a DeepSpeed config as DeepSpeed documents it (ROLL's
``strategy_config``), so the ``deepspeed_zero*.yaml`` fragments ROLL ships work as
written. temper owns what its own keys already decide and fills it in:

================================  =============================================
DeepSpeed key                     filled from
================================  =============================================
``train_micro_batch_size_per_gpu``  ``<role>.micro_batch_size_per_device``
``gradient_accumulation_steps``     per-rank mini-batch / micro-batch
``train_batch_size``                micro × accumulation × data-parallel ranks
``gradient_clipping``               ``<role>.grad_clip`` (0: none)
``bf16.enabled``, ``fp16.enabled``  ``model.dtype`` (as resolved for the device)
``bf16.bf16_master_weights_and_grads``, ``bf16.bf16_optimizer_states``
                                    ``<role>.master_dtype`` (bf16: both true)
================================  =============================================

A value of ``"auto"`` (Hugging Face's convention, used by ROLL's fragments) or the same
value is accepted; a different number for a batch or clipping key is a
:class:`ConfigError` (it would change the run). The precision follows ``model.dtype``:
ROLL's fragments all say ``bf16: {enabled: true}``, and a CPU run (fp32) keeps them as
written, so a differing ``enabled`` becomes a note, not an error.

bf16 master weights (``master_dtype: bf16``) are DeepSpeed's own mode: its ZeRO
optimizer (stage 1-3) keeps the weight partitions, gradients and AdamW's moments in
bf16 instead of an fp32 copy. It runs in bf16 (a trained role computes in its master
dtype when ``model.dtype`` is fp32); fp16 master weights, and bf16 ones with
``offload_optimizer`` (DeepSpeed asks for its compiled CPU Adam then), are refused.

Other ``"auto"`` values get Hugging Face's rules: ``zero_optimization.reduce_bucket_size``
= hidden², ``stage3_prefetch_bucket_size`` = 0.9·hidden², ``stage3_param_persistence_threshold``
= 10·hidden. Any other ``"auto"`` is an error naming its key.

temper also sets, because its engine depends on them:

* ``zero_force_ds_cpu_optimizer: false`` with ``offload_optimizer``: temper's optimizer
  is ``torch.optim.AdamW`` (DeepSpeedCPUAdam is a compiled op that a no-op-build install
  does not have), stepping the offloaded fp32 partitions on the CPU;
* ``bf16.check_grad_overflow: true`` under bf16: a step whose gradients are not finite is
  skipped by DeepSpeed, so temper can stop it before the update (as on every engine).

``optimizer`` and ``scheduler`` sections are refused: the role's ``optim`` section builds
both (AdamW and temper's LR schedule), as on the other engines. A frozen role (the
reference) runs ZeRO-1/2 as stage 0, with a note: they partition only optimizer state
and gradients.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from temper.config.errors import ConfigError
from temper.config.schema import DTYPES, Precision, TrainEngineConfig

AUTO = "auto"
PRECISIONS: dict[torch.dtype, Precision] = {
    getattr(torch, attr): name for name, attr in DTYPES.items()
}
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class DeepSpeedFill:
    """What temper decides for a role's DeepSpeed config (see the module table).

    ``role`` names the config section in messages (``actor``, ``critic``, ``reference``);
    ``hidden_size`` sizes the ``"auto"`` ZeRO buckets (None: unknown); ``master``: the
    trained role's ``master_dtype``; ``precision``: the dtype it computes in.
    """

    role: str
    micro_batch: int
    grad_accum: int
    world: int
    grad_clip: float
    precision: Precision
    hidden_size: int | None = None
    trainable: bool = True
    master: Precision = "fp32"

    @property
    def key(self) -> str:
        return f"{self.role}.deepspeed"


@dataclass(frozen=True)
class ResolvedDeepSpeed:
    """The complete DeepSpeed config, its ZeRO stage, and what temper changed (notes)."""

    config: dict[str, Any]
    stage: int
    notes: tuple[str, ...]

    @property
    def offload_optimizer(self) -> bool:
        return _offload_device(self.config, "offload_optimizer") is not None

    @property
    def offload_param(self) -> bool:
        return _offload_device(self.config, "offload_param") is not None


def batch_fill(train: TrainEngineConfig | None, infer_micro: int, world: int) -> tuple[int, int]:
    """``(micro-batch, accumulation steps)`` DeepSpeed is told for a role on ``world`` ranks.

    temper sets the accumulation boundary itself (token-budget micro-batches vary in
    number), so these only keep DeepSpeed's bookkeeping consistent: the trained role's
    ``micro_batch_size_per_device`` and ``mini_batch_size / world / micro`` (1 when the
    mini-batch is the whole step's batch, unknown until then); a frozen role's inference
    micro-batch and 1.
    """
    if train is None:
        return infer_micro, 1
    micro = train.micro_batch_size_per_device
    if train.mini_batch_size is None:
        return micro, 1
    return micro, max(1, max(1, train.mini_batch_size // world) // micro)


def zero_stage(section: Mapping[str, Any], key: str = "deepspeed") -> int:
    """The ZeRO stage of a DeepSpeed section (0 when it has no ``zero_optimization``)."""
    zero = section.get("zero_optimization") or {}
    if not isinstance(zero, Mapping):
        raise ConfigError(f"{key}.zero_optimization", "must be a mapping", "e.g. {stage: 2}")
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ConfigError(
            f"{key}.zero_optimization.stage",
            f"{stage!r} is not a ZeRO stage",
            "use 0 (data parallel), 1 (optimizer states), 2 (+ gradients) or 3 (+ parameters)",
        )
    return int(stage)


def resolve_deepspeed_config(section: Mapping[str, Any], fill: DeepSpeedFill) -> ResolvedDeepSpeed:
    """The DeepSpeed config to run: ``section`` with temper's values filled in (see module)."""
    key = fill.key
    if not isinstance(section, Mapping):
        raise ConfigError(key, f"must be a mapping (a DeepSpeed config), got {section!r}")
    cfg: dict[str, Any] = copy.deepcopy(dict(section))
    notes: list[str] = []
    for owned in ("optimizer", "scheduler"):
        if owned in cfg:
            raise ConfigError(
                f"{key}.{owned}",
                f"temper builds the {owned} from {fill.role}.optim (AdamW and its LR schedule), "
                "as on every engine",
                f"remove it and set {fill.role}.optim (lr, betas, eps, weight_decay, "
                "lr_scheduler, warmup_steps, …)",
            )
    stage = zero_stage(cfg, key)
    micro_key = f"{fill.role}.micro_batch_size_per_device"
    _own(cfg, key, "train_micro_batch_size_per_gpu", fill.micro_batch, micro_key)
    accum = f"{fill.role}.mini_batch_size / ranks / micro_batch_size_per_device"
    _own(cfg, key, "gradient_accumulation_steps", fill.grad_accum, accum)
    total = fill.micro_batch * fill.grad_accum * fill.world
    _own(cfg, key, "train_batch_size", total, "micro-batch × accumulation × ranks")
    if fill.trainable:
        _own(cfg, key, "gradient_clipping", float(fill.grad_clip), f"{fill.role}.grad_clip")
    elif cfg.get("gradient_clipping") == AUTO:
        cfg["gradient_clipping"] = 0.0
    notes += _precision(cfg, key, fill.precision)
    zero = cfg.setdefault("zero_optimization", {})
    if not fill.trainable and stage in (1, 2):
        # DeepSpeed refuses ZeRO-1/2 without an optimizer (ROLL's deepspeed_infer asserts
        # stage 3); they would partition nothing a frozen model has
        notes.append(
            f"{key}.zero_optimization.stage: {stage} -> 0 (ZeRO-1/2 partition optimizer "
            "state and gradients, which a frozen model has none of; stage 3 partitions "
            "its weights)"
        )
        stage = zero["stage"] = 0
    _zero_auto(zero, f"{key}.zero_optimization", fill.hidden_size)
    _master(cfg, fill, stage)
    if _offload_device(cfg, "offload_optimizer") is not None:
        if cfg.get("zero_force_ds_cpu_optimizer", False) is True:
            raise ConfigError(
                f"{key}.zero_force_ds_cpu_optimizer",
                "temper's optimizer is torch AdamW, which DeepSpeed then runs on the "
                "offloaded fp32 partitions; DeepSpeedCPUAdam needs a compiled op",
                "remove the key (temper sets it to false)",
            )
        cfg["zero_force_ds_cpu_optimizer"] = False
    left = [path for path, value in _leaves(cfg) if value == AUTO]
    if left:
        raise ConfigError(
            f"{key}.{left[0]}",
            "'auto' has no value temper can fill here",
            "set a value (temper fills auto only for batch sizes, clipping, precision and "
            "the ZeRO bucket sizes)",
        )
    return ResolvedDeepSpeed(config=cfg, stage=stage, notes=tuple(notes))


# --------------------------------------------------------------------------- helpers


def _own(cfg: dict[str, Any], key: str, name: str, value: float, source: str) -> None:
    given = cfg.get(name, AUTO)
    if given != AUTO and not _same_number(given, value):
        raise ConfigError(
            f"{key}.{name}",
            f"{given!r} differs from {value!r}, which temper derives from {source}",
            f"set it to auto (or remove it) and change {source} instead",
        )
    cfg[name] = value


def _same_number(a: Any, b: float) -> bool:
    return isinstance(a, int | float) and not isinstance(a, bool) and float(a) == float(b)


def _precision(cfg: dict[str, Any], key: str, precision: Precision) -> list[str]:
    notes = []
    for name in ("bf16", "fp16"):
        section = cfg.get(name)
        if section is None:
            section = {}
        if not isinstance(section, Mapping):
            raise ConfigError(f"{key}.{name}", "must be a mapping", "e.g. {enabled: true}")
        section = dict(section)
        want = precision == name
        given = section.get("enabled", AUTO)
        if given not in (AUTO, want):
            notes.append(
                f"{key}.{name}.enabled: {given} -> {want} (temper runs DeepSpeed in model.dtype "
                f"= {precision}; set model.dtype to change it)"
            )
        section["enabled"] = want
        cfg[name] = section
    if precision == "bf16":
        bf16 = cfg["bf16"]
        if bf16.get("check_grad_overflow", True) is False:
            raise ConfigError(
                f"{key}.bf16.check_grad_overflow",
                "temper stops a step whose gradients are not finite before the update; "
                "without this check DeepSpeed would apply it",
                "remove the key (temper sets it to true)",
            )
        bf16["check_grad_overflow"] = True
    return notes


#: DeepSpeed's switches of bf16 master weights (its ZeRO optimizer's partitions, their
#: gradients, and the client optimizer's moments held in bf16)
BF16_MASTER = ("bf16_master_weights_and_grads", "bf16_optimizer_states")


def _master(cfg: dict[str, Any], fill: DeepSpeedFill, stage: int) -> None:
    """``bf16.bf16_master_weights_and_grads`` / ``bf16_optimizer_states`` from the
    role's ``master_dtype``; what DeepSpeed cannot do with it is refused by that key."""
    key, master_key = fill.key, f"{fill.role}.master_dtype"
    bf16 = fill.trainable and fill.master == "bf16"
    if fill.trainable and fill.master == "fp16":
        raise ConfigError(
            master_key,
            "fp16 master weights: DeepSpeed keeps them only under fp16 loss scaling with its "
            "compiled CPU Adam, which temper does not use",
            f"set {master_key}: bf16 or fp32, or {fill.role}.strategy: fsdp2 or torch",
        )
    if bf16 and stage == 0:
        raise ConfigError(
            master_key,
            "bf16 master weights live in DeepSpeed's ZeRO optimizer, which stage 0 does not use",
            f"set {key}.zero_optimization.stage to 1, 2 or 3, or {master_key}: fp32",
        )
    if bf16 and fill.precision != "bf16":
        raise ConfigError(
            master_key,
            f"bf16 master weights need DeepSpeed's bf16 mode, but model.dtype is {fill.precision}",
            f"set model.dtype: bf16 (or auto), or {master_key}: fp32",
        )
    if bf16 and _offload_device(cfg, "offload_optimizer") is not None:
        raise ConfigError(
            master_key,
            "DeepSpeed's bf16 master weights with offload_optimizer need its compiled CPU "
            "Adam (DeepSpeedCPUAdam); temper steps torch AdamW",
            f"remove {key}.zero_optimization.offload_optimizer, or set {master_key}: fp32",
        )
    section = cfg.setdefault("bf16", {})
    for name in BF16_MASTER:
        given = section.get(name, AUTO)
        if given not in (AUTO, bf16):
            raise ConfigError(
                f"{key}.bf16.{name}",
                f"{given!r} differs from {bf16!r}, which temper derives from {master_key}",
                f"remove it and set {master_key} (bf16 turns both switches on)",
            )
        if bf16 or name in section:  # DeepSpeed's default is off: leave an unset one unset
            section[name] = bf16


def _zero_auto(zero: dict[str, Any], key: str, hidden: int | None) -> None:
    rules = {
        "reduce_bucket_size": lambda h: h * h,
        "stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
        "stage3_param_persistence_threshold": lambda h: 10 * h,
    }
    for name, rule in rules.items():
        if zero.get(name) != AUTO:
            continue
        if hidden is None:
            raise ConfigError(
                f"{key}.{name}",
                "'auto' is sized from the model's hidden_size, which its config does not give",
                "set a number",
            )
        zero[name] = rule(hidden)


def _offload_device(cfg: Mapping[str, Any], which: str) -> str | None:
    zero = cfg.get("zero_optimization") or {}
    section = zero.get(which) if isinstance(zero, Mapping) else None
    if not isinstance(section, Mapping):
        return None
    device = section.get("device", "none")
    return None if device in (None, "none") else str(device)


def _leaves(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, value
