"""verl's SPIN recipe (``recipe/spin``: ``main_spin`` over ``spin_trainer.yaml``) → the
``spin`` pipeline (:mod:`temper.pipelines.spin`: online DPO with a refreshed reference).

The recipe is verl's PPO trainer config with keys of its own, which verl's PPO files
lack (Hydra refuses them there), so any one identifies a SPIN file:

- ``actor_rollout_ref.actor.dpo_beta``: β of the DPO loss (its actor reads it there) →
  ``spin.beta``;
- ``algorithm.dpo_loss_type`` / ``algorithm.dpo_label_smoothing``: the loss
  (``sigmoid``, ``ipo``) and its label smoothing, read by the trainer with defaults
  sigmoid and 0 → ``spin.loss_type`` / ``spin.label_smoothing``;
- ``trainer.ref_update_freq``: at the start of step ``g`` with ``g % freq == 0`` the
  reference worker group loads the actor's checkpoint; ``freq <= 0`` never →
  ``spin.ref_update_freq`` (0 for a fixed reference).

verl's ``fit_dpo`` computes no advantages, KL penalty or critic values, whatever the
``algorithm`` section says (the recipe sets the estimator to null), so the translation
notes its keys as not read, and its actor's RL loss keys (clipping, entropy, KL loss)
likewise (``actor_rollout_ref.actor.use_kl_loss``, which asks for a term verl's SPIN
actor never adds, is kept: temper refuses it). Its actor takes one optimizer step over all of a step's
pairs, one pass (``update_policy_dpo_with_ref``: ``ppo_mini_batch_size``, ``ppo_epochs``
and ``shuffle`` are not read), so ``actor.mini_batch_size`` is the whole step and
``actor.ppo_epochs`` 1 here.
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core.derivation import derivation
from temper.config.dialects.core.rules import Map, Note, Refuse, Rule

ACT = "actor_rollout_ref.actor"
KEYS = (
    f"{ACT}.dpo_beta",
    "trainer.ref_update_freq",
    "algorithm.dpo_loss_type",
    "algorithm.dpo_label_smoothing",
)
RULES: dict[str, Rule] = {
    f"{ACT}.dpo_beta": Map("spin.beta"),
    "algorithm.dpo_loss_type": Map("spin.loss_type"),
    "algorithm.dpo_label_smoothing": Map("spin.label_smoothing"),
    "trainer.ref_update_freq": Map("spin.ref_update_freq", fn=lambda v, ctx: max(int(v), 0)),
    # the SPIN trainer logs every log_freq-th step (a key only it reads: ``+trainer.…``)
    "trainer.log_freq": Refuse(
        "temper logs every step's metrics",
        "remove it (or set 1)",
        ok=(1, None),
        why="every step is logged, as here",
    ),
    # the trainer puts it in the update's meta_info, which the actor does not read
    "algorithm.dpo_beta": Note(f"verl's SPIN actor reads its β from {ACT}.dpo_beta (spin.beta)"),
}
NOT_READ = (
    "no effect here (verl's SPIN trainer ranks responses by their reward and takes a DPO "
    "loss: no advantages, KL penalty or critic)"
)
ONE_STEP = (
    "no effect here (verl's SPIN actor takes one optimizer step over all of a step's "
    "pairs, in one pass)"
)
#: Native keys of the actor's RL loss, which verl's SPIN actor (``update_policy_dpo_with_ref``)
#: never reads: the translation notes them rather than writing them.
RL_LOSS = (
    "actor.policy_loss",
    "actor.policy_loss_kwargs",
    "actor.clip_ratio",
    "actor.clip_ratio_low",
    "actor.clip_ratio_high",
    "actor.clip_ratio_c",
    "actor.entropy_coeff",
    "actor.loss_agg_mode",
    "actor.kl_loss_coef",
    "actor.kl_loss_type",
)
DPO_LOSS = "no effect here (verl's SPIN actor's loss is the DPO loss alone)"
#: Keys that ask for more than verl's fit_dpo does (it reads them nowhere): kept, so the
#: spin pipeline's check refuses them rather than the translation dropping them.
REFUSED = ("algorithm.use_kl_in_reward", "algorithm.filter_groups")


def is_spin(ctx: Any) -> str | None:
    """The SPIN key the file sets (the first of :data:`KEYS`), else ``None``."""
    return next((key for key in KEYS if ctx.get(key) is not None), None)


@derivation(
    *KEYS, fields=("algorithm", "critic", "actor", "actor.mini_batch_size", "actor.ppo_epochs")
)
def finish(ctx: Any) -> None:
    """A SPIN file runs the spin pipeline; what its trainer does not read is noted."""
    key = is_spin(ctx)
    if key is None:
        return
    ctx.write("pipeline", "spin", key=ctx.prefix + key)
    for native, (value, source, _weak) in ctx.out.section("algorithm", "critic"):
        if native not in REFUSED:
            del ctx.writes[native]
            ctx.unnote(source)
            if value is not None:
                ctx.note(NOT_READ, source)
    for native, (value, source, _weak) in ctx.out.section("actor"):
        if native in RL_LOSS or native.startswith(tuple(k + "." for k in RL_LOSS)):
            del ctx.writes[native]
            ctx.unnote(source)
            if value is not None:
                ctx.note(DPO_LOSS, source)
    for native, value in (("actor.mini_batch_size", None), ("actor.ppo_epochs", 1)):
        source = ctx.out.written(native).key
        if source:
            ctx.note(ONE_STEP, source)
            ctx.replace(native, value, source)
