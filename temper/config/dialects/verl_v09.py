"""The verl key table: keys verl 0.9 (main from 2026-06 on) added to the trainer config.

- ``model_engine`` (``dp|megatron|torchtitan|veomni``) is a Hydra defaults group of
  ``ppo_trainer.yaml``: its option picks the per-role files (``${model_engine}_actor``, …),
  whose ``strategy`` keys then say the engine — verl's Python never reads
  ``model_engine`` itself. Here it sets the actor's strategy too, so a file whose
  ``strategy`` disagrees with it is refused instead of running another engine than
  the one the user picked.
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects import verl_rules as r
from temper.config.dialects.verl_rules import Map, Rule

#: verl's ``model_engine`` options temper runs -> the actor ``strategy`` their files set
#: (``actor/dp_actor.yaml``: fsdp; ``actor/megatron_actor.yaml``: megatron).
MODEL_ENGINE_STRATEGY = {"dp": "fsdp", "megatron": "megatron"}


def _model_engine(v: Any, ctx: Any) -> Any:
    r.refuse_other_engine(v, ctx)
    r.choice(*MODEL_ENGINE_STRATEGY)(v, ctx)
    ctx.note(
        "model_engine picks verl's per-role config files; it sets actor.strategy as the "
        "actor's strategy key does (dp: fsdp2)"
    )
    # dp is verl's FSDP engine, which temper runs as FSDP2 (as strategy: fsdp does)
    return "fsdp2" if v == "dp" else v


RULES: dict[str, Rule] = {
    "model_engine": Map("actor.strategy", _model_engine),
}
