"""Predicates and value transforms of the verl dialect table (the rule kinds are
:mod:`core.rules`'). Their signature is ``fn(value, ctx)``; ``ctx`` (the translator's context)
gives ``ctx.get(verl_key, default)``, ``ctx.note(why)``, ``ctx.error(reason, fix)`` and
``ctx.key`` (the verl key being translated, as the user wrote it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temper.config.dialects.core.apply import unsupported
from temper.config.dialects.core.rules import Transform

UNSET = "???"  # Hydra's mandatory-value marker, left unresolved by verl's default config


# --------------------------------------------------------------------------- predicates


def when_off(gate: str, off: tuple[Any, ...] = (False, None)) -> Callable[[Any, Any], bool]:
    """Refuse predicate: any value is inert while verl key ``gate`` is off."""
    return lambda _v, ctx: ctx.get(gate, off[0]) in off


def equals(other: str, default: Any = None) -> Callable[[Any, Any], bool]:
    """Refuse predicate: the value repeats verl key ``other`` (or is null)."""
    return lambda v, ctx: v is None or v == ctx.get(other, default)


def same_tokenizer(v: Any, ctx: Any) -> bool:
    model = ctx.get("actor_rollout_ref.model.path")
    tok = ctx.get("actor_rollout_ref.model.tokenizer_path") or ctx.get("data.tokenizer")
    return v is None or v in (model, tok)


def same_dtype(v: Any, ctx: Any) -> bool:
    actor = ctx.get("actor_rollout_ref.actor.fsdp_config.dtype", "bfloat16")
    return v is None or _DTYPES.get(str(v)) == _DTYPES.get(str(actor))


def reward_setting(ctx: Any, legacy: str, new: str, default: Any = None) -> Any:
    """A reward setting of verl 0.9, which keeps the legacy key (``reward_model.enable``,
    …) beside the new one (``reward.reward_model.enable``): a non-null legacy value wins,
    as verl's ``migrate_legacy_reward_impl`` copies it over the new key."""
    value = ctx.get(legacy)
    return ctx.get(new, default) if value is None else value


# --------------------------------------------------------------------------- transforms


def times_n(v: Any, ctx: Any) -> Any:
    """verl counts mini-batches in prompts; temper in samples (prompts × rollout.n)."""
    if v is None:
        return None
    n = ctx.get("actor_rollout_ref.rollout.n", 1)
    if isinstance(v, int) and isinstance(n, int) and n != 1:
        ctx.note(f"ppo_mini_batch_size counts prompts in verl; × rollout.n ({n}) = samples here")
        return v * n
    return v


def per_device(sp_key: str | None) -> Transform:
    """A deprecated *global* micro-batch size -> per device (÷ data-parallel size)."""

    def fn(v: Any, ctx: Any) -> Any:
        if v is None or not isinstance(v, int):
            return v
        devices = ctx.get("trainer.nnodes", 1) * ctx.get("trainer.n_gpus_per_node", 1)
        sp = ctx.get(sp_key, 1) if sp_key else 1
        dp = max(devices // max(sp, 1), 1)
        if v < dp:
            raise ctx.error(
                f"the global micro-batch {v} is smaller than the {dp} data-parallel ranks",
                f"use the *_per_gpu key instead (e.g. {ctx.leaf}_per_gpu: 1)",
            )
        ctx.note(
            f"deprecated global micro-batch sizes are divided by the data-parallel size "
            f"({devices} devices / sequence-parallel {sp} = {dp}), as verl does"
        )
        return v // dp

    return fn


#: verl training engines temper has no counterpart of (``model_engine`` options of verl 0.9
#: and the ``strategy`` their role files set), with their names.
OTHER_TRAINING_ENGINES = {
    "automodel": "NeMo AutoModel",
}


def refuse_other_engine(v: Any, ctx: Any) -> None:
    """Refuse a verl training engine temper does not have, by its name."""
    if v in OTHER_TRAINING_ENGINES:
        raise ctx.error(
            f"verl's {OTHER_TRAINING_ENGINES[v]} training engine ('{v}') is not one temper has",
            "use model_engine: dp, veomni or torchtitan (FSDP2), or model_engine: megatron "
            "(Megatron-Core)",
        )


def strategy(v: Any, ctx: Any) -> Any:
    refuse_other_engine(v, ctx)
    if v in ("fsdp", "fsdp2", "veomni", "torchtitan"):
        if v == "fsdp":
            ctx.note("strategy fsdp (FSDP1) runs as fsdp2 (per-layer fully_shard)")
        if v == "veomni":
            ctx.note(
                "verl's VeOmni engine trains with FSDP2 (per-block fully_shard, Ulysses); "
                "it runs as temper's fsdp2"
            )
        if v == "torchtitan":
            ctx.note(
                "verl's TorchTitan engine trains torchtitan's implementation of the model "
                "with FSDP2; it runs as temper's fsdp2 on the Hugging Face model"
            )
        return "fsdp2"
    if v == "megatron":
        return v
    raise ctx.error(f"unknown strategy '{v}'", "use fsdp, fsdp2 or megatron")


_DTYPES = {
    "bfloat16": "auto",
    "bf16": "auto",
    "auto": "auto",
    "float16": "fp16",
    "fp16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "fp32": "fp32",
    "float": "fp32",
}


def dtype_name(v: Any) -> str | None:
    """The native dtype a verl dtype name means (None for an unknown name)."""
    return _DTYPES.get(str(v))


#: verl's ``PrecisionType`` spellings of a storage dtype (``model_dtype``): always a
#: concrete dtype, so bf16 stays bf16 on every device (unlike a compute ``dtype``).
_PRECISIONS = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "16": "fp16",
    "fp32": "fp32",
    "float32": "fp32",
    "32": "fp32",
}


def precision(strategy_key: str) -> Transform:
    """``model_dtype`` → ``<role>.master_dtype``: verl's FSDP workers load the trained
    module in it; its megatron workers (``strategy_key`` = megatron) never read it."""

    def fn(v: Any, ctx: Any) -> Any:
        if v is None:
            return None
        if str(v) not in _PRECISIONS:
            raise ctx.error(f"unknown dtype '{v}'", "use fp32, bf16 or fp16")
        if ctx.get(strategy_key) == "megatron":
            ctx.note(f"no effect: verl's megatron workers do not read it ({strategy_key})")
            return None
        return _PRECISIONS[str(v)]

    return fn


def reference_storage(v: Any, ctx: Any) -> bool:
    """The reference's ``model_dtype`` changes nothing here when it is fp32 or the
    actor's compute dtype: temper stores the frozen reference in the compute dtype, and
    verl's FSDP casts fp32 weights to that dtype for every forward."""
    actor = ctx.get("actor_rollout_ref.actor.fsdp_config.dtype", "bfloat16")
    got = _PRECISIONS.get(str(v))
    return v is None or got == "fp32" or got == _PRECISIONS.get(str(actor))


def dtype(v: Any, ctx: Any) -> Any:
    if v is None:
        return None
    if str(v) not in _DTYPES:
        raise ctx.error(f"unknown dtype '{v}'", "use bfloat16, float16 or float32")
    out = _DTYPES[str(v)]
    if out == "auto" and v != "auto":
        ctx.note("dtype bfloat16 maps to auto: bf16 on GPU, fp32 on CPU")
    return out


def choice(*valid: str, aliases: dict[str, str] | None = None) -> Transform:
    def fn(v: Any, ctx: Any) -> Any:
        v = (aliases or {}).get(v, v)
        if v is not None and v not in valid:
            raise unsupported(ctx.key, v, valid)
        return v

    return fn


def role_sp(v: Any, ctx: Any) -> Any:
    """A role-level ``ulysses_sequence_parallel_size`` (deprecated since 2026-01). verl's
    legacy workers (``trainer.use_legacy_worker_impl`` auto/enable, the 2026-01 default)
    read only it (``fsdp_workers.py``). Its engine workers (``disable``; verl 0.9, which
    has no such key) read ``fsdp_config.ulysses_sequence_parallel_size``, which a role-level
    size above 1 overrides (``ActorConfig.__post_init__``: "backward compatibility"): there
    its default 1 leaves the size to that key."""
    legacy = ctx.get("trainer.use_legacy_worker_impl") in ("auto", "enable")
    return None if v == 1 and not legacy else v


def optim_strategy(ctx: Any) -> Any:
    """The engine of the role whose ``optim`` key ``ctx`` translates (the SFT trainer's:
    ``engine.strategy``)."""
    role = ctx.path.rsplit("optim.", 1)[0]  # "<role>." (PPO) or "" (SFT)
    return ctx.get(f"{role}strategy") if role else ctx.get("engine.strategy")


def automodel_ignores(v: Any, ctx: Any) -> Any:
    """``num_cycles`` / ``zero_indexed_step``, which verl's AutoModel optimizer config keeps
    for compatibility and its schedule never reads (one cosine half-period, from step 0)."""
    if optim_strategy(ctx) == "automodel":
        ctx.note("no effect: NeMo AutoModel's schedule has one half-period, counted from 0")
        return None
    return v


def warmup_steps(v: Any, ctx: Any) -> Any:
    """``lr_warmup_steps`` (null or -1: ``lr_warmup_steps_ratio`` decides). verl's VeOmni
    engine passes only the ratio to its schedule, so there the steps have no effect."""
    if v is None:
        return -1
    if isinstance(v, int) and v > 0 and optim_strategy(ctx) == "veomni":
        ctx.note("no effect: verl's VeOmni engine warms up by lr_warmup_steps_ratio only")
        return -1
    return v


#: torchtitan's ``TrainingConfig.steps`` default: the total of its schedule in verl's
#: TorchTitan engine (verl passes its own total only to the warmup ratio).
TITAN_STEPS = 10000
#: torchtitan's ``TrainingConfig.max_norm`` default: verl's TorchTitan engine clips at it.
TITAN_MAX_NORM = 1.0


def titan_total(v: Any, ctx: Any) -> Any:
    """``total_training_steps``: under TorchTitan the schedule's total is torchtitan's."""
    if optim_strategy(ctx) != "torchtitan":
        return none_if_negative(v, ctx)
    ctx.note(
        f"verl's TorchTitan engine decays over torchtitan's training.steps ({TITAN_STEPS}), "
        "not over the run's steps"
    )
    return TITAN_STEPS


def titan_warmup_ratio(v: Any, ctx: Any) -> Any:
    """``lr_warmup_steps_ratio``: verl sizes it from the run's steps, which under TorchTitan
    are not the schedule's total, so only ``lr_warmup_steps`` is taken there."""
    if optim_strategy(ctx) != "torchtitan" or not v:
        return v
    o = ctx.path.rsplit(".", 1)[0]
    steps = ctx.get(f"{o}.lr_warmup_steps")
    if isinstance(steps, int) and steps > 0:
        return v  # lr_warmup_steps wins, as in verl
    raise ctx.error(
        f"verl's TorchTitan engine warms up for ratio × the run's steps but decays over "
        f"torchtitan's {TITAN_STEPS}; temper's schedule has one total",
        "set lr_warmup_steps (a number of updates) instead",
    )


def _clip(v: Any, ctx: Any, strategy: Any) -> Any:
    if strategy != "torchtitan":
        return v
    if v != TITAN_MAX_NORM:
        ctx.note(
            f"no effect: verl's TorchTitan engine clips gradients at torchtitan's "
            f"training.max_norm ({TITAN_MAX_NORM})"
        )
    return TITAN_MAX_NORM


def titan_clip(v: Any, ctx: Any) -> Any:
    """``optim.clip_grad``: verl's TorchTitan engine clips at torchtitan's
    ``training.max_norm``."""
    return _clip(v, ctx, optim_strategy(ctx))


def titan_role_clip(strategy_key: str) -> Any:
    """A role's ``grad_clip``, under the engine ``strategy_key`` names (as
    :func:`titan_clip`)."""
    return lambda v, ctx: _clip(v, ctx, ctx.get(strategy_key))


def none_if_negative(v: Any, _ctx: Any) -> Any:
    return None if v is None or (isinstance(v, int | float) and v < 0) else v


def only_true(v: Any, _ctx: Any) -> Any:
    """True sets the field; false leaves it to the other keys that map to it (a setting
    verl keeps per role that temper keeps once: any role's true turns it on)."""
    return True if v else None


def zero_if_none(v: Any, _ctx: Any) -> Any:
    return 0.0 if v is None else v


def file_list(v: Any, ctx: Any) -> Any:
    if v is None:
        return []
    if isinstance(v, str):
        return [v]
    if isinstance(v, list):
        return v
    raise ctx.error(f"expected a path or a list of paths, got {v!r}", "write a path or a list")


def top_k(v: Any, _ctx: Any) -> Any:
    return -1 if v in (0, None) else v


def engine(v: Any, ctx: Any) -> Any:
    return choice("hf", "vllm", "sglang")(v, ctx)


def load_format(v: Any, ctx: Any) -> Any:
    if isinstance(v, str) and v.startswith("dummy"):
        return "dummy"
    if v in ("auto", "hf", "dtensor", "safetensors", "megatron"):
        if v != "auto":
            ctx.note(f"load_format {v}: temper loads the checkpoint with its own loader (auto)")
        return "auto"
    raise ctx.error(f"unknown load_format '{v}'", "use dummy (random init) or auto")


_LOGGERS = {
    "console": "console",
    "wandb": "wandb",
    "tracking": "wandb",
    "tensorboard": "tensorboard",
    "mlflow": "mlflow",
    "swanlab": "swanlab",
    "trackio": "trackio",
}


def trackers(v: Any, ctx: Any) -> Any:
    names = [v] if isinstance(v, str) else list(v or [])
    out = []
    for name in names:
        if isinstance(name, str) and name.startswith("[") and name.endswith("]"):
            # '["console","wandb"]' inside a double-quoted shell variable loses its inner
            # quotes and reaches Hydra as the quoted string '[console,wandb]'
            raise ctx.error(
                f"got the string '{name}', not a list: quotes around the brackets make it one "
                "logger name, which verl's tracking refuses too",
                f"write the list unquoted: trainer.logger={name}",
            )
        if name not in _LOGGERS:
            raise unsupported(ctx.key, name, list(_LOGGERS), "logger")
        if _LOGGERS[name] not in out:
            out.append(_LOGGERS[name])
    if "jsonl" not in out:
        out.append("jsonl")
    ctx.note("trainer.logger: temper always writes metrics.jsonl too; 'tracking' means wandb")
    return out


def sanity_mode(v: Any, ctx: Any) -> Any:
    if v == "ignore_strippable":
        ctx.note("tokenization_sanity_check_mode ignore_strippable runs the strict check")
    return choice("strict", "disable", "ignore_strippable")(v, ctx) != "disable"


def filter_metric(v: Any, ctx: Any) -> Any:
    if v == "acc":
        ctx.note("filter_groups.metric acc: groups are filtered on the score")
    return choice(
        "score",
        "reward",
        aliases={"acc": "score", "seq_reward": "reward", "seq_final_reward": "reward"},
    )(v, ctx)


def entropy_chunk(v: Any, ctx: Any) -> Any:
    """``entropy_from_logits_with_chunking``: true chunks by the sibling
    ``entropy_from_logits_chunk_size`` (verl 0.9; 2048 before it)."""
    if v is True:
        return ctx.get(f"{ctx.path.rsplit('.', 1)[0]}.entropy_from_logits_chunk_size", 2048)
    return 0 if v is False else v


def device(v: Any, ctx: Any) -> Any:
    return choice("auto", "cpu", "cuda")(v, ctx)


def optimizer(v: Any, ctx: Any) -> Any:
    """``AdamW`` (torch class name, FSDP) or Megatron's ``adam``, which decouples weight
    decay (AdamW). torch's ``Adam`` adds weight decay to the gradient instead (L2), so it
    equals AdamW only without weight decay."""
    name = str(v)
    if name.lower() == "adamw":
        return "adamw"
    role = ctx.path.rsplit(".optim.", 1)[0]
    if name.lower() == "adam" and ctx.get(f"{role}.strategy") == "megatron":
        ctx.note("Megatron's adam decouples weight decay: it is AdamW")
        return "adamw"
    if name == "Adam" and not ctx.get(f"{role}.optim.weight_decay", 0.0):
        ctx.note("torch's Adam without weight decay is AdamW without weight decay")
        return "adamw"
    if name == "Adam":
        raise ctx.error(
            "torch.optim.Adam adds weight decay to the gradient (L2); temper's optimizer is "
            "AdamW (decoupled weight decay)",
            "set optimizer: AdamW, or weight_decay: 0",
        )
    return choice("adamw")(name.lower(), ctx)


def router_replay_mode(v: Any, ctx: Any) -> Any:
    """verl's ``router_replay.mode`` → ``actor.router_replay``: ``disabled`` (or null)
    leaves it to the other spelling (``actor.router_replay`` / ``actor.megatron.
    router_replay``) or off; R2 and R3 are temper's (R3's rollout engine is checked at
    pre-flight: ``hf``, or vLLM on a GPU)."""
    if v in (None, "disabled"):
        return None
    if v not in ("R2", "R3"):
        raise ctx.error(f"'{v}' is not a router replay mode", "use disabled, R2 or R3")
    return v
