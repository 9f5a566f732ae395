"""verl's SPPO recipe (``recipe/sppo``: ``main_sppo`` over ``sppo_trainer.yaml``) → the
RLVR pipeline with the ``sppo`` estimator and policy loss
(:mod:`temper.algorithms.sppo`).

The recipe is verl's PPO trainer with two keys of its own, which verl's PPO files lack
(Hydra refuses them there), so either one identifies an SPPO file:

- ``algorithm.sppo_eta``: the trainer's ``compute_advantage`` takes
  ``A_i = s_i - SoftMean_β(s)`` over the batch with ``β = sppo_eta`` →
  ``algorithm.sppo_beta``;
- ``actor_rollout_ref.actor.sppo_eta``: the actor's loss
  ``(Σ_t log π_θ - Σ_t log π_old - η·A_i)²`` with ``η = sppo_eta`` →
  ``actor.policy_loss_kwargs.sppo_eta`` (verl's actor reads it with a default of 1.0,
  as temper does).

The SPPO trainer calls its own advantage function and its actor its own loss whatever
``algorithm.adv_estimator`` and ``actor.policy_loss.loss_mode`` say (the recipe sets
the estimator to null), so the translation writes ``adv_estimator: sppo`` and
``policy_loss: sppo`` and notes an estimator or loss mode the file names as not read.
The estimator still decides, in verl, whether a critic is built (``gae``): a critic the
SPPO actor never uses, which temper does not build.
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core.derivation import derivation
from temper.config.dialects.core.rules import Map, Rule

ACT = "actor_rollout_ref.actor"
KEYS = ("algorithm.sppo_eta", f"{ACT}.sppo_eta")
RULES: dict[str, Rule] = {
    "algorithm.sppo_eta": Map("algorithm.sppo_beta"),
    f"{ACT}.sppo_eta": Map("actor.policy_loss_kwargs.sppo_eta"),
}
NOT_READ = "no effect here (verl's SPPO trainer computes its own advantages and loss: sppo)"


def is_sppo(ctx: Any) -> str | None:
    """The SPPO key the file sets (the first of :data:`KEYS`), else ``None``."""
    return next((key for key in KEYS if ctx.get(key) is not None), None)


@derivation(*KEYS, "algorithm.adv_estimator", f"{ACT}.policy_loss.loss_mode")
def finish(ctx: Any) -> None:
    """An SPPO file's estimator and policy loss are SPPO's, whatever the file names."""
    key = is_sppo(ctx)
    if key is None:
        return
    for verl_key, native in (
        ("algorithm.adv_estimator", "algorithm.adv_estimator"),
        (f"{ACT}.policy_loss.loss_mode", "actor.policy_loss"),
    ):
        ctx.unnote(ctx.prefix + verl_key)  # a null estimator is not "the temper default"
        if ctx.get(verl_key) not in (None, "sppo"):
            ctx.note(NOT_READ, ctx.prefix + verl_key)
        ctx.replace(native, "sppo", ctx.prefix + key)
