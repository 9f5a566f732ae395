"""What a megatron role can run on this machine, checked before any model loads.

``temper check`` calls :func:`check_megatron` on the whole config; the engine calls
:func:`check_engine_spec` for its own role, so a run started from Python fails the same
way. Nothing here imports Megatron-Core (only asks whether it is installed).

What runs where:

* everywhere (CPU with gloo, CUDA with nccl): tensor parallelism, pipeline parallelism
  (temper's own schedule, :mod:`megatron_pipeline`; the model's layers must split evenly
  over the stages, checked when the model's config is read) with virtual (interleaved)
  stages (``virtual_pipeline_model_parallel_size``: the layers split into PP × VPP equal
  chunks, or Megatron's uneven first/last stage sizes in multiples of VPP, see
  :mod:`megatron_chunks`), data parallelism over the role's remaining ranks, the actor,
  critic and reference, checkpoints;
* CUDA only: activation recompute (``recompute_*``, ``model.enable_gradient_checkpointing``),
  whose checkpointing saves CUDA RNG states;
* sequence parallelism at TP > 1 (:mod:`megatron_sp`; on CPU with collectives of its
  own around Megatron's layers), except with LoRA adapters, where it is noted as not
  applied;
* memory/speed options that do not change the update and that this build does not
  apply — the distributed optimizer, overlapped gradient reduce /
  parameter gather, parameter/gradient/optimizer offload (optimizer state is kept
  whole on every DP rank; gradients are all-reduced after the backward). They are
  reported as notes, not errors, so a GPU config checks and runs unchanged;
* mixture-of-experts models (Qwen2-MoE, Qwen3-MoE, Mixtral) with expert parallelism
  (:mod:`megatron_moe`), Megatron's all-gather token dispatcher on CPU; at TP > 1 with
  sequence parallelism, each expert split over ``expert_tensor_parallel_size`` ranks
  (ETP; TP by default, 1 the common layout: whole experts on every TP rank); EP on a
  dense model is refused when the model's config is read;
* LoRA (``model.lora``) on an actor, dense or mixture-of-experts (each expert and the
  shared expert adapted; the router not), under TP, PP, CP, EP and ETP (:mod:`megatron_lora`);
* context parallelism (``context_parallel_size``, :mod:`megatron_cp`) with TP, PP (and
  virtual stages), DP, sequence parallelism, LoRA and MoE models (EP): on CPU temper's
  attention gathers keys and values over the CP group; on CUDA with TransformerEngine,
  TE's attention does CP itself (``extra.cp_comm_type``); router replay at any PP and CP;
* vision-language models of the Qwen2-VL family (Qwen2-VL, Qwen2.5-VL;
  :mod:`megatron_vision`): the language model as a ``GPTModel`` with M-RoPE, Hugging
  Face's vision tower on the first stage feeding the decoder input, at TP, PP, CP and
  DP (sequence parallelism too), for an actor, reference or distillation teacher,
  ``freeze_vision_tower`` / ``freeze_module_prefix`` honoured; with LoRA or a value head
  (critic, reward model) refused by :func:`check_vision`;
* not in this build: LoRA on a critic or on an MoE router, LoRA dropout — errors naming
  the key.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING

from temper.config.derive import Derived
from temper.config.errors import ConfigError
from temper.config.schema import LoraConfig, MegatronConfig, ModelConfig, TemperConfig
from temper.training.megatron_chunks import split_of
from temper.training.megatron_convert import HFLayout
from temper.training.megatron_lora_targets import check_lora
from temper.training.megatron_moe import (
    CPU_DISPATCHER,
    refused_moe_option,
    unavailable_moe_options,
)

if TYPE_CHECKING:
    from temper.training.spec import EngineSpec

RECOMPUTE_GRANULARITIES = ("full", "selective")
RECOMPUTE_METHODS = ("uniform", "block")
#: roles that only run forwards (no gradients, no optimizer, no LoRA of their own)
FROZEN = ("reference", "reward.model")
INSTALL = "pip install 'temper-rl[megatron]' (scripts/install.sh installs it)"


def megatron_installed() -> bool:
    return importlib.util.find_spec("megatron") is not None and (
        importlib.util.find_spec("megatron.core") is not None
    )


def _roles(cfg: TemperConfig, plan: Derived) -> list[tuple[str, MegatronConfig]]:
    roles = []
    if cfg.actor.strategy == "megatron":
        roles.append(("actor", cfg.actor.megatron))
    if plan.use_critic and cfg.critic.strategy == "megatron":
        roles.append(("critic", cfg.critic.megatron))
    ref = cfg.reference
    own_engine = plan.use_reference and cfg.model.lora.rank == 0
    if ref.strategy == "megatron" and (own_engine or cfg.distill.teachers):
        roles.append(("reference", ref.megatron))  # the teachers' engines are built so too
    if cfg.reward.model.enable and cfg.reward.model.strategy == "megatron":
        roles.append(("reward.model", cfg.reward.model.megatron))
    return roles


def check_reward_model(cfg: TemperConfig, plan: Derived) -> None:
    """A megatron reward model scores in the driver on the local backend (a one-rank
    world: nothing to split over), on the ``reward`` worker group on Ray
    (``temper.cluster.reward``), whose devices its TP × PP × CP (and expert) span must
    divide."""
    rm = cfg.reward.model
    if not (rm.enable and rm.strategy == "megatron"):
        return
    if rm.megatron.dist_checkpoint_path:
        raise ConfigError(
            "reward.model.megatron.dist_checkpoint_path",
            "a reward model starts from its sequence-classification directory (its score "
            "head is not in a Megatron distributed checkpoint)",
            "remove it; reward.model.path is converted",
        )
    split = {k: v for k, v in rm.megatron.degrees().items() if (v or 1) > 1}
    if split and cfg.resources.backend != "ray":
        key, value = next(iter(split.items()))
        raise ConfigError(
            f"reward.model.megatron.{key}",
            f"{value}: on the local backend (one device) the reward model scores in the "
            "driver process (one rank), so it is not split over devices",
            "run on resources.backend=ray (the reward model then scores on worker ranks of "
            f"its own, resources.reward), or set reward.model.megatron.{key}: 1",
        )
    devices = len(plan.placement["reward"])
    for key, span, what in (
        ("tensor_model_parallel_size", rm.megatron.model_parallel_size, "TP×PP×CP"),
        ("expert_model_parallel_size", rm.megatron.expert_model_parallel_span, "ETP×EP×PP"),
    ):
        if devices % span:
            raise ConfigError(
                f"reward.model.megatron.{key}",
                f"the reward model's {devices} devices (resources.reward, else the actor's) "
                f"are not divisible by {what} = {span}",
                "place the reward model on a multiple of that many devices (resources.reward) "
                "or choose parallel sizes whose product divides its device count",
            )


def check_megatron(cfg: TemperConfig, plan: Derived, device_type: str) -> list[str]:
    """Raise ``ConfigError`` for what cannot run; return notes on options not applied."""
    notes: list[str] = []
    check_reward_model(cfg, plan)
    for role, m in _roles(cfg, plan):
        ckpt = cfg.model.enable_gradient_checkpointing and role not in FROZEN
        notes += check_section(
            role,
            m,
            device_type=device_type,
            lora=cfg.model.lora,
            gradient_checkpointing=ckpt,
            trainable=role not in FROZEN,
        )
        if m.dist_checkpoint_path:
            _check_dist_init(cfg, role, m)
        path = {"critic": cfg.critic.model_path, "reward.model": cfg.reward.model.path}.get(role)
        layout = local_layout(cfg.model, path or cfg.model.path)
        if layout is not None:  # how TP, PP × VPP and EP split this model
            check_divisible(layout, m, role)
            value = role in ("critic", "reward.model")
            check_vision(layout, m, role, value=value, lora=cfg.model.lora.rank > 0)
            if role not in FROZEN:
                check_lora(cfg.model.lora, role)
        sp = getattr(cfg, role).ulysses_sequence_parallel_size if role not in FROZEN else 1
        if sp > 1:
            raise ConfigError(
                f"{role}.ulysses_sequence_parallel_size",
                "Ulysses sequence parallelism is an fsdp2 option; the megatron engine splits "
                "sequences with context_parallel_size",
                "set it to 1",
            )
    if _roles(cfg, plan):
        note = half_precision_note(cfg.model.dtype, device_type)
        notes += [note] if note else []
    return notes


def _check_dist_init(cfg: TemperConfig, role: str, m: MegatronConfig) -> None:
    """A role started from a Megatron distributed checkpoint (which the models pre-flight
    finds): a tied model is not split into pipeline stages (its last stage's copy of the
    embedding is not a tensor of the checkpoint)."""
    key = f"{role}.megatron.dist_checkpoint_path"
    config = Path(cfg.model.path).expanduser() / "config.json"
    tied = config.is_file() and json.loads(config.read_text()).get("tie_word_embeddings", False)
    if tied and m.pipeline_model_parallel_size > 1:
        raise ConfigError(
            key,
            "a model with tied embeddings over pipeline stages keeps a copy of the "
            "embedding on its last stage, which a distributed checkpoint does not hold",
            f"set {role}.megatron.pipeline_model_parallel_size: 1, or remove "
            "dist_checkpoint_path to convert model.path",
        )


def local_layout(model: ModelConfig, path: str) -> HFLayout | None:
    """The conversion layout of a local model directory's ``config.json`` (read, no
    weights), so that ``check`` sees a dense or MoE model; None for a hub id, an alias
    not made yet, or a model the engine itself refuses when it reads it."""
    from pathlib import Path

    from temper.training.megatron_convert import hf_layout
    from temper.training.models import load_hf_config

    if not (Path(path).expanduser() / "config.json").is_file():
        return None
    try:
        return hf_layout(load_hf_config(model, str(Path(path).expanduser())))
    except (ValueError, KeyError, OSError):
        return None


def half_precision_note(model_dtype: str, device_type: str) -> str | None:
    """On CPU the megatron engine computes in fp32: Megatron-Core's linear layers restore
    autocast in their backward for CUDA only (``custom_bwd(device_type="cuda")``), so a
    half-precision CPU autocast would meet fp32 weights there with half gradients."""
    if device_type == "cuda" or model_dtype in ("auto", "fp32", "float32"):
        return None
    return (
        f"model.dtype={model_dtype}: Megatron-Core's layers compute in half precision through "
        "CUDA autocast only; on CPU the megatron engine computes in fp32"
    )


#: TransformerConfig fields that split layers unevenly over pipeline stages
UNEVEN_SPLIT_FIELDS = (
    "num_layers_in_first_pipeline_stage",
    "num_layers_in_last_pipeline_stage",
    "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split",
    "pipeline_model_parallel_layout",
)


def check_divisible(layout: HFLayout, m: MegatronConfig, role: str) -> None:
    """TP must split heads, KV groups and the FFN evenly (whole query groups per rank);
    PP the layers into equal stages, unless ``extra`` asks Megatron for an uneven split
    (which Megatron then checks); PP × VPP the layers into equal chunks, or the uneven
    stages into VPP chunks each; EP an MoE model's experts (see :func:`check_experts`)."""
    check_experts(layout, m, role)
    pp = m.pipeline_model_parallel_size
    uneven = any(name in m.extra for name in UNEVEN_SPLIT_FIELDS)
    vp = m.virtual_pipeline_model_parallel_size or 1
    own = ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage")
    # Megatron's other uneven splits (embedding/loss as a layer, an explicit layout) are
    # Megatron's to check, interleaved or not
    if vp > 1 and not any(n in m.extra for n in UNEVEN_SPLIT_FIELDS if n not in own):
        problem = split_of(layout.num_layers, pp, vp, m.extra).problem()
        if problem is not None:
            raise ConfigError(
                f"{role}.megatron.virtual_pipeline_model_parallel_size",
                f"the model's {layout.num_layers} layers over {pp} pipeline stages × {vp} "
                f"virtual stages: {problem[0]}",
                problem[1],
            )
    elif layout.num_layers % pp and not uneven:
        raise ConfigError(
            f"{role}.megatron.pipeline_model_parallel_size",
            f"{pp} does not divide the model's {layout.num_layers} layers",
            f"use a pipeline-parallel size that divides {layout.num_layers}",
        )
    tp = m.tensor_model_parallel_size
    for what, n in (
        ("attention heads", layout.num_heads),
        ("key/value heads", layout.num_kv_heads),
        ("FFN columns", layout.ffn_hidden_size),
    ):
        if n % tp:
            raise ConfigError(
                f"{role}.megatron.tensor_model_parallel_size",
                f"{tp} does not divide the model's {n} {what}",
                f"use a tensor-parallel size that divides {n}",
            )


def check_vision(
    layout: HFLayout, m: MegatronConfig, role: str, *, value: bool, lora: bool
) -> None:
    """What a vision-language model (:mod:`megatron_vision`) runs with on this engine:
    tensor (with sequence parallelism), pipeline, context and data parallelism, as an
    actor or reference; not with LoRA (the adapters are the text layers'; the tower's
    freezing and training are the role's) or a value head (critic, reward model)."""
    if not layout.vision:
        return
    refused = [
        (lora, "model.lora.rank", f"set it to 0, or use {role}.strategy: fsdp2 for LoRA"),
        (value, f"{role}.strategy", "use fsdp2 (or torch) for a value model of a VL model"),
    ]
    for bad, name, fix in refused:
        if bad:
            raise ConfigError(
                name,
                f"the megatron engine runs a vision-language model ({layout.model_type}) "
                "without LoRA or a value head in this build",
                fix,
            )


def check_experts(layout: HFLayout, m: MegatronConfig, role: str) -> None:
    """Expert parallelism needs an MoE model whose experts it splits evenly; each
    expert's FFN splits evenly over the expert TP ranks (ETP, TP by default) and the
    shared expert's over the TP ranks (Megatron splits it as the dense layers; under TP
    the layer runs with sequence parallelism, :mod:`megatron_sp`)."""
    key = f"{role}.megatron"
    ep = m.expert_model_parallel_size
    if layout.moe is None:
        if ep > 1:
            raise ConfigError(
                f"{key}.expert_model_parallel_size",
                f"the model ({layout.model_type}) is dense: expert parallelism splits the "
                "experts of a mixture-of-experts model",
                "set it to 1",
            )
        return
    if layout.moe.num_experts % ep:
        raise ConfigError(
            f"{key}.expert_model_parallel_size",
            f"{ep} does not divide the model's {layout.moe.num_experts} experts",
            f"use an expert-parallel size that divides {layout.moe.num_experts}",
        )
    tp = m.tensor_model_parallel_size
    # the experts' split is named by the key that sets it: ETP when given, else TP
    etp_key = "expert_tensor" if m.expert_tensor_parallel_size is not None else "tensor_model"
    for what, n, name, size in (
        ("expert FFN columns", layout.moe.ffn_hidden_size, etp_key, m.expert_tp),
        ("shared-expert FFN columns", layout.moe.shared_ffn_hidden_size, "tensor_model", tp),
    ):
        if n % size:
            raise ConfigError(
                f"{key}.{name}_parallel_size",
                f"{size} does not divide the model's {n} {what}",
                f"use a {name.replace('_', ' ')}-parallel size that divides {n}",
            )


def check_engine_spec(spec: EngineSpec) -> None:
    """The engine-side check of one role (raises; notes are logged by the engine)."""
    check_section(
        spec.role,
        spec.megatron_config,
        device_type=spec.device.type,
        lora=spec.model.lora if spec.train is not None else None,
    )
    if spec.train is not None and spec.train.ulysses_sequence_parallel_size > 1:
        raise ConfigError(
            f"{spec.role}.ulysses_sequence_parallel_size",
            "Ulysses sequence parallelism is an fsdp2 option; the megatron engine splits "
            "sequences with context_parallel_size",
            "set it to 1",
        )


def check_section(
    role: str,
    m: MegatronConfig,
    *,
    device_type: str,
    lora: LoraConfig | None = None,
    gradient_checkpointing: bool = False,
    trainable: bool = True,
) -> list[str]:
    """Raise for what this role's section cannot run; notes on options not applied
    (``trainable``: False for a frozen role, which has no optimizer or gradients)."""
    key = f"{role}.megatron"
    if not megatron_installed():
        raise ConfigError(
            f"{role}.strategy",
            "strategy megatron needs the megatron-core package, which is not installed",
            INSTALL,
        )
    if lora is not None and role != "reference":  # a reference is the frozen base
        check_lora(lora, role)
    for name, value in m.degrees().items():
        if value is not None and value < 1:
            raise ConfigError(f"{key}.{name}", "must be ≥ 1", "set it to 1 or more")
    vp = m.virtual_pipeline_model_parallel_size
    if vp is not None and vp > 1 and m.pipeline_model_parallel_size == 1:
        raise ConfigError(
            f"{key}.virtual_pipeline_model_parallel_size",
            "interleaved (virtual) pipeline stages split each pipeline stage's layers into "
            "chunks; there is one stage (pipeline_model_parallel_size: 1)",
            "set it to null, or set pipeline_model_parallel_size above 1",
        )
    refused = refused_moe_option(m.extra, device_type)
    if refused:
        raise ConfigError(f"{key}.extra.{refused[0]}", refused[1], "remove it, or run on CUDA")
    if m.recompute_granularity not in (None, *RECOMPUTE_GRANULARITIES):
        raise ConfigError(
            f"{key}.recompute_granularity",
            f"unknown value '{m.recompute_granularity}'",
            "use full, selective or null",
        )
    if m.recompute_method not in (None, *RECOMPUTE_METHODS):
        raise ConfigError(
            f"{key}.recompute_method",
            f"unknown value '{m.recompute_method}'",
            "use uniform, block or null",
        )
    lora_on = lora is not None and lora.rank > 0
    notes = unapplied_options(
        m,
        device_type,
        gradient_checkpointing=gradient_checkpointing,
        lora=lora_on,
        trainable=trainable,
    )
    return [f"{key}.{note}" for note in notes]


#: Megatron-Core's kernel fusions (``TransformerConfig`` fields): each computes what the
#: unfused layers do, faster; the first group are CUDA kernels, the second need
#: Transformer Engine (Megatron asserts it is installed when they are on).
CUDA_FUSIONS = (
    "gradient_accumulation_fusion",
    "cross_entropy_loss_fusion",
    "bias_activation_fusion",
    "masked_softmax_fusion",
    "bias_dropout_fusion",
    "apply_rope_fusion",
    "fused_single_qkv_rope",
)
TE_FUSIONS = ("apply_rope_fusion", "fused_single_qkv_rope")


def unavailable_fusions(extra: dict[str, object], device_type: str) -> list[str]:
    """The kernel fusions ``extra`` turns on that cannot run here: every one off CUDA,
    the Transformer Engine ones where it is not installed. Speed only: the layers compute
    the same without them."""
    on = [name for name in CUDA_FUSIONS if extra.get(name)]
    if device_type != "cuda":
        return on
    if importlib.util.find_spec("transformer_engine") is None:
        return [name for name in on if name in TE_FUSIONS]
    return []


def unapplied_options(
    m: MegatronConfig,
    device_type: str,
    *,
    gradient_checkpointing: bool = False,
    lora: bool = False,
    trainable: bool = True,
) -> list[str]:
    """Notes on the section's set options that are not applied here (see module doc);
    each changes memory or speed only. A frozen role (``trainable`` False) has no
    optimizer or gradients: options on those are not its to apply."""
    out: list[str] = []
    fusions = unavailable_fusions(m.extra, device_type)
    if fusions:
        needs = "a CUDA device" if device_type != "cuda" else "Transformer Engine"
        out.append(
            f"extra.{', '.join(fusions)}: kernel fusions that need {needs}; the layers run "
            "unfused here, which computes the same (speed only)"
        )
    if m.sequence_parallel and lora and m.tensor_model_parallel_size > 1:
        out.append(
            "sequence_parallel: not applied with LoRA adapters (they read their linear's "
            "whole input, which sequence parallelism splits over the TP ranks); memory only, "
            "the update is the same"
        )
    split = m.tensor_model_parallel_size * m.context_parallel_size
    if split > 1 and m.extra.get("moe_z_loss_coeff"):
        out.append(
            "extra.moe_z_loss_coeff: under tensor parallelism an MoE layer runs with sequence "
            "parallelism (under context parallelism each rank holds a share of the sequence), "
            "and Megatron averages the z-loss over each TP × CP rank's share of the tokens "
            "(each share weighted 1/(TP·CP)): the micro-batch's mean only when the shares "
            "hold equal numbers of real tokens (temper pads each sequence at its end)"
        )
    comm = m.extra.get("cp_comm_type")
    te = device_type == "cuda" and importlib.util.find_spec("transformer_engine") is not None
    if comm and m.context_parallel_size > 1 and not te:
        out.append(
            f"extra.cp_comm_type={comm}: TransformerEngine's context-parallel exchange; "
            "without it temper's attention all-gathers keys and values over the CP group, "
            "which computes the same (speed and memory only)"
        )
    names = [
        "use_distributed_optimizer",
        "overlap_grad_reduce",
        "overlap_param_gather",
        "param_offload",
        "grad_offload",
        "optimizer_offload",
    ]
    if not trainable:
        names = ["param_offload"]
    on = [n for n in names if getattr(m, n)]
    if on:
        out.append(
            f"{', '.join(on)}: not applied by this build of the megatron engine (optimizer "
            "state is kept whole on each data-parallel rank, gradients are all-reduced after "
            "the backward); memory/speed only, the update is the same"
        )
    moe = unavailable_moe_options(m.extra, device_type)
    if moe:
        out.append(
            f"extra.{', '.join(moe)}: mixture-of-experts kernels/dispatch not applied here "
            f"(experts run as Megatron's SequentialMLP; on CPU the '{CPU_DISPATCHER}' token "
            "dispatcher); the layer computes the same (speed only)"
        )
    if device_type != "cuda" and (m.recompute_granularity or gradient_checkpointing):
        out.append(
            "recompute_granularity: activation recompute needs CUDA (Megatron saves CUDA RNG "
            "states); not applied on CPU, the update is the same"
        )
    return out
