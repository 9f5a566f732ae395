"""Hugging Face ↔ Megatron-Core weights for dense Llama, Qwen2/Qwen2.5 and Qwen3 models.

Megatron-Core ships no converter (megatron-bridge and mbridge need TransformerEngine and
CUDA), so the mapping lives here, as pure functions on tensors. Each Megatron parameter
of a ``GPTModel`` maps to one or more HF tensors by a *kind*:

========  =====================================================  ======================
kind      Megatron layout (TP rank r of t)                        HF tensors
========  =====================================================  ======================
``qkv``   query groups g (kv heads) in order, each               ``q_proj``, ``k_proj``,
          ``[q heads of g; k_g; v_g]``; rank r holds groups         ``v_proj`` (weight or
          ``r·G/t … (r+1)·G/t``                                     bias)
``glu``   ``[gate_r; up_r]``: each rank's slice of gate, then up  ``gate_proj``, ``up_proj``
``col``   rows split over ranks (vocabulary padded with zeros)     embeddings, ``lm_head``
``row``   columns split over ranks                                 ``o_proj``, ``down_proj``
``rep``   the same on every rank                                   norms, value head
========  =====================================================  ======================

The local layer spec names the norms ``input_layernorm`` / ``pre_mlp_layernorm``;
TransformerEngine's spec fuses them into ``linear_qkv.layer_norm_weight`` /
``linear_fc1.layer_norm_weight``. :func:`param_maps` takes whichever names the model has.

The vocabulary is padded to a multiple of ``lcm(128, TP)`` (Megatron-LM's convention), so
a checkpoint saved at one TP size loads at another; padded rows are zero and padded
logits are cut off before any softmax.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from temper.training.megatron_moe import (
    MOE_MODEL_TYPES,
    REFUSED_MOE,
    MoELayout,
    moe_layout,
    moe_mlp_maps,
)

Kind = Literal["qkv", "glu", "col", "row", "rep"]

#: vision-language models whose language model converts as Qwen2 (q/k/v biases) with
#: M-RoPE; the vision tower stays Hugging Face's module (:mod:`megatron_vision`)
VL_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")
SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", *MOE_MODEL_TYPES, *VL_MODEL_TYPES)
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
VOCAB_MULTIPLE = 128


@dataclass(frozen=True)
class HFLayout:
    """What the conversion needs from a Hugging Face config."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    tied_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    norm_eps: float
    moe: MoELayout | None = None  # the experts of a mixture-of-experts model
    vision: bool = False  # a vision-language model (VL_MODEL_TYPES): HF's tower + M-RoPE

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    def padded_vocab(self, tp: int) -> int:
        """Vocabulary rounded up to a multiple of ``lcm(128, tp)``."""
        multiple = VOCAB_MULTIPLE * tp // math.gcd(VOCAB_MULTIPLE, tp)
        return -(-self.vocab_size // multiple) * multiple


def text_config(hf_config: Any) -> Any:
    """The language model's config: a vision-language config's ``text_config``, else
    the config itself."""
    if str(getattr(hf_config, "model_type", "")) in VL_MODEL_TYPES:
        return hf_config.text_config
    return hf_config


def hf_layout(hf_config: Any) -> HFLayout:
    """The layout of a Llama / Qwen2 / Qwen3 config, of the mixture-of-experts
    Qwen2-MoE / Qwen3-MoE / Mixtral, or of the language model of a Qwen2-VL /
    Qwen2.5-VL; ``ValueError`` otherwise."""
    model_type = str(getattr(hf_config, "model_type", ""))
    vision = model_type in VL_MODEL_TYPES
    # tie_word_embeddings sits on a VL model's top-level config
    tied = bool(getattr(hf_config, "tie_word_embeddings", False))
    hf_config = text_config(hf_config)
    if model_type in REFUSED_MOE:
        raise ValueError(f"model_type '{model_type}': {REFUSED_MOE[model_type]}")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type '{model_type}' has no Megatron conversion here "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if getattr(hf_config, "use_sliding_window", False):
        raise ValueError("sliding-window attention is not supported by the megatron engine")
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act '{hf_config.hidden_act}' is not supported (only silu)")
    if getattr(hf_config, "mlp_bias", False):
        raise ValueError("MLP biases are not supported by the megatron engine")
    heads = int(hf_config.num_attention_heads)
    kv = int(getattr(hf_config, "num_key_value_heads", None) or heads)
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    if model_type in ("qwen2", "qwen2_moe", *VL_MODEL_TYPES):
        qkv_bias = True  # Qwen2 always has q/k/v biases (and none on o_proj)
    else:
        qkv_bias = bool(getattr(hf_config, "attention_bias", False))
    num_layers = int(hf_config.num_hidden_layers)
    moe = moe_layout(hf_config, model_type, num_layers) if model_type in MOE_MODEL_TYPES else None
    return HFLayout(
        model_type=model_type,
        num_layers=num_layers,
        hidden_size=int(hf_config.hidden_size),
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=int(head_dim),
        ffn_hidden_size=int(hf_config.intermediate_size),
        vocab_size=int(hf_config.vocab_size),
        tied_embeddings=tied,
        qkv_bias=qkv_bias,
        qk_norm=model_type in ("qwen3", "qwen3_moe"),
        norm_eps=float(hf_config.rms_norm_eps),
        moe=moe,
        vision=vision,
    )


@dataclass(frozen=True)
class ParamMap:
    """One Megatron parameter and the HF tensors it is made of.

    ``megatron`` is the name in this rank's module (a pipeline stage numbers its layers
    from 0); ``key`` the name in the whole model (global layer index), which checkpoints
    use so that they load at another pipeline size. ``tied_copy``: the last stage's copy
    of a tied embedding (the first stage holds the original), kept equal to it by the
    engine and neither exported nor saved.
    """

    megatron: str
    hf: tuple[str, ...]
    kind: Kind
    layer: int | None = None  # global decoder layer index; None for embeddings/norm/head
    key: str = ""
    tied_copy: bool = False

    @property
    def global_name(self) -> str:
        return self.key or self.megatron


def param_maps(
    layout: HFLayout,
    megatron_names: set[str],
    *,
    value_head: bool = False,
    layers: Sequence[int] | None = None,
    first: bool = True,
    last: bool = True,
    ep: int = 1,
    ep_rank: int = 0,
) -> list[ParamMap]:
    """Every Megatron parameter of the model or pipeline stage (``megatron_names``) with
    its HF tensors, in order: embeddings, the layers, final norm, output layer / value
    head.

    ``layers``: the global indices of the stage's layers (its local layer ``j`` is
    ``layers[j]``; all by default); ``first``/``last``: the stage holds the embedding /
    the final norm and head; ``ep``/``ep_rank``: the experts this rank holds (an MoE
    model under expert parallelism, see :mod:`megatron_moe`). A tied model's last stage, when it is not also the first,
    has an output layer of its own: the tied copy, read from the embedding.

    HF names carry no ``model.`` prefix here (the value model's backbone has none; the
    causal LM's ``model.`` is added by the reader/writer). ``lm_head.weight`` is named
    as is.
    """
    out: list[ParamMap] = []
    if first:
        out.append(ParamMap("embedding.word_embeddings.weight", ("embed_tokens.weight",), "col"))
    held = range(layout.num_layers) if layers is None else layers
    for j, i in enumerate(held):
        out += _layer_maps(layout, megatron_names, j, i, ep, ep_rank)
    if last:
        out.append(ParamMap("decoder.final_layernorm.weight", ("norm.weight",), "rep"))
        if value_head:
            out.append(ParamMap("output_layer.linear.weight", ("value_head.weight",), "rep"))
            out.append(ParamMap("output_layer.linear.bias", ("value_head.bias",), "rep"))
        elif not layout.tied_embeddings:
            out.append(ParamMap("output_layer.weight", ("lm_head.weight",), "col"))
        elif not first:
            copy = ParamMap("output_layer.weight", ("lm_head.weight",), "col", tied_copy=True)
            out.append(copy)
    missing = [p.megatron for p in out if p.megatron not in megatron_names]
    unknown = megatron_names - {p.megatron for p in out}
    if missing or unknown:
        raise ValueError(
            f"the Megatron model does not match the HF layout: missing {sorted(missing)[:4]}, "
            f"unmapped {sorted(unknown)[:4]}"
        )
    return out


def _layer_maps(
    layout: HFLayout, megatron_names: set[str], j: int, i: int, ep: int = 1, ep_rank: int = 0
) -> list[ParamMap]:
    """The maps of global layer ``i``, held as the module's layer ``j``."""
    m, g, h = f"decoder.layers.{j}.", f"decoder.layers.{i}.", f"layers.{i}."

    def pm(local: str, hf: tuple[str, ...], kind: Kind, whole: str = "") -> ParamMap:
        whole = whole or local
        key = g + whole if i != j or whole != local else ""
        return ParamMap(m + local, hf, kind, i, key)

    out = [pm("self_attention.linear_qkv.weight", _qkv(h, "weight"), "qkv")]
    if layout.qkv_bias:
        out.append(pm("self_attention.linear_qkv.bias", _qkv(h, "bias"), "qkv"))
    out.append(pm("self_attention.linear_proj.weight", (f"{h}self_attn.o_proj.weight",), "row"))
    if layout.qk_norm:
        out.append(pm("self_attention.q_layernorm.weight", (f"{h}self_attn.q_norm.weight",), "rep"))
        out.append(pm("self_attention.k_layernorm.weight", (f"{h}self_attn.k_norm.weight",), "rep"))
    fused_norms = f"{m}self_attention.linear_qkv.layer_norm_weight" in megatron_names
    attn_norm = (
        "self_attention.linear_qkv.layer_norm_weight" if fused_norms else "input_layernorm.weight"
    )
    mlp_norm = "mlp.linear_fc1.layer_norm_weight" if fused_norms else "pre_mlp_layernorm.weight"
    out.append(pm(attn_norm, (f"{h}input_layernorm.weight",), "rep"))
    out.append(pm(mlp_norm, (f"{h}post_attention_layernorm.weight",), "rep"))
    if layout.moe is not None and layout.moe.moe_layers[i]:
        for local, hf, kind, whole in moe_mlp_maps(layout.moe, h, ep, ep_rank):
            out.append(pm(local, hf, _kind(kind), whole))
        return out
    glu = (f"{h}mlp.gate_proj.weight", f"{h}mlp.up_proj.weight")
    out.append(pm("mlp.linear_fc1.weight", glu, "glu"))
    out.append(pm("mlp.linear_fc2.weight", (f"{h}mlp.down_proj.weight",), "row"))
    return out


def _kind(name: str) -> Kind:
    kinds: dict[str, Kind] = {"glu": "glu", "row": "row", "rep": "rep"}
    return kinds[name]


def _qkv(h: str, what: str) -> tuple[str, ...]:
    return tuple(f"{h}self_attn.{p}_proj.{what}" for p in "qkv")


def hf_inv_freq(hf_config: Any) -> torch.Tensor:
    """RoPE inverse frequencies exactly as transformers computes them for ``hf_config``.

    Raises ``ValueError`` for RoPE types whose cos/sin are scaled or depend on the
    sequence length (yarn, longrope, dynamic): Megatron's unfused RoPE has no such term.
    """
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_config = text_config(hf_config)
    params = dict(getattr(hf_config, "rope_parameters", None) or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_type '{rope_type}' is not supported by the megatron engine "
            f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    if rope_type == "default":
        base = float(params.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))
        dim = int(head_dim_of(hf_config) * float(getattr(hf_config, "partial_rotary_factor", 1.0)))
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu")
    if scaling != 1.0:
        raise ValueError(f"rope_type '{rope_type}' scales attention ({scaling}); not supported")
    return inv_freq.float()


def head_dim_of(hf_config: Any) -> int:
    """Per-head dimension (``head_dim`` where the config has one, else hidden/heads)."""
    explicit = getattr(hf_config, "head_dim", None)
    return int(explicit or hf_config.hidden_size // hf_config.num_attention_heads)


# --------------------------------------------------------------------------- HF -> Megatron


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t
    pad = torch.zeros((rows - t.shape[0], *t.shape[1:]), dtype=t.dtype)
    return torch.cat([t, pad])


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: HFLayout) -> torch.Tensor:
    """Full ``linear_qkv`` weight (or bias) from HF ``q_proj``/``k_proj``/``v_proj``:
    per query group g, ``[q heads of g; k_g; v_g]`` stacked over groups."""
    groups, d = layout.num_kv_heads, layout.head_dim
    rest = q.shape[1:]
    q = q.reshape(groups, layout.heads_per_group * d, *rest)
    k = k.reshape(groups, d, *rest)
    v = v.reshape(groups, d, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def split_qkv(
    fused: torch.Tensor, layout: HFLayout
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`fuse_qkv`."""
    groups, d = layout.num_kv_heads, layout.head_dim
    rest = fused.shape[1:]
    x = fused.reshape(groups, (layout.heads_per_group + 2) * d, *rest)
    q, k, v = torch.split(x, [layout.heads_per_group * d, d, d], dim=1)
    # clones: three tensors of their own, not views of one buffer (safetensors refuses
    # tensors that share memory)
    return (
        q.reshape(-1, *rest).clone(),
        k.reshape(-1, *rest).clone(),
        v.reshape(-1, *rest).clone(),
    )


def to_megatron_shard(
    pm: ParamMap, hf: list[torch.Tensor], layout: HFLayout, rank: int, tp: int
) -> torch.Tensor:
    """TP rank ``rank``'s shard of ``pm``'s Megatron parameter from its HF tensors."""
    if pm.kind == "rep":
        return hf[0]
    if pm.kind == "col":
        return _pad_rows(hf[0], layout.padded_vocab(tp)).chunk(tp, dim=0)[rank]
    if pm.kind == "row":
        return hf[0].chunk(tp, dim=1)[rank]
    if pm.kind == "glu":
        gate, up = (t.chunk(tp, dim=0)[rank] for t in hf)
        return torch.cat([gate, up], dim=0)
    fused = fuse_qkv(hf[0], hf[1], hf[2], layout)
    return fused.chunk(tp, dim=0)[rank]  # whole query groups per rank (tp divides groups)


# --------------------------------------------------------------------------- Megatron -> HF


def to_hf(
    pm: ParamMap, shards: list[torch.Tensor], layout: HFLayout
) -> list[tuple[str, torch.Tensor]]:
    """HF tensors of ``pm`` from the shards of every TP rank (rank order)."""
    if pm.kind == "rep":
        return [(pm.hf[0], shards[0])]
    if pm.kind == "col":
        return [(pm.hf[0], torch.cat(shards, dim=0)[: layout.vocab_size].clone())]
    if pm.kind == "row":
        return [(pm.hf[0], torch.cat(shards, dim=1))]
    if pm.kind == "glu":
        halves = [s.chunk(2, dim=0) for s in shards]
        gate = torch.cat([g for g, _ in halves], dim=0)
        up = torch.cat([u for _, u in halves], dim=0)
        return [(pm.hf[0], gate), (pm.hf[1], up)]
    q, k, v = split_qkv(torch.cat(shards, dim=0), layout)
    return list(zip(pm.hf, (q, k, v)))


def hf_tensors(
    maps: list[ParamMap],
    layout: HFLayout,
    gather: Callable[[ParamMap, torch.Tensor], list[torch.Tensor]],
    local: Callable[[ParamMap], torch.Tensor],
    *,
    prefix: str = "model.",
    tied_head: bool = False,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(hf_name, tensor)`` of the whole model from this rank's Megatron parameters:
    ``local(pm)`` is this TP rank's shard of ``pm`` (fetched from the stage holding it
    under pipeline parallelism), whose TP shards are gathered (``gather``: a collective
    over the group ``pm`` is split over, TP or an expert's ETP) and merged as it is reached, so at most one layer's full tensors
    exist at a time. ``lm_head.weight`` and the value head keep their names; the rest get
    ``prefix``. ``maps`` hold no tied copy (see :class:`ParamMap`).

    A vision-language model's vision tower (``visual.*``) is named ``model.visual.*``,
    its language model's tensors get ``prefix`` (``model.language_model.``), as the HF
    model's ``state_dict`` names them.

    ``tied_head``: a tied model's embedding is also yielded as ``lm_head.weight``, as a
    Hugging Face ``state_dict`` has it — vLLM's layer-wise reload restores any layer that
    received no tensor, and its LM head shares storage with the embedding."""
    for pm in maps:
        shard = local(pm)
        shards = gather(pm, shard) if pm.kind != "rep" else [shard]
        for name, tensor in to_hf(pm, shards, layout):
            top = name.startswith(("lm_head.", "value_head."))
            if name.startswith("visual."):
                yield "model." + name, tensor
                continue
            yield (name if top else prefix + name), tensor
            if tied_head and name == "embed_tokens.weight":
                yield "lm_head.weight", tensor
