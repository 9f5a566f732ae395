"""Which linears ``model.lora`` adapts on the megatron engine, and what of it the engine
cannot run — read at ``temper check`` without torch or Megatron-Core.

``target_modules`` may name Hugging Face projections (peft's names, ``all-linear``) or
Megatron's modules (verl's megatron ``lora.target_modules``: ``linear_qkv`` … and
Megatron-Bridge's canonical-LoRA names ``linear_q`` …); both come down to the HF
projections, each of which gets its own adapter pair (:mod:`megatron_lora`).

On a mixture-of-experts model the MLP names reach every MLP of a layer, as
Megatron-Bridge's name matching does: ``linear_fc1`` / ``linear_fc2`` (``gate_proj`` …,
Mixtral's ``w1``/``w3``/``w2``) adapt each expert (a pair of its own per expert) and the
shared expert; the router is never adapted (Megatron-Bridge and verl leave it out unless
``router`` is named, ROLL's ``all-linear`` takes linear layers only): naming it is refused.
"""

from __future__ import annotations

from temper.config.errors import ConfigError
from temper.config.schema import LoraConfig

#: HF projection -> (its Megatron module under a decoder layer, HF module path)
PROJECTIONS: dict[str, tuple[str, str]] = {
    "q_proj": ("self_attention.linear_qkv", "self_attn.q_proj"),
    "k_proj": ("self_attention.linear_qkv", "self_attn.k_proj"),
    "v_proj": ("self_attention.linear_qkv", "self_attn.v_proj"),
    "o_proj": ("self_attention.linear_proj", "self_attn.o_proj"),
    "gate_proj": ("mlp.linear_fc1", "mlp.gate_proj"),
    "up_proj": ("mlp.linear_fc1", "mlp.up_proj"),
    "down_proj": ("mlp.linear_fc2", "mlp.down_proj"),
}
#: Megatron(-Bridge) target names -> the HF projections they cover (verl's megatron
#: ``lora.target_modules``; ``linear_q`` … are Megatron-Bridge's canonical-LoRA names)
MEGATRON_NAMES: dict[str, tuple[str, ...]] = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "linear_q": ("q_proj",),
    "linear_k": ("k_proj",),
    "linear_v": ("v_proj",),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"),
    "linear_fc1_gate": ("gate_proj",),
    "linear_fc1_up": ("up_proj",),
    "linear_fc2": ("down_proj",),
}
#: Mixtral's names of an expert's projections (peft's target names on Mixtral)
MIXTRAL_NAMES: dict[str, str] = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
#: The parts of each (fused) Megatron linear, by its module name, in the order of its
#: rows: the attention's, and a dense MLP's, an expert's or the shared expert's
PARTS: dict[str, tuple[str, ...]] = {
    "linear_qkv": ("q_proj", "k_proj", "v_proj"),
    "linear_proj": ("o_proj",),
    "linear_fc1": ("gate_proj", "up_proj"),
    "linear_fc2": ("down_proj",),
}
#: names of an MoE router (HF ``gate``, Megatron ``router``): not adapted here
ROUTER_NAMES = ("router", "gate")


def lora_projections(target_modules: list[str] | str) -> tuple[str, ...]:
    """The HF projections ``model.lora.target_modules`` adapts: ``all-linear`` (peft's:
    every linear of the decoder layers), HF names (``q_proj`` …) or Megatron names
    (``linear_qkv`` …); ``ConfigError`` for any other."""
    names = [target_modules] if isinstance(target_modules, str) else list(target_modules)
    out: list[str] = []
    for name in names:
        if name in ("all-linear", "all_linear"):
            found: tuple[str, ...] = tuple(PROJECTIONS)
        elif name in PROJECTIONS:
            found = (name,)
        elif name in MEGATRON_NAMES:
            found = MEGATRON_NAMES[name]
        elif name in MIXTRAL_NAMES:
            found = (MIXTRAL_NAMES[name],)
        elif name in ROUTER_NAMES:
            raise ConfigError(
                "model.lora.target_modules",
                f"'{name}': LoRA on a mixture-of-experts router is not in the megatron engine",
                f"remove '{name}' (the experts, shared expert and attention are adapted)",
            )
        else:
            raise ConfigError(
                "model.lora.target_modules",
                f"'{name}' is no linear layer the megatron engine can adapt",
                "use all-linear, or names among "
                f"{', '.join([*PROJECTIONS, *MEGATRON_NAMES, *MIXTRAL_NAMES])}",
            )
        out += [p for p in found if p not in out]
    return tuple(p for p in PROJECTIONS if p in out)


def check_lora(lora: LoraConfig, role: str) -> None:
    """Raise ``ConfigError`` for a ``model.lora`` section this engine cannot run for
    ``role`` (a dense or mixture-of-experts model alike)."""
    if lora.rank == 0:
        return
    for field, what in (
        ("adapter_path", "loading a saved peft adapter"),
        ("exclude_modules", "excluding modules from LoRA"),
    ):
        if getattr(lora, field):
            raise ConfigError(
                f"model.lora.{field}",
                f"{what} is not in the megatron engine (its adapters are its own, on "
                "Megatron's fused projections)",
                f"set {role}.strategy: fsdp2 (peft's LoRA), or remove model.lora.{field}",
            )
    if role == "critic":
        raise ConfigError(
            "model.lora.rank",
            "LoRA on a megatron critic (value model) is not in this build",
            "set critic.strategy: fsdp2 for a LoRA critic, or model.lora.rank: 0",
        )
    if lora.dropout > 0:
        # a dropout mask must match over the TP ranks that share an input; not done here
        raise ConfigError(
            "model.lora.dropout",
            "dropout on the LoRA branch is not in the megatron engine",
            "set it to 0",
        )
    lora_projections(lora.target_modules)
