"""The verl key table: verl 0.9's NeMo AutoModel engine (the SFT trainer's ``engine=automodel``).

AutoModel's engine (``verl/workers/engine/automodel``) trains the Hugging Face model with
PyTorch FSDP2 (or DDP), optional HSDP (``dp_replicate_size``), and a mixed-precision policy
of bf16 parameters with fp32 reduction — what temper's ``fsdp2`` engine does, so an
AutoModel role runs on ``fsdp2``. Its ``backend_config`` picks kernels (TransformerEngine
or PyTorch linear, attention, norms, grouped-GEMM experts, DeepEP dispatch) for the same
operations, noted here; what temper does not do is refused by name: tensor, pipeline,
context and expert parallelism (temper's are Megatron's), Megatron-FSDP, FP8, a fake
balanced gate.

Its optimizer's schedule is NeMo AutoModel's ``OptimizerParamScheduler`` (Megatron's): a
linear warmup from ``init_lr = lr · init_lr_ratio`` over ``W`` steps, then constant, linear
or cosine decay to ``lr · min_lr_ratio`` at the last step, counted from step 0 — temper's
schedule when the warmup starts at 0 (``init_lr_ratio`` 0, or no warmup).
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core.rules import Call, Map, Note, Refuse, Rule
from temper.config.dialects.verl import transforms as r
from temper.config.dialects.verl.fsdp_family import MEGATRON, no_parallelism
from temper.config.dialects.verl.table import INTERNAL, PERF

KERNEL = "a kernel choice: the same operation, computed by temper's model code"


def _one(what: str) -> Refuse:
    return no_parallelism(what, "AutoModel", "engine=megatron")


def strategy(v: Any, ctx: Any) -> Any:
    """``strategy: automodel`` (the SFT trainer's engine; verl's RL roles have no AutoModel
    files, where :func:`~temper.config.dialects.verl.transforms.strategy` refuses it)."""
    if v != "automodel":
        return r.strategy(v, ctx)
    ctx.note("verl's NeMo AutoModel engine trains with FSDP2; it runs as temper's fsdp2")
    return "fsdp2"


def distributed_strategy(v: Any, ctx: Any) -> None:
    """``fsdp2``; ``ddp`` (replicated weights) computes the same gradients as FSDP2, which
    shards them; Megatron-FSDP is refused."""
    if v == "ddp":
        ctx.note("DDP's gradients are FSDP2's (which shards the weights): it runs as fsdp2")
    elif v not in ("fsdp2", None):
        raise ctx.error(
            f"AutoModel's {v} data parallelism is not supported", "set distributed_strategy: fsdp2"
        )


def replicas(v: Any, ctx: Any) -> Any:
    """``dp_replicate_size`` replicas of a sharding group (HSDP) -> ``fsdp_size``, the
    ranks one group shards over: the devices ÷ replicas."""
    if v in (1, None):
        return None
    devices = ctx.get("trainer.nnodes", 1) * ctx.get("trainer.n_gpus_per_node", 1)
    if not isinstance(v, int) or v < 1 or devices % v:
        raise ctx.error(
            f"{v} replicas do not divide the {devices} devices", "use a divisor of the devices"
        )
    return devices // v


def model_dtype(v: Any, ctx: Any) -> Any:
    """The dtype AutoModel loads the trained weights in (its master weights)."""
    if v == "auto":
        raise ctx.error(
            "'auto' takes the checkpoint's dtype, which temper does not read from the file here",
            "set model_dtype: fp32 (or bf16)",
        )
    return r.precision("engine.strategy")(v, ctx)


def automodel_engine(prefix: str, role: str) -> dict[str, Rule]:
    """``AutomodelEngineConfig`` at ``prefix`` (the SFT trainer's ``engine``)."""
    f = f"{role}.fsdp"
    b, m = f"{prefix}.backend_config", f"{prefix}.moe_config"
    return {
        f"{prefix}.strategy": Map(f"{role}.strategy", strategy, weak=True),
        f"{prefix}.distributed_strategy": Call(distributed_strategy),
        f"{prefix}.tp_size": _one("tensor parallelism"),
        f"{prefix}.pp_size": _one("pipeline parallelism"),
        f"{prefix}.cp_size": _one("context parallelism"),
        f"{prefix}.ep_size": _one("expert parallelism"),
        f"{prefix}.sequence_parallel": Refuse(
            "sequence parallelism of a tensor-parallel plan needs tensor parallelism: " + MEGATRON,
            "set sequence_parallel: false",
            ok=(False, None),
            why="no tensor parallelism to pair it with",
        ),
        f"{prefix}.dp_replicate_size": Map(f"{f}.fsdp_size", replicas),
        f"{prefix}.defer_fsdp_grad_sync": Note(PERF),
        f"{prefix}.param_offload": Map(f"{f}.param_offload"),
        f"{prefix}.optimizer_offload": Map(f"{f}.optimizer_offload"),
        f"{prefix}.activation_checkpointing": Map(
            "model.enable_gradient_checkpointing", r.only_true
        ),
        f"{prefix}.enable_fp8": Refuse(
            "FP8 training is not supported",
            "set enable_fp8: false",
            ok=(False, None),
            why="training computes in model.dtype",
        ),
        f"{prefix}.enable_compile": Map(f"{role}.use_torch_compile", r.only_true),
        f"{prefix}.use_torch_compile": Map(f"{role}.use_torch_compile", weak=True),
        f"{prefix}.model_dtype": Map(f"{role}.master_dtype", model_dtype),
        f"{prefix}.attn_implementation": Note(
            "exact attention (TransformerEngine's, flash or SDPA); temper picks the kernel"
        ),
        f"{prefix}.mp_param_dtype": Map("model.dtype", r.dtype, weak=True),
        f"{prefix}.mp_reduce_dtype": Refuse(
            "gradients are reduced in fp32",
            "set mp_reduce_dtype: fp32",
            ok=("fp32", "float32", None),
            why="gradients are reduced in fp32",
        ),
        f"{prefix}.mp_output_dtype": Note("the dtype of the sharded module's outputs; " + PERF),
        **{
            f"{b}.{k}": Note(KERNEL)
            for k in (
                "attn",
                "linear",
                "rms_norm",
                "rope_fusion",
                "dispatcher",
                "experts",
                "gate_precision",
                "enable_hf_state_dict_adapter",
                "enable_fsdp_optimizations",
            )
        },
        f"{b}.fake_balanced_gate": Refuse(
            "a fake balanced gate ignores the router (a benchmarking aid)",
            "set fake_balanced_gate: false",
            ok=(False, None),
            why="the model's router routes",
        ),
        f"{b}.fake_gate_noise": Refuse(
            "a fake balanced gate ignores the router (a benchmarking aid)",
            "set fake_gate_noise: 0",
            ok=(0, 0.0, None),
            why="the model's router routes",
        ),
        f"{m}.ignore_router_for_ac": Note(PERF),
        f"{m}.reshard_after_forward": Note(PERF),
        f"{m}.wrap_outer_model": Note(PERF),
        f"{m}.lm_head_precision": Refuse(
            "the LM head computes in the model's compute dtype",
            "set lm_head_precision: null",
            ok=(None,),
            why="the LM head computes in the model's compute dtype",
        ),
        f"{prefix}.seed": Map("experiment.seed", weak=True),
        f"{prefix}.full_determinism": Map("experiment.deterministic", r.only_true),
        f"{prefix}.forward_only": Note(INTERNAL),
        f"{prefix}.entropy_from_logits_with_chunking": Map(
            "actor.entropy_chunk_size", r.entropy_chunk, weak=True
        ),
        f"{prefix}.entropy_from_logits_chunk_size": Note(PERF),
        f"{prefix}.entropy_checkpointing": Note(PERF),
    }


def _warmup_from_zero(o: str, strategy_key: str) -> Any:
    def ok(v: Any, ctx: Any) -> bool:
        if v in (0, 0.0, None) or ctx.get(strategy_key) != "automodel":
            return True
        steps = ctx.get(f"{o}.lr_warmup_steps", -1)
        ratio = ctx.get(f"{o}.lr_warmup_steps_ratio", 0.0)
        return not (steps and steps > 0) and not ratio  # no warmup: init_lr is never used

    return ok


def automodel_optim(o: str, strategy_key: str) -> dict[str, Rule]:
    """``AutomodelOptimizerConfig``'s keys (section ``o``) beyond verl's shared optimizer
    keys; ``strategy_key`` names the role's engine."""
    return {
        f"{o}.init_lr_ratio": Refuse(
            "temper's warmup starts at 0",
            "set init_lr_ratio: 0",
            ok=_warmup_from_zero(o, strategy_key),
            why="the warmup starts at 0 (or there is none)",
        ),
        f"{o}.wd_incr_style": Refuse(
            "a weight-decay schedule is not supported",
            "set wd_incr_style: constant",
            ok=("constant", None),
            why="weight decay is constant",
        ),
        f"{o}.master_weights": Refuse(
            "TransformerEngine's FusedAdam master weights are not supported",
            "set master_weights: false",
            ok=(False, None),
            why="the optimizer steps the trained weights in their master dtype",
        ),
        f"{o}.store_param_remainders": Refuse(
            "TransformerEngine's FusedAdam parameter remainders are not supported",
            "set store_param_remainders: false",
            ok=(False, None),
            why="read by TransformerEngine's FusedAdam only",
        ),
        **{
            f"{o}.{k}": Refuse(
                "optimizer state in another dtype than the master weights is not supported",
                "set it to null",
                ok=(None,),
                why="the optimizer state has the master weights' dtype",
            )
            for k in ("exp_avg_dtype", "exp_avg_sq_dtype", "master_weight_dtype")
        },
    }
