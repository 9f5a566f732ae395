"""What ``ulysses_sequence_parallel_size`` > 1 needs of the rest of the run (checked at
load; the model's heads and kind at pre-flight, :func:`temper.training.ulysses.check_model`).

Ulysses (:mod:`temper.training.ulysses`) splits each sequence's tokens over a group of
ranks and gathers the per-token outputs; what compares whole sequences' logits inside
the training forward — on-policy distillation's direct gradient over the teachers'
top-k tokens, offline distillation's teacher logits (the distill pipeline's own check)
— is refused with it. (MoE router replay splits its routing as the columns:
:func:`temper.training.ulysses.shard_routing`.) The reference splits its
sequences as the actor does, so its data-parallel devices must form whole groups.
"""

from __future__ import annotations

from temper.config.catalog import MEGATRON_PARALLEL, ONE_PROCESS
from temper.config.derive import Derived
from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.training.registry import ENGINES

KEY = "actor.ulysses_sequence_parallel_size"


def splits_sequences(strategy: str) -> bool:
    """Whether engine ``strategy`` runs Ulysses: a data-parallel engine (neither one
    process nor Megatron's own model parallelism)."""
    return strategy in ENGINES and not ENGINES.get(strategy).needs & {
        ONE_PROCESS,
        MEGATRON_PARALLEL,
    }


def check_ulysses(cfg: TemperConfig, plan: Derived) -> None:
    sp = cfg.actor.ulysses_sequence_parallel_size
    if sp <= 1:
        return
    if cfg.distill.teachers and cfg.distill.direct_gradient:
        raise ConfigError(
            KEY,
            "on-policy distillation's direct gradient compares the student's logits at the "
            "teachers' top-k tokens of whole sequences, which Ulysses does not split",
            "set it to 1, or distill.direct_gradient: false",
        )
    ranks = plan.placement.get("reference", [])
    if (
        plan.use_reference
        and cfg.model.lora.rank == 0
        and cfg.resources.backend == "ray"
        and splits_sequences(cfg.reference.strategy)
        and len(ranks) % sp
    ):
        raise ConfigError(
            KEY,
            f"the reference splits its sequences as the actor does, and its {len(ranks)} "
            f"devices are not divisible by {sp}",
            f"place the reference on a multiple of {sp} devices (resources.reference)",
        )
