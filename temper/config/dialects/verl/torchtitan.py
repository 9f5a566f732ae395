"""The verl key table: verl 0.9's TorchTitan training engine (``model_engine: torchtitan``;
the SFT trainer's ``engine=torchtitan``).

verl's TorchTitan engine (``verl/workers/engine/torchtitan``) builds torchtitan's own
implementation of the model family, loads the Hugging Face weights into it, and trains it
with FSDP2 over ``data_parallel_shard_size`` ranks (HSDP with
``data_parallel_replicate_size`` replicas), bf16 compute over fp32 weights. temper's
``fsdp2`` engine trains the Hugging Face model the same way, so a TorchTitan role runs
there; the attention kernel, activation checkpointing mode and ``torch.compile`` change
speed and memory only and are noted. Refused by name: tensor, pipeline, context and expert
parallelism (temper's are Megatron's) and a value model (verl registers the engine for
language models only, so its critic cannot run on it).

What verl's engine takes from torchtitan's defaults rather than from the verl file is
reproduced, not guessed:

- the schedule is torchtitan's ``LambdaLR`` over its ``training.steps`` (10000, which verl
  never sets): warmup ``(s + 1) / W`` at update ``s`` (from 0), then ``decay_type``
  (linear, sqrt or cosine) from ``(s - W) / (T - W)`` down to ``min_lr_factor``
  (``optim.warmup_from_one`` with ``zero_indexed_step``, ``total_training_steps: 10000``);
- gradients are clipped at torchtitan's ``training.max_norm`` (1.0), whatever
  ``clip_grad`` or ``grad_clip`` say.
"""

from __future__ import annotations

from typing import Any

from temper.config.dialects.core.rules import Call, Map, Note, Refuse, Rule
from temper.config.dialects.verl import transforms as r
from temper.config.dialects.verl.fsdp_family import (
    compile_and_entropy,
    no_parallelism,
    strategy_and_offload,
)
from temper.config.dialects.verl.table import INTERNAL, PERF

UNREAD = "not read by verl's TorchTitan engine"


def _one(what: str) -> Refuse:
    return no_parallelism(what, "TorchTitan", "model_engine: megatron")


def _reshard(v: Any, ctx: Any) -> Any:
    """torchtitan's ``fsdp_reshard_after_forward``: ``default`` and ``always`` free the
    gathered parameters after the forward (without pipeline parallelism), ``never`` keeps
    them."""
    return r.choice("default", "always", "never")(v, ctx) != "never"


def _devices(ctx: Any) -> int:
    return int(ctx.get("trainer.nnodes", 1) or 1) * int(ctx.get("trainer.n_gpus_per_node", 1) or 1)


def _sharding(section: str) -> Any:
    """``data_parallel_shard_size`` × ``data_parallel_replicate_size``: torchtitan's mesh,
    which must cover the role's ranks; a shard group smaller than them is HSDP
    (``fsdp_size``)."""

    def fn(v: Any, ctx: Any) -> Any:
        replicas = ctx.get(f"{section}.data_parallel_replicate_size", 1) or 1
        devices = _devices(ctx)
        if not isinstance(v, int) or v < 1:
            raise ctx.error(
                f"verl's TorchTitan engine counts its data-parallel ranks as shard × replicate "
                f"sizes, so a shard size of {v!r} gives none",
                f"set it to the devices per replica ({devices // max(1, int(replicas))})",
            )
        if v * replicas != devices:
            raise ctx.error(
                f"data_parallel_shard_size {v} × data_parallel_replicate_size {replicas} = "
                f"{v * replicas} ranks, but the role runs on {devices} devices (trainer.nnodes "
                "× n_gpus_per_node): torchtitan's mesh must cover them",
                f"set data_parallel_shard_size={devices // replicas if devices % replicas == 0 else devices}",
            )
        return None if replicas == 1 else v

    return fn


def torchtitan_engine(prefix: str, role: str) -> dict[str, Rule]:
    """``<role>.torchtitan`` (``TorchtitanEngineConfig``) of the actor, reference or critic
    (``role``: the native role; the SFT trainer's ``engine`` is the actor's)."""
    f = f"{role}.fsdp"
    trained = role != "reference"
    rules: dict[str, Rule] = {
        **strategy_and_offload(prefix, role),
        f"{prefix}.offload_policy": (
            Map(f"{f}.offload_policy") if trained else Note("the reference is offloaded whole")
        ),
        f"{prefix}.reshard_after_forward": Map(f"{f}.reshard_after_forward", _reshard),
        f"{prefix}.data_parallel_shard_size": (
            Map(f"{f}.fsdp_size", _sharding(prefix))
            if trained
            else Note("the reference shards as the actor does")
        ),
        f"{prefix}.data_parallel_replicate_size": Note(
            "read with data_parallel_shard_size (replicas of a shard group: HSDP)"
        ),
        f"{prefix}.data_parallel_size": Note(UNREAD),
        f"{prefix}.tensor_parallel_size": _one("tensor parallelism"),
        f"{prefix}.pipeline_parallel_size": _one("pipeline parallelism"),
        f"{prefix}.context_parallel_size": _one("context parallelism"),
        f"{prefix}.expert_parallel_size": _one("expert parallelism"),
        f"{prefix}.attn_type": Note(
            "torchtitan's attention kernel (flex, flex_flash, varlen): exact attention, "
            "as temper's SDPA"
        ),
        f"{prefix}.spmd_backend": Note("how torchtitan lays out its sharded tensors; " + PERF),
        f"{prefix}.activation_checkpoint": Note(
            "which activations torchtitan recomputes; the gradients are the same "
            "(temper's: model.enable_gradient_checkpointing)"
        ),
        f"{prefix}.max_seq_len": Note(
            "the length of torchtitan's RoPE cache; the Hugging Face model computes "
            "positions for any length"
        ),
        f"{prefix}.seed": Map("experiment.seed", weak=True),
        # process-wide in temper: true on any role turns it on for the run
        f"{prefix}.full_determinism": Map("experiment.deterministic", r.only_true),
        f"{prefix}.forward_only": Note(INTERNAL),
        f"{prefix}.entropy_checkpointing": Note(PERF),
        f"{prefix}.entropy_from_logits_chunk_size": Note(PERF),
        # TorchtitanEngineConfig keeps the FSDP engine's fields; its engine reads none of
        # them (torchtitan wraps every block, computes in bf16 over fp32 weights)
        **{
            f"{prefix}.{k}": Note(UNREAD)
            for k in (
                "wrap_policy",
                "forward_prefetch",
                "use_orig_params",
                "mixed_precision",
                "dtype",
            )
        },
    }
    return rules | compile_and_entropy(prefix, role)


def torchtitan_critic(prefix: str) -> dict[str, Rule]:
    """``critic.torchtitan``: verl registers its TorchTitan engine for language models
    only, so a critic on it is refused (where verl builds a critic), and the section is
    read by nothing otherwise."""
    unread = Note("read by a TorchTitan critic only; this critic runs on another engine")
    rules: dict[str, Rule] = {k: unread for k in torchtitan_engine(prefix, "critic")}
    rules[f"{prefix}.strategy"] = Refuse(
        "verl registers its TorchTitan engine for language models only: a value model "
        "(the critic) cannot run on it",
        "set critic.strategy: fsdp (verl's dp engine), or an estimator without a critic",
        ok=lambda _v, ctx: ctx.get("critic.strategy") != "torchtitan",
        why="read by a TorchTitan critic only; this critic runs on another engine",
    )
    return rules


def _titan_only(strategy: str, fn: Any) -> Any:
    """``fn`` where the role runs on TorchTitan; elsewhere the key is read by nothing."""

    def call(v: Any, ctx: Any) -> None:
        if ctx.get(strategy) != "torchtitan":
            ctx.inert("read by verl's TorchTitan engine only")
            return
        fn(v, ctx)

    return call


def _schedule(role: str) -> Any:
    """``decay_type``: torchtitan's ``LambdaLR`` as temper's schedule (module doc)."""

    def fn(v: Any, ctx: Any) -> None:
        o = f"{role}.optim"
        ctx.write(f"{o}.lr_scheduler", r.choice("linear", "sqrt", "cosine")(v, ctx))
        ctx.write(f"{o}.warmup_from_one", True)
        ctx.write(f"{o}.zero_indexed_step", True)
        ctx.write(f"{o}.num_cycles", 0.5)
        floor = ctx.get(f"{ctx.path.rsplit('.', 1)[0]}.min_lr_factor")
        ctx.write(f"{o}.min_lr_ratio", 0.0 if floor is None else float(floor))

    return fn


def _name(v: Any, ctx: Any) -> None:
    """torchtitan's optimizer name: AdamW (Adam only without weight decay, where the two
    are the same update)."""
    name = str(v).lower()
    decay = ctx.get(f"{ctx.path.rsplit('.', 1)[0]}.weight_decay")
    if name == "adamw" or (name == "adam" and not decay):
        ctx.note("torchtitan's AdamW is temper's optimizer (optim.optimizer: adamw)")
        return
    why = " (Adam adds weight decay to the gradient, AdamW decouples it)" if name == "adam" else ""
    raise ctx.error(f"torchtitan's optimizer {v!r} is not AdamW{why}", "set name: AdamW")


def torchtitan_optim(o: str, role: str, strategy: str) -> dict[str, Rule]:
    """``TorchtitanOptimizerConfig``'s own keys (section ``o``; ``strategy``: the key that
    names the role's engine). Its shared keys (``lr``, ``betas``, warmup, total,
    ``clip_grad``) go through the shared optimizer rules, which read their TorchTitan
    values through :func:`~temper.config.dialects.verl.transforms.titan_total`,
    ``titan_warmup_ratio`` and ``titan_clip``."""
    return {
        f"{o}.name": Call(_titan_only(strategy, _name)),
        # decay_type writes the whole schedule, its floor (min_lr_factor) included
        f"{o}.decay_type": Call(_titan_only(strategy, _schedule(role))),
        f"{o}.min_lr_factor": Note("read with decay_type (the floor of the decay)"),
    }
