"""verl's Megatron keys (``ppo_megatron_trainer.yaml``): the ``megatron`` sections of the
actor, reference, critic and reward model (verl's ``McoreEngineConfig``), the workers'
``load_weight`` and the rollout's ``layer_name_map`` — what each becomes here. The
reward model's section becomes ``reward.model.megatron`` (a frozen role, as the
reference).

Parallel degrees and memory options map onto the role's native ``megatron`` section,
whose engine says at ``check`` what this machine cannot run or apply
(:mod:`temper.training.megatron_check`). ``override_transformer_config`` is split: the
recompute keys have native fields, ``attention_backend`` is chosen by temper, anything
else goes to ``megatron.extra`` (Megatron-Core ``TransformerConfig`` arguments, checked
against Megatron's fields when the engine is built).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temper.config.dialects.core.rules import Call, Map, Note, Refuse, Rule
from temper.config.dialects.verl import transforms as r
from temper.config.schema import MEGATRON_DEGREES

A = "actor_rollout_ref"
ACT, REF, RO, CR, RM = f"{A}.actor", f"{A}.ref", f"{A}.rollout", "critic", "reward_model"

MBRIDGE = "temper converts Hugging Face ↔ Megatron weights itself (no mbridge)"
PADDING = "the megatron engine trims each micro-batch's padding itself"
INTERNAL = "verl-internal wiring with no counterpart here"
DEGREES = MEGATRON_DEGREES
RECOMPUTE = (
    "recompute_granularity",
    "recompute_method",
    "recompute_num_layers",
    "recompute_modules",
)
DDP_KEYS = ("overlap_grad_reduce", "overlap_param_gather", "use_distributed_optimizer")


def _transformer_overrides(native: str, trained: bool) -> Call:
    """``override_transformer_config``: recompute keys → native fields, the rest → extra."""

    def fn(value: Any, ctx: Any) -> None:
        if not value:
            ctx.note("empty: no TransformerConfig overrides")
            return
        if not isinstance(value, dict):
            raise ctx.error(f"expected a mapping of TransformerConfig fields, got {value!r}", "")
        extra: dict[str, Any] = {}
        for key, v in value.items():
            leaf = f"{ctx.key}.{key}"
            if key in RECOMPUTE:
                if not trained:
                    if v not in (None, [], ["core_attn"]):
                        ctx.note("no effect here (a frozen model keeps no activations)", leaf)
                    continue
                ctx.write(f"{native}.{key}", v, leaf)
            elif key == "attention_backend":
                ctx.note(
                    "no effect here (temper picks the attention kernel: TransformerEngine's "
                    "on CUDA when installed, else torch SDPA)",
                    leaf,
                )
            else:
                extra[key] = v
        if extra:
            ctx.write(f"{native}.extra", extra)

    return Call(fn)


def _dist_init(p: str, native: str) -> Callable[[Any, Any], None]:
    """``use_dist_checkpointing``: start from the Megatron distributed checkpoint at
    ``dist_checkpointing_path`` (``megatron.dist_checkpoint_path``) instead of converting
    ``model.path``."""

    def fn(v: Any, ctx: Any) -> None:
        if not v:
            ctx.note("initial weights come from model.path (converted from Hugging Face format)")
            return
        if not ctx.get(f"{p}.dist_checkpointing_path"):
            raise ctx.error(
                "the Megatron distributed checkpoint to start from is not given",
                f"set {p}.dist_checkpointing_path (verl's converter_hf_to_mcore.py output)",
            )
        ctx.note(f"initial weights from {native}.dist_checkpoint_path (model.path: architecture)")

    return fn


def _dist_key(p: str, native: str) -> Callable[[Any, Any], None]:
    """``dist_checkpointing_path`` / ``_prefix``: read while ``use_dist_checkpointing`` is on."""

    def fn(v: Any, ctx: Any) -> None:
        if not ctx.get(f"{p}.use_dist_checkpointing"):
            ctx.note("no effect here (use_dist_checkpointing is off)")
        elif v is not None:
            ctx.write(native, v)

    return fn


def _none_string(value: Any, ctx: Any) -> Any:
    """verl's 2025 megatron trainer file writes the reference's ``expert_tensor_parallel_size:
    None`` (a string to YAML); verl's Python config then reads it as None."""
    if value == "None":
        ctx.note("'None' (a string in this verl file) read as null, as verl does")
        return None
    return value


def _engine(prefix: str, role: str, section: str | None = None) -> dict[str, Rule]:
    """``{prefix}.megatron.*`` (or ``{section}.*``: verl 0.9's SFT ``engine`` group) of a
    role whose native section is ``{role}.megatron``."""
    p, native = section or f"{prefix}.megatron", f"{role}.megatron"
    trained = role not in ("reference", "reward.model")
    no_grads = f"the {role.replace('.', ' ')} has no gradients"
    rules: dict[str, Rule] = {
        f"{p}.{k}": Map(f"{native}.{k}", _none_string) for k in (*DEGREES, "sequence_parallel")
    }
    rules |= {
        f"{p}.use_distributed_optimizer": (
            Map(f"{native}.use_distributed_optimizer")
            if trained
            else Note(f"the {role.replace('.', ' ')} has no optimizer")
        ),
        f"{p}.use_dist_checkpointing": Call(_dist_init(p, native)),
        f"{p}.dist_checkpointing_path": Call(_dist_key(p, f"{native}.dist_checkpoint_path")),
        f"{p}.dist_checkpointing_prefix": Call(_dist_key(p, f"{native}.dist_checkpoint_prefix")),
        f"{p}.seed": Note(
            "Megatron's RNG tracker is seeded from experiment.seed; it only feeds dropout "
            "and initialization, and weights come from the checkpoint"
        ),
        f"{p}.override_transformer_config": _transformer_overrides(native, trained),
        f"{p}.override_mcore_model_config": Refuse(
            "Megatron model-config overrides are not supported",
            "use actor_rollout_ref.model.override_config (applied to the HF config)",
            ok=(None, {}),
            why="the model's architecture comes from its Hugging Face config",
        ),
        f"{p}.use_mbridge": Note(MBRIDGE),
        f"{p}.vanilla_mbridge": Note(MBRIDGE),
        f"{p}.use_remove_padding": Note(PADDING),
        f"{p}.forward_only": Note(INTERNAL),
    }
    if trained:
        rules |= {
            f"{p}.{k}": Map(f"{native}.{k}")
            for k in ("param_offload", "grad_offload", "optimizer_offload")
        }
        rules |= {f"{p}.override_ddp_config.{k}": Map(f"{native}.{k}") for k in DDP_KEYS}
        rules |= {
            f"{p}.override_ddp_config.grad_reduce_in_fp32": Note("gradients are reduced in fp32"),
            f"{p}.override_ddp_config.bucket_size": Note(
                "gradients are all-reduced in one bucket per dtype"
            ),
            f"{p}.override_ddp_config.average_in_collective": Note(
                "losses are partial sums of the global loss; gradients are summed"
            ),
        }
    else:
        offload = "reference.param_offload" if role == "reference" else f"{native}.param_offload"
        rules |= {
            f"{p}.param_offload": Map(offload),
            f"{p}.grad_offload": Note(no_grads),
            f"{p}.optimizer_offload": Note(f"the {role.replace('.', ' ')} has no optimizer"),
            f"{p}.override_ddp_config": Note(no_grads),
        }
    if role == "actor":
        rules[f"{p}.dtype"] = Map("model.dtype", r.dtype, weak=True)
    else:
        rules[f"{p}.dtype"] = Refuse(
            "temper uses one compute dtype (model.dtype) for every role",
            f"set it equal to {ACT}.megatron.dtype",
            ok=_same_dtype,
            why="the same compute dtype as the actor: model.dtype",
        )
    rules[f"{prefix}.load_weight"] = Refuse(
        "load_weight: false (randomly initialized weights) is not supported",
        "set load_weight: true",
        ok=(True, None),
        why="weights load from the model path",
    )
    return rules


def _same_dtype(v: Any, ctx: Any) -> bool:
    actor = ctx.get(f"{ACT}.megatron.dtype", ctx.get(f"{ACT}.fsdp_config.dtype", "bfloat16"))
    return v is None or r.dtype_name(v) == r.dtype_name(actor)


def megatron_rules() -> dict[str, Rule]:
    """Every verl Megatron key this dialect knows (see the module doc)."""
    return {
        **_engine(ACT, "actor"),
        **_engine(REF, "reference"),
        **_engine(CR, "critic"),
        **_engine(RM, "reward.model"),
        f"{RO}.layer_name_map": Note(
            "weight sync maps Megatron names to Hugging Face names itself"
        ),
    }


# verl's ``${oc.select:actor_rollout_ref.actor.megatron.X, …}`` defaults of the reference
MEGATRON_INHERIT: list[tuple[str, str]] = [
    (f"{REF}.megatron.{k}", f"{ACT}.megatron.{k}") for k in DEGREES
]
