"""Vision-language models (Qwen2-VL, Qwen2.5-VL) on the megatron engine.

The language model is Megatron's ``GPTModel`` with multimodal RoPE (Megatron's
``position_embedding_type="mrope"`` and ``mrope_section`` from the HF config); the vision
tower is Hugging Face's own module, a child ``vision`` of the first pipeline stage's
``GPTModel``, whole (replicated) on every rank of the role. For one micro-batch:

* the tower turns the rows' pixels into one feature row per image (video) placeholder
  token of the context (:func:`temper.training.vision.vision_tokens`: a placeholder the
  policy *sampled* is a plain token); the decoder input is the word embeddings of the
  ids with those rows replaced by the features — HF's ``masked_scatter`` — and is fed to
  ``GPTModel`` as ``decoder_input``;
* the 3-D M-RoPE positions are HF's ``get_rope_index`` over the left-padded rows
  (time, height, width on image tokens; the same index thrice on text), right-aligned as
  the ids are (:func:`megatron_head.right_align`); a micro-batch without images has the
  1-D positions thrice, which is plain RoPE;
* under context parallelism each CP rank takes its columns of both (the tower runs on
  every CP rank; its partial gradients are summed with the DP ranks'); under sequence
  parallelism the embedding's share is gathered before the features go in and the
  decoder input split over TP after, as Megatron's embedding would split it.

Gradients: the decoder input's gradient is whole on every tensor-parallel rank (the
first TP linear all-reduces its input gradient), so each TP rank's tower gets the same
gradient and no TP reduction is needed; over data-parallel ranks it is summed with every
other gradient. The tower's parameters are ``rep`` maps (``vision.*`` ↔ ``visual.*``),
so loading, checkpoints, export and weight sync carry them unchanged.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import nn

from temper.config.schema import TrainEngineConfig
from temper.data.batch import Batch
from temper.training.freezing import freeze_prefixes, frozen
from temper.training.megatron_convert import ParamMap
from temper.training.micro_batching import ModelInputs
from temper.training.vision import vision_tokens

#: model_type → (transformers module, inner model class, vision tower class)
_CLASSES = {
    "qwen2_vl": ("qwen2_vl", "Qwen2VLModel", "Qwen2VisionTransformerPretrainedModel"),
    "qwen2_5_vl": ("qwen2_5_vl", "Qwen2_5_VLModel", "Qwen2_5_VisionTransformerPretrainedModel"),
}

#: the tower's module name on the first stage's GPTModel
TOWER = "vision"


def _class(model_type: str, which: int) -> Any:
    package, *names = _CLASSES[model_type]
    module = importlib.import_module(f"transformers.models.{package}.modeling_{package}")
    return getattr(module, names[which])


def build_tower(hf_config: Any, attn_implementation: str, device: torch.device) -> nn.Module:
    """Hugging Face's vision tower of ``hf_config`` (fp32; weights loaded later)."""
    cls = _class(hf_config.model_type, 1)
    tower: nn.Module = cls._from_config(
        hf_config.vision_config, attn_implementation=attn_implementation, dtype=torch.float32
    )
    return tower.to(device)


def rope_index(hf_config: Any) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """HF's ``get_rope_index`` of the model (its M-RoPE positions), bound to a copy of
    the model on the meta device: it reads only the config."""
    with torch.device("meta"):
        skeleton = _class(hf_config.model_type, 0)(hf_config)
    fn: Callable[..., tuple[torch.Tensor, torch.Tensor]] = skeleton.get_rope_index
    return fn


def mrope_section(hf_config: Any) -> list[int]:
    """The channel split of M-RoPE (time, height, width) over half the head dim."""
    params = dict(getattr(hf_config.text_config, "rope_parameters", None) or {})
    section = params.get("mrope_section")
    if section is None:
        raise ValueError(f"{hf_config.model_type}: the text config has no mrope_section")
    return [int(x) for x in section]


def tower_maps(tower: nn.Module) -> list[ParamMap]:
    """The tower's parameters as replicated maps: ``vision.<name>`` ↔ ``visual.<name>``."""
    return [ParamMap(f"{TOWER}.{n}", (f"visual.{n}",), "rep") for n, _ in tower.named_parameters()]


class MRopeEmbedding(nn.Module):
    """Megatron's ``MultimodalRotaryEmbedding`` with Hugging Face's ``inv_freq``, on any
    device (the parent builds its ``inv_freq`` on CUDA).

    ``emb[s, b, 0, :] = cat(f, f)`` with ``f[j] = pos[c(j), b, s] · inv_freq[j]``, ``c(j)``
    the section (time, height, width) channel ``j`` falls in — transformers' M-RoPE.
    Positions ``(3, B, L)``, or ``(B, L)`` for the same index on all three."""

    def __init__(self, inv_freq: torch.Tensor) -> None:
        super().__init__()
        self.inv_freq = inv_freq.clone()

    def to_device(self, device: torch.device) -> None:
        self.inv_freq = self.inv_freq.to(device)

    def forward(
        self, position_ids: torch.Tensor, mrope_section: list[int], cp_group: Any = None
    ) -> torch.Tensor:
        pos = position_ids if position_ids.dim() == 3 else position_ids.expand(3, -1, -1)
        freqs = pos.to(self.inv_freq.device).float()[..., None] * self.inv_freq  # (3,B,L,D/2)
        emb = torch.cat((freqs, freqs), dim=-1)
        parts = emb.split(list(mrope_section) * 2, dim=-1)
        mixed = torch.cat([m[i % 3] for i, m in enumerate(parts)], dim=-1)  # (B, L, D)
        return mixed.transpose(0, 1)[:, :, None, :].contiguous()  # (L, B, 1, D)


def aligned(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x (..., B, W)`` with each row shifted left past its leading padding and trimmed
    to the longest row, as :func:`megatron_head.right_align` shifts the ids."""
    width = mask.shape[1]
    lead = (mask.cumsum(dim=1) == 0).sum(dim=1)
    length = int(mask.sum(dim=1).max())
    arange = torch.arange(length, device=mask.device)
    gather = (arange.unsqueeze(0) + lead.unsqueeze(1)).clamp(max=width - 1)
    return x.gather(-1, gather.expand(*x.shape[:-2], -1, -1))


def decoder_input(
    gpt: nn.Module,
    ids: torch.Tensor,
    types: torch.Tensor,
    inputs: dict[str, torch.Tensor],
    sequence_group: Any = None,
) -> torch.Tensor:
    """``(L, B, H)``: the word embeddings of ``ids (B, L)`` with the image (video)
    placeholders of ``types`` (1, 2) replaced by the tower's features, in order. Under
    sequence parallelism (``sequence_group``: the TP group) the embedding's output, a
    share of the positions, is gathered first."""
    from temper.training.megatron_sp import gather_sequence

    tower = getattr(gpt, TOWER)
    embedding = cast(nn.Module, gpt.embedding)  # Megatron's LanguageModelEmbedding
    emb = embedding(input_ids=ids, position_ids=None)
    if sequence_group is not None:
        emb = gather_sequence(emb, sequence_group)
    emb = emb.transpose(0, 1)  # (B, L, H)
    for kind, pixels, grid in (
        (1, "pixel_values", "image_grid_thw"),
        (2, "pixel_values_videos", "video_grid_thw"),
    ):
        if pixels not in inputs:
            continue
        feats = tower(inputs[pixels], grid_thw=inputs[grid]).pooler_output
        mask = (types == kind).unsqueeze(-1).expand_as(emb)
        if int(mask[..., 0].sum()) != feats.shape[0]:
            raise ValueError(
                f"{int(mask[..., 0].sum())} placeholder tokens for {feats.shape[0]} vision "
                "features in a micro-batch"
            )
        emb = emb.masked_scatter(mask, feats.to(emb.dtype))
    return emb.transpose(0, 1).contiguous()


def forward_args(
    rope: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    config: Any,
    gpt: nn.Module,
    mb: Batch,
    inp: ModelInputs,
    whole: torch.Tensor,
    cols: torch.Tensor,
    sequence_group: Any = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """``(positions, extra GPTModel kwargs)`` of a vision-language model's micro-batch:
    the M-RoPE positions ``(3, B, len(cols))`` and, on the first stage, the
    ``decoder_input`` (module doc) of columns ``cols`` of the right-aligned (and padded)
    ids ``whole (B, W)`` — all of them, or a context-parallel rank's share; under
    sequence parallelism (``sequence_group``: the TP group) the decoder input is this TP
    rank's share of those, as Megatron's embedding scatters it. Without images, the 1-D
    positions ``cols`` thrice."""
    b = whole.shape[0]
    vt = vision_tokens(config, mb, inp)
    if vt is None:
        return cols.expand(3, b, -1), {}
    grids = {k: v for k, v in vt.inputs.items() if not k.startswith("pixel_values")}
    pos, _ = rope(
        inp.input_ids, mm_token_type_ids=vt.types, attention_mask=inp.attention_mask, **grids
    )
    mask = inp.attention_mask
    width = whole.shape[1]
    pos3 = _pad_to(aligned(pos, mask), width).index_select(-1, cols)
    extra: dict[str, Any] = {}
    if hasattr(gpt, TOWER):
        types = _pad_to(aligned(vt.types, mask), width)
        full = decoder_input(gpt, whole, types, vt.inputs, sequence_group)
        mine = full.index_select(0, cols)
        if sequence_group is not None:
            from temper.training.megatron_sp import split_sequence

            mine = split_sequence(mine, sequence_group)
        extra["decoder_input"] = mine
    return pos3, extra


def _pad_to(x: torch.Tensor, width: int) -> torch.Tensor:
    """``x (..., W')`` cut or zero-padded at its end to ``width`` columns (padding past
    every row's end: causal attention keeps it out of the real tokens)."""
    if x.shape[-1] >= width:
        return x[..., :width]
    return torch.nn.functional.pad(x, (0, width - x.shape[-1]))


def hf_state_name(hf: str, vision: bool) -> str:
    """The HF model's ``state_dict`` name of a converted tensor's HF name (what
    ``freeze_module_prefix`` and the export use)."""
    if hf.startswith(("lm_head.", "value_head.")):
        return hf
    if hf.startswith("visual."):
        return "model." + hf
    return ("model.language_model." if vision else "model.") + hf


def freeze(
    module: nn.Module, maps: list[ParamMap], vision: bool, train: TrainEngineConfig, role: str
) -> None:
    """Freeze the vision tower (``freeze_vision_tower``) and every parameter whose HF
    name starts with one of ``freeze_module_prefix`` (:mod:`temper.training.freezing`, on
    the names of the torch engine's model: ``model.visual.blocks``)."""
    towers = ["model.visual"] if vision else []
    prefixes = freeze_prefixes(train, role, towers)
    if not prefixes:
        return
    params = dict(module.named_parameters())
    # each converted tensor as its HF state-dict names (a fused one has several)
    owned = [
        (pm.megatron, hf_state_name(h, vision)) for pm in maps if not pm.tied_copy for h in pm.hf
    ]
    for i in frozen(prefixes, [name for _, name in owned], towers, role):
        params[owned[i][0]].requires_grad_(False)
