"""The verl key table: verl 0.9's VeOmni training engine (``model_engine: veomni``).

VeOmni's engine (``verl/workers/engine/veomni``) trains the Hugging Face model with
PyTorch FSDP2 — per-block ``fully_shard``, optional HSDP (``fsdp_size``), Ulysses
sequence parallelism, fp32 master weights with bf16 compute — which is what temper's
``fsdp2`` engine does; a VeOmni role therefore runs on ``fsdp2``. What VeOmni adds on
top is either a kernel choice with the same math (fused MoE, Liger/Triton/fla kernels,
flash attention), noted here, or something temper does not do, refused by name:

- ``expert_parallel_size`` > 1: experts sharded over FSDP ranks (temper's expert
  parallelism is Megatron's);
- ``attn_implementation: native-sparse``: a sparse attention, not the model's own;
- its own checkpoints (``load_checkpoint_path``);
- its learning-rate schedule where it differs from temper's: a warmup that starts above
  zero (``lr_start``) or a decay that ends before the last step (``lr_decay_ratio``).
  Otherwise it is temper's schedule (``veomni.optim.lr_scheduler``: warmup
  ``int(ratio · T)`` steps, cosine to ``lr_min`` with one half-period) with
  ``min_lr_ratio = lr_min / lr``.
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core.rules import Map, Note, Refuse, Rule
from temper.config.dialects.verl import transforms as r
from temper.config.dialects.verl.fsdp_family import compile_and_entropy, strategy_and_offload
from temper.config.dialects.verl.table import INTERNAL, PERF, _router_replay

#: Attention kernels that compute exact softmax attention over the whole row, as the
#: model's own SDPA does (``veomni_*_with_sp``: flash attention inside VeOmni's Ulysses).
EXACT_ATTENTION = (
    "eager",
    "sdpa",
    "flash_attention_2",
    "flash_attention_3",
    "veomni_flash_attention_2_with_sp",
    "veomni_flash_attention_3_with_sp",
)
#: ``VeOmniEngineConfig``'s kernel choices (``OpsImplementationConfig``): each picks an
#: implementation of the same operation (eager, Liger, Triton, fla, tilelang, NPU).
KERNELS = (
    "moe_implementation",
    "cross_entropy_loss_implementation",
    "rms_norm_implementation",
    "swiglu_mlp_implementation",
    "rotary_pos_emb_implementation",
    "rms_norm_gated_implementation",
    "causal_conv1d_implementation",
    "chunk_gated_delta_rule_implementation",
    "load_balancing_loss_implementation",
    "dsa_indexer_implementation",
    "dsa_attention_implementation",
    "mhc_implementation",
)
KERNEL = "a kernel choice: the same operation, computed by temper's model code"
CHECKPOINT = "the layout of VeOmni's own checkpoints; temper writes its own format"


def mixed_precision(v: Any, _ctx: Any) -> Any:
    """``mixed_precision``: true keeps fp32 master weights and computes in bf16 (temper's
    FSDP2 default, ``master_dtype: fp32``); false loads and trains the weights in bf16."""
    return None if v in (True, None) else "bf16"


def veomni_engine(prefix: str, role: str) -> dict[str, Rule]:
    """``<role>.veomni`` (``VeOmniEngineConfig``) of the actor, reference or critic."""
    f = f"{role}.fsdp"
    trained = role != "reference"
    sp = f"{role}.ulysses_sequence_parallel_size"
    rules: dict[str, Rule] = {
        **strategy_and_offload(prefix, role),
        f"{prefix}.fsdp_size": Map(f"{f}.fsdp_size"),
        f"{prefix}.enable_full_shard": Map(f"{f}.reshard_after_forward"),
        f"{prefix}.enable_fsdp_offload": Map(f"{f}.offload_policy"),
        f"{prefix}.expert_parallel_size": Refuse(
            "expert parallelism over FSDP ranks is not supported: temper shards experts "
            "with its Megatron engine",
            "set expert_parallel_size: 1, or model_engine: megatron with "
            "expert_model_parallel_size",
            ok=(1, None),
            why="every rank holds all experts (sharded by FSDP)",
        ),
        f"{prefix}.seed": Map("experiment.seed", weak=True),
        # process-wide in temper: true on any role turns it on for the run
        f"{prefix}.full_determinism": Map("experiment.deterministic", r.only_true),
        f"{prefix}.attn_implementation": Refuse(
            "only exact attention is supported: a sparse attention computes another model",
            "use flash_attention_2 (or sdpa)",
            ok=EXACT_ATTENTION,
            why="exact attention; temper picks the kernel (SDPA, or its Ulysses kernel)",
        ),
        **{f"{prefix}.{k}": Note(KERNEL) for k in KERNELS},
        f"{prefix}.force_use_huggingface": Note(
            "temper always builds the model with Hugging Face transformers"
        ),
        f"{prefix}.init_device": Note(PERF),
        f"{prefix}.forward_prefetch": Note(PERF),
        f"{prefix}.basic_modules": Note("FSDP wrap units; temper wraps every decoder layer"),
        f"{prefix}.activation_gpu_limit": Note(PERF),
        f"{prefix}.enable_reentrant": Note(
            "which gradient-checkpointing variant recomputes the layers; the gradients are the same"
        ),
        f"{prefix}.pad_to_length": Note(PERF),
        f"{prefix}.pad_to_length_bucket": Note(PERF),
        f"{prefix}.entropy_checkpointing": Note(PERF),
        f"{prefix}.forward_only": Note(INTERNAL),
        f"{prefix}.ckpt_manager": Note(CHECKPOINT),
        f"{prefix}.load_checkpoint_path": Refuse(
            "starting from a VeOmni checkpoint is not supported",
            "start from the Hugging Face model (model.path), or resume from a temper "
            "checkpoint (trainer.resume_mode)",
            ok=(None, ""),
            why="no VeOmni checkpoint to load",
        ),
        **_router_replay(f"{prefix}", actor=role == "actor"),
    }
    if trained:
        rules |= {
            f"{prefix}.mixed_precision": Map(f"{role}.master_dtype", mixed_precision),
            f"{prefix}.ulysses_parallel_size": Map(sp),
        }
    else:
        rules |= {
            f"{prefix}.mixed_precision": Note(
                "the reference is stored in the compute dtype (model.dtype)"
            ),
            f"{prefix}.ulysses_parallel_size": Refuse(
                "the reference runs with the actor's sequence parallelism",
                "set it equal to actor_rollout_ref.actor.veomni.ulysses_parallel_size",
                ok=r.equals("actor_rollout_ref.actor.veomni.ulysses_parallel_size", 1),
                why="the reference uses the actor's sequence parallelism",
            ),
        }
    return rules | compile_and_entropy(prefix, role)


def _lr_min(o: str, strategy: str) -> Any:
    def fn(v: Any, ctx: Any) -> Any:
        lr = ctx.get(f"{o}.lr", 0.0)
        if not v:
            return None
        if ctx.get(strategy) != "veomni":
            raise ctx.error(
                "read by verl's VeOmni engine only", "set min_lr_ratio (a fraction of lr)"
            )
        if not lr:
            raise ctx.error("lr_min needs a positive lr to be a fraction of", "set optim.lr")
        if ctx.get(f"{o}.lr_scheduler_type") == "linear":
            raise ctx.error(
                "VeOmni's linear schedule floors at lr_min (max(lr_min, decay)) where "
                "temper's decays onto it (lr_min + (lr - lr_min)·decay)",
                "set lr_min: 0, or lr_scheduler_type: cosine",
            )
        return v / lr

    return fn


def veomni_optim(o: str, role: str, strategy: str) -> dict[str, Rule]:
    """``VeOmniOptimizerConfig``'s keys (section ``o``) beyond verl's shared optimizer
    keys; ``strategy`` is the key that names the role's engine."""
    other = lambda _v, ctx: ctx.get(strategy) != "veomni"  # noqa: E731
    return {
        f"{o}.lr_min": Map(f"{role}.optim.min_lr_ratio", _lr_min(o, strategy)),
        f"{o}.lr_start": Refuse(
            "temper's warmup starts at 0",
            "set lr_start: 0",
            ok=lambda v, ctx: other(v, ctx) or not v,
            why="the warmup starts at 0",
        ),
        f"{o}.lr_decay_ratio": Refuse(
            "temper's decay lasts until the last optimizer step",
            "set lr_decay_ratio: 1.0",
            ok=lambda v, ctx: other(v, ctx) or v in (1, 1.0, None),
            why="the decay lasts until the last step",
        ),
    }
