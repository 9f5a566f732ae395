"""verl's ``actor_rollout_ref.model.lora`` section: LoRA of its megatron workers
(Megatron-Bridge), onto temper's ``model.lora`` for the megatron engine.

verl's FSDP workers read ``model.lora_rank`` / ``lora_alpha`` / ``target_modules``
(peft); its megatron workers read this section. temper has one ``model.lora`` for both
engines, so the section is taken when its rank is set and the actor is a megatron one,
and the FSDP keys then must leave LoRA off. temper's megatron adapters are one pair per
projection, also on the fused ``linear_qkv`` / ``linear_fc1`` (Megatron-Bridge's
``canonical_lora``, which is peft's LoRA): its fused ``lora`` type — one ``A`` shared by
q, k and v — is taken as that, with a note.
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.verl.table import ACT

#: Megatron-Bridge LoRA types -> None (taken) or why it is refused.
TYPES: dict[str, str | None] = {
    "lora": None,
    "canonical_lora": None,
    "dora": "DoRA (weight-decomposed LoRA) is not in temper",
    "vlm_lora": "LoRA of a vision-language model on Megatron is not in temper",
}
#: Keys of the section written onto ``model.lora`` fields.
FIELDS = {
    "rank": "rank",
    "alpha": "alpha",
    "dropout": "dropout",
    "target_modules": "target_modules",
}
#: Keys that change nothing here, with why.
NOTES = {
    "merge": "the rollout engine always receives merged weights (no separate adapters)",
    "lora_A_init_method": "A starts as peft's (Kaiming-uniform), B at zero",
    "dropout_position": "dropout, when on, is refused by the megatron engine",
    "a2a_experimental": "a Megatron-Bridge communication option for MoE adapters",
    "dtype": "adapters train in the model's training dtype",
    "freeze_vision_model": "vision-language adapters are not in temper (a text model)",
    "freeze_vision_projection": "vision-language adapters are not in temper (a text model)",
    "freeze_language_model": "the base model is frozen, the adapters train",
}


def megatron_lora(v: Any, ctx: Any) -> None:
    """Megatron-Bridge's LoRA section onto model.lora for a megatron actor (one adapter
    pair per projection); inert at rank 0."""
    section = v if isinstance(v, dict) else {}
    rank = section.get("rank") or 0
    shown, key = ctx.key, ctx.path  # as the user wrote it; in verl's tree
    if rank == 0:
        for name in section:
            ctx.note(
                "accepted at its inert value (LoRA through Megatron-Bridge is off)",
                f"{shown}.{name}",
            )
        return
    model = key.rsplit(".", 1)[0]  # the model section holding it
    if ctx.get(f"{ACT}.strategy") != "megatron":
        raise ctx.error_at(
            f"{key}.rank",
            "Megatron-Bridge LoRA (this section) is taken for a megatron actor only; "
            "this actor is not one",
            f"use {model}.lora_rank / lora_alpha / target_modules (peft's LoRA)",
        )
    if ctx.get(f"{model}.lora_rank", 0) not in (0, None):
        raise ctx.error_at(
            f"{model}.lora_rank",
            f"LoRA is set twice: lora_rank and {key}.rank (temper has one model.lora)",
            "set lora_rank: 0 for a megatron actor",
        )
    kind = section.get("type") or "lora"
    why = TYPES.get(kind, f"LoRA type '{kind}' is not one temper knows")
    if why is not None:
        raise ctx.error_at(f"{key}.type", why, "use type: lora or canonical_lora")
    if kind == "lora":
        ctx.note(
            "temper adapts each projection of a fused module with a pair of its own "
            "(Megatron-Bridge's canonical_lora; peft's LoRA)",
            f"{shown}.type",
        )
    if section.get("exclude_modules"):
        raise ctx.error_at(
            f"{key}.exclude_modules",
            "excluding modules from LoRA is not in temper's megatron engine (peft's LoRA "
            "on fsdp2 has it: actor_rollout_ref.model.exclude_modules)",
            "list the wanted modules in target_modules",
        )
    if section.get("adapter_path"):
        raise ctx.error_at(
            f"{key}.adapter_path",
            "loading a saved LoRA adapter is not in temper's megatron engine (peft's LoRA "
            "on fsdp2 has it: actor_rollout_ref.model.lora_adapter_path)",
            "merge the adapter into the model first",
        )
    b_init = section.get("lora_B_init_method") or "zero"
    if b_init != "zero":
        raise ctx.error_at(
            f"{key}.lora_B_init_method",
            f"B starts at zero here (the model starts as the base model), got '{b_init}'",
            "set it to zero",
        )
    for name, value in section.items():
        full = f"{shown}.{name}"
        if name in FIELDS:
            if value is not None:
                ctx.replace(f"model.lora.{FIELDS[name]}", value, full)
        elif name in NOTES:
            ctx.note(f"no effect here ({NOTES[name]})", full)
        elif name not in ("type", "exclude_modules", "adapter_path", "lora_B_init_method"):
            raise ctx.error_at(
                f"{key}.{name}", "not a key of verl's lora section temper knows", "remove it"
            )
