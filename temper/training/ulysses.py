"""Ulysses sequence parallelism: each sequence split over a group of ranks.

With ``ulysses_sequence_parallel_size`` = ``sp`` > 1, a data-parallel engine's ranks form
groups of ``sp`` consecutive ranks (verl's and ROLL's layout: a rank's data-parallel index
is ``rank // sp``). A group's ranks take the same micro-batches; each runs the model on
``1/sp`` of every sequence's columns, so activations per device shrink ``sp`` times. Every
layer but attention is per token. Attention needs all of a sequence's keys, so around it
one all-to-all trades the sequence split for a split of the heads (each rank then
attends over the whole sequence with ``H/sp`` heads) and a second one trades it back
(:func:`ulysses_attention`; DeepSpeed-Ulysses, Jacobs et al. 2023).

A micro-batch runs padded (a row per sample) or packed (one row, :mod:`temper.training.
packing`, a shared prompt once) as the layout's cost model picks; either way its rows are
split. Each response token is scored by the rank that holds the column of its logits,
and the per-token outputs (log-probs, entropy, values) are summed over the group
(:func:`sum_owned`), so each rank computes the same loss from the same whole outputs and
the roles above are unchanged. The sum's backward passes the gradient to the entries a
rank owns: the group's ranks all hold the same loss, and a rank's parameters saw only
its own columns, so the sum of the group's parameter gradients is the gradient of the
group's loss — FSDP and ZeRO then average over every rank, which the engine's loss scale
accounts for.

Registered with transformers' attention interface as :data:`ULYSSES_KERNEL` and not with
its mask interface, so transformers builds no mask from a rank's columns: the kernel
attends as :class:`UlyssesContext` says — causally over padded rows rotated so that their
padding comes last (no ``L × L`` mask, which SDPA would keep for the backward in every
layer), or a packed row segment by segment (the segment kernel's layout).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from temper.config.errors import ConfigError
from temper.training.attention_kind import attention_limit, declares
from temper.training.micro_batching import ModelInputs
from temper.training.packing import PackedInputs, Scored
from temper.training.router_replay import from_packed, to_packed
from temper.training.segment_attention import (
    LAYOUT_KWARG,
    SEGMENT_KERNEL,
    SegmentLayout,
    hands_keywords_to_attention,
    segment_attention,
)
from temper.training.spec import EngineSpec

ULYSSES_KERNEL = "temper_ulysses"
#: the kernel whose packed rows Ulysses runs after its all-to-all: segment by segment
PACKED_KERNEL = SEGMENT_KERNEL
#: the forward keyword that carries a micro-batch's :class:`UlyssesContext` to the kernel
CONTEXT_KWARG = "temper_ulysses_context"


@dataclass(frozen=True)
class SequenceGroup:
    """This rank's sequence-parallel group: ``size`` ranks, this one ``rank`` among them;
    ``data`` is the group of ranks that share this one's place in their groups (the
    data-parallel ranks that hold different samples)."""

    size: int
    rank: int
    group: dist.ProcessGroup
    data: dist.ProcessGroup


def sequence_groups(size: int) -> SequenceGroup:
    """Split the default process group into groups of ``size`` consecutive ranks (a
    collective: every rank calls it)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    if world % size:
        raise ConfigError(
            "ulysses_sequence_parallel_size",
            f"{world} ranks are not divisible by the sequence-parallel size {size}",
            "choose a size that divides the role's device count",
        )
    mine: dist.ProcessGroup | None = None
    data: dist.ProcessGroup | None = None
    # every rank creates every group, in the same order (new_group is a collective)
    for first in range(0, world, size):
        g = dist.new_group(list(range(first, first + size)))
        if first <= rank < first + size:
            mine = g
    for offset in range(size):
        g = dist.new_group(list(range(offset, world, size)))
        if rank % size == offset:
            data = g
    assert mine is not None and data is not None
    return SequenceGroup(size=size, rank=rank % size, group=mine, data=data)


def check_heads(role: str, heads: int, kv_heads: int, size: int) -> None:
    """The attention heads must split evenly over the group (key/value heads are repeated
    to the query heads when they do not)."""
    if heads % size:
        raise ConfigError(
            f"{role}.ulysses_sequence_parallel_size",
            f"the model's {heads} attention heads cannot be split over {size} ranks "
            "(Ulysses attention gives each rank of a group the same number of heads)",
            f"use a size that divides {heads}",
        )
    if heads % max(kv_heads, 1):
        raise ConfigError(
            f"{role}.ulysses_sequence_parallel_size",
            f"the model's {kv_heads} key/value heads do not divide its {heads} heads",
            "use a model with grouped-query attention of whole groups",
        )


#: Vision-language families whose top forward merges the vision features into the
#: embeddings of whole rows and hands them, with their M-RoPE positions, to a
#: ``language_model`` (what :func:`split_language_model` splits).
VL_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe")


def check_model(config: dict[str, Any], role: str, size: int) -> None:
    """A model's config (``config.json``'s keys) against a Ulysses group of ``size``: a
    text model, or a vision-language family of :data:`VL_MODEL_TYPES`, whose (text) heads
    split over the group and attend as Ulysses' kernel does (plain causal softmax,
    :mod:`temper.training.attention_kind`; pre-flight reads the file; the engine checks
    the loaded model)."""
    if size <= 1:
        return
    if "vision_config" in config and config.get("model_type") not in VL_MODEL_TYPES:
        raise ConfigError(
            f"{role}.ulysses_sequence_parallel_size",
            f"Ulysses sequence parallelism splits the text decoder of the vision-language "
            f"families {', '.join(VL_MODEL_TYPES)}; model_type "
            f"{config.get('model_type')!r} is not one of them",
            "set it to 1",
        )
    if not declares(config, "_supports_attention_backend"):
        # its layers would attend over their own columns only, never calling the kernel
        raise ConfigError(
            f"{role}.ulysses_sequence_parallel_size",
            f"{config.get('model_type')}'s attention does not go through transformers' "
            "attention interface, where Ulysses' kernel runs",
            "set it to 1",
        )
    limit = attention_limit(config, windows=True)  # the kernel applies a layer's window
    if limit is not None:
        raise ConfigError(
            f"{role}.ulysses_sequence_parallel_size",
            f"Ulysses' kernel computes plain causal softmax attention over whole sequences, "
            f"and {limit}",
            "set it to 1",
        )
    text = config.get("text_config") or config
    heads = int(text.get("num_attention_heads") or 0)
    if heads:
        check_heads(role, heads, int(text.get("num_key_value_heads") or heads), size)


# --------------------------------------------------------------------------- MoE routing


def routing_columns(
    per_row: Tensor, inp: ModelInputs, rows: Rows, packed: PackedInputs | None
) -> Tensor:
    """The whole rows' routing ``(R, L, n, k)`` -> the micro-batch's ``(b, W, n, k)``,
    ``-1`` at padding (inverse of the layout :func:`shard_routing` cuts from)."""
    if packed is not None:
        return from_packed(per_row[0], packed.token_index)
    assert rows.rotation is not None
    index = rows.rotation[..., None, None].expand(-1, -1, *per_row.shape[2:])
    out = torch.empty_like(per_row).scatter_(1, index, per_row)
    return out.masked_fill(~(inp.attention_mask > 0)[..., None, None], -1)


def shard_routing(
    routed: Tensor, rows: Rows, packed: PackedInputs | None, group: SequenceGroup
) -> Tensor:
    """A micro-batch's routing ``(b, W, n, k)`` (:func:`~temper.training.router_replay.
    micro_routing`) cut to this rank's columns of ``rows``, in the order its routers see
    them: ``(R · width, n, k)``, row-major (``-1`` in the padding columns)."""
    per_row = (
        routed
        if packed is None
        else to_packed(routed, packed.token_index, rows.input_ids.shape[1])[None]
    )
    return rank_columns(per_row, rows, group, fill=-1).reshape(-1, *routed.shape[2:])


def gather_routing(tokens: Tensor, rows: Rows, group: SequenceGroup) -> Tensor:
    """Inverse of :func:`shard_routing` over the group: each rank's recorded ``(R ·
    width, n, k)`` -> the whole rows' ``(R, L, n, k)`` (a collective)."""
    R, L = rows.input_ids.shape
    # int32 on the wire: gloo gathers no int16 (models with more than 127 experts)
    mine = tokens.reshape(R, -1, *tokens.shape[1:]).to(torch.int32).contiguous()
    parts = [torch.empty_like(mine) for _ in range(group.size)]
    dist.all_gather(parts, mine, group=group.group)
    return torch.cat(parts, dim=1)[:, :L].to(tokens.dtype)


# --------------------------------------------------------------------------- collectives


class _AllToAll(torch.autograd.Function):
    """``x`` ``(size, …)``: chunk ``j`` goes to rank ``j``, the result's chunk ``j`` came
    from rank ``j``. Its own adjoint: the backward sends each gradient chunk back."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: dist.ProcessGroup) -> Tensor:
        ctx.group = group
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad.contiguous(), group=ctx.group)
        return out, None


def _exchange(x: Tensor, group: SequenceGroup, split: int, join: int) -> Tensor:
    """Split ``x`` into ``size`` chunks along ``split``, send chunk ``j`` to rank ``j``,
    and concatenate what arrives along ``join`` in rank order."""
    chunks = torch.stack(x.chunk(group.size, dim=split))
    return torch.cat(_AllToAll.apply(chunks, group.group).unbind(0), dim=join)


class _SumOwned(torch.autograd.Function):
    """The sum of every rank's ``x`` (each entry is one rank's, zeros elsewhere); the
    backward passes the gradient through: every rank differentiates the same loss, and
    a rank's graph holds only the entries it owns."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, group: SequenceGroup) -> Tensor:
        out = x.clone()
        dist.all_reduce(out, group=group.group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


def sum_owned(x: Tensor, group: SequenceGroup) -> Tensor:
    """The group's outputs, each rank having filled in the entries it owns."""
    return _SumOwned.apply(x, group)


# --------------------------------------------------------------------------- attention


@dataclass(frozen=True)
class UlyssesContext:
    """What the kernel needs besides the rank's columns: the group and how the whole
    rows attend — a packed row's segment ``layout`` (the segment kernel's), or an
    explicit ``(R, 1, L, L)`` boolean ``mask`` (True = attend), or neither: causal
    (rows whose padding follows their tokens)."""

    group: SequenceGroup
    mask: Tensor | None = None
    layout: SegmentLayout | None = None
    # the whole rows' positions (R, L): a sliding window's distances
    positions: Tensor | None = None
    windowed: dict[int, Tensor] = field(default_factory=dict, compare=False)

    def window_mask(self, window: int) -> Tensor:
        """The rows' mask within a sliding ``window`` (a query at position ``q`` attends
        keys at ``k > q - window``, transformers' convention); every token keeps itself
        (no row is empty). Built at the first layer that asks."""
        if window not in self.windowed:
            assert self.positions is not None
            pos = self.positions
            L = pos.shape[1]
            causal = torch.ones(L, L, dtype=torch.bool, device=pos.device).tril()[None, None]
            base = self.mask if self.mask is not None else causal
            near = (pos[:, :, None] - pos[:, None, :]) < window  # (R, L, L)
            eye = torch.eye(L, dtype=torch.bool, device=pos.device)
            self.windowed[window] = (base & near[:, None]) | eye
        return self.windowed[window]


def sequence_mask(attention_mask: Tensor) -> Tensor:
    """``(b, L)`` 0/1 attention mask of padded rows -> their ``(b, 1, L, L)`` boolean
    mask: causal over real keys, and every token attends to itself (no row is empty; a
    padding token's output is never used)."""
    L = attention_mask.shape[1]
    causal = torch.ones(L, L, dtype=torch.bool, device=attention_mask.device).tril()
    eye = torch.eye(L, dtype=torch.bool, device=attention_mask.device)
    return ((causal[None] & (attention_mask[:, None, :] > 0)) | eye)[:, None]


@dataclass(frozen=True)
class Rows:
    """A micro-batch as the model sees it, whole: ``R`` rows of ``L`` columns (the padded
    layout: one row per sample; packed: one row), how they attend (the fields of
    :class:`UlyssesContext`), and the ``K`` scored response tokens (``valid``'s,
    row-major), each scored by the logits at ``(row, column)`` — a shared prompt's last
    column scores the first token of every response that shares it."""

    input_ids: Tensor
    position_ids: Tensor
    row: Tensor  # (K,)
    column: Tensor  # (K,)
    label: Tensor  # (K,)
    mask: Tensor | None = None
    layout: SegmentLayout | None = None
    # padded rows: row i's column j is the micro-batch's column ``rotation[i, j]``
    rotation: Tensor | None = None


def padded_rows(inp: ModelInputs, valid: Scored) -> Rows:
    """The padded layout, each row rotated so that its left padding follows its tokens:
    then causal attention alone keeps every real token off the padding, with no
    ``L × L`` mask (kept only if a row has a gap inside). Positions are the row's own,
    so the rotation changes nothing the model computes. Response token ``k`` of row
    ``i`` is scored at column ``L - r - 1 + k - pad_i``."""
    L, r = inp.input_ids.shape[1], inp.response_len
    real = inp.attention_mask > 0
    lead = real.long().cumsum(dim=1).eq(0).sum(dim=1)  # (b,) left padding per row
    cols = (torch.arange(L, device=real.device)[None] + lead[:, None]) % L
    attend = real.gather(1, cols)
    solid = torch.equal(attend, torch.arange(L, device=real.device)[None] < attend.sum(1, True))
    row, k = valid.rows, valid.cols
    return Rows(
        inp.input_ids.gather(1, cols),
        inp.position_ids.gather(1, cols),
        row=row,
        column=k + (L - r - 1) - lead[row],
        label=valid.take(inp.response_ids),
        mask=None if solid else sequence_mask(attend.long()),
        rotation=cols,
    )


def packed_rows(inp: ModelInputs, packed: PackedInputs) -> Rows:
    """A packed row built for the segment kernel (:mod:`temper.training.packing`): the
    positions ``packed.keep`` score the response tokens ``packed.valid``."""
    assert packed.segments is not None
    return Rows(
        packed.input_ids,
        packed.position_ids,
        row=torch.zeros_like(packed.keep),
        column=packed.keep,
        label=packed.valid.take(inp.response_ids),
        layout=packed.segments,
    )


@dataclass(frozen=True)
class ColumnShard:
    """A rank's ``width = ⌈L / size⌉`` columns of :class:`Rows` (right-padded to
    ``size · width``). ``keep``: the local columns whose logits score a token; the
    scored tokens this rank owns (``owned`` of the ``K``) at ``(row, keep[at])``."""

    model_inputs: dict[str, Tensor]  # input_ids, position_ids of the rank's columns
    context: UlyssesContext
    keep: Tensor
    owned: Tensor  # (K,) bool
    row: Tensor  # (owned,)
    at: Tensor  # (owned,) index into keep
    label: Tensor  # (owned,)


def shard_columns(rows: Rows, group: SequenceGroup) -> ColumnShard:
    """This rank's columns of ``rows`` (positions stay the whole rows', so rotary
    embeddings see what an unsplit forward sees). The padding columns come last: no
    real token attends to them (causal, or masked out, or outside every segment)."""
    L = rows.input_ids.shape[1]
    width = -(-L // group.size)
    total = width * group.size
    pad = (0, total - L)
    ids, pos = F.pad(rows.input_ids, pad), F.pad(rows.position_ids, pad)
    mask = rows.mask
    if mask is not None:
        eye = torch.eye(total, dtype=torch.bool, device=ids.device)
        mask = F.pad(mask, (0, total - L, 0, total - L)) | eye
    start = group.rank * width
    owned = (rows.column >= start) & (rows.column < start + width)
    keep, at = torch.unique(rows.column[owned] - start, return_inverse=True)
    cols = slice(start, start + width)
    return ColumnShard(
        model_inputs={"input_ids": ids[:, cols], "position_ids": pos[:, cols]},
        context=UlyssesContext(group=group, mask=mask, layout=rows.layout, positions=pos),
        keep=keep,
        owned=owned,
        row=rows.row[owned],
        at=at,
        label=rows.label[owned],
    )


def use_ulysses(model: torch.nn.Module, spec: EngineSpec, size: int) -> torch.nn.Module | None:
    """Run ``model``'s attention as :func:`ulysses_attention` (checks that its heads split
    over ``size`` ranks, and that the engine has nothing Ulysses does not split)."""
    from transformers import PreTrainedModel

    top = next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)
    key = f"{spec.role}.ulysses_sequence_parallel_size"
    if top is None:
        raise ConfigError(key, "the model is not a transformers model", "set it to 1")
    check_model(top.config.to_dict(), spec.role, size)
    if not getattr(top, "_supports_attention_backend", False):  # remote code, loaded
        raise ConfigError(
            key,
            f"{top.config.model_type}'s attention does not go through transformers' "
            "attention interface, where Ulysses' kernel runs",
            "set it to 1",
        )
    if hands_keywords_to_attention(top) is False:  # Nemotron: its layers drop them
        raise ConfigError(
            key,
            f"{top.config.model_type}'s decoder layers do not pass their forward keywords "
            "on to attention, so Ulysses' kernel would never get its sequence layout",
            "set it to 1",
        )
    register()
    # a vision-language model: its text decoder only (the vision tower attends per image)
    decoder = language_model(model)
    target = decoder if isinstance(decoder, PreTrainedModel) else top
    target.set_attn_implementation(ULYSSES_KERNEL)
    return decoder


def language_model(model: torch.nn.Module) -> torch.nn.Module | None:
    """The text decoder of a vision-language model (its ``language_model`` submodule);
    None for a text model."""
    return next((m for n, m in model.named_modules() if n.endswith("language_model")), None)


def rank_columns(x: Tensor, rows: Rows, group: SequenceGroup, fill: float = 0) -> Tensor:
    """This rank's columns of ``x`` ``(R, L, …)``, a tensor over the micro-batch's whole
    padded rows: rotated as :func:`padded_rows` rotates them, right-padded with ``fill``
    to ``size · width`` columns, and cut to the rank's ``width``."""
    R, L = x.shape[:2]
    if rows.rotation is not None:
        index = rows.rotation.view(R, L, *[1] * (x.dim() - 2)).expand_as(x)
        x = x.gather(1, index)
    width = -(-L // group.size)
    full = x.new_full((R, width * group.size, *x.shape[2:]), fill)
    full[:, :L] = x
    return full[:, group.rank * width : (group.rank + 1) * width]


@contextlib.contextmanager
def split_language_model(
    decoder: torch.nn.Module, rows: Rows, group: SequenceGroup
) -> Iterator[None]:
    """While active, the vision-language model's text ``decoder`` runs on this rank's
    columns: its top forward has merged the vision features into the embeddings of the
    whole rows and computed their M-RoPE positions (as an unsplit forward does), and this
    hook cuts both — and Qwen3-VL's deepstack features, the ones of the rank's vision
    tokens, in order — to the rank's columns. The attention mask stays with the
    Ulysses context."""

    def hook(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple:
        embeds = kwargs["inputs_embeds"]  # (R, L, H)
        kwargs["inputs_embeds"] = rank_columns(embeds, rows, group)
        pos = kwargs.get("position_ids")  # (k, R, L): M-RoPE's (and the text positions)
        if pos is not None:
            kwargs["position_ids"] = rank_columns(pos.movedim(0, -1), rows, group).movedim(-1, 0)
        kwargs["attention_mask"] = None
        mask = kwargs.get("visual_pos_masks")
        if mask is not None:  # Qwen3-VL's deepstack: features of the vision tokens
            order = torch.full(mask.shape, -1, dtype=torch.long, device=mask.device)
            order[mask] = torch.arange(int(mask.sum()), device=mask.device)
            mine = rank_columns(order, rows, group, fill=-1)
            kwargs["visual_pos_masks"] = mine >= 0
            kwargs["deepstack_visual_embeds"] = [
                e[mine[mine >= 0]] for e in kwargs["deepstack_visual_embeds"]
            ]
        return args, kwargs

    handle = decoder.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def ulysses_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-function signature on a rank's columns: ``query``
    ``(b, H, w, D)``, ``key``/``value`` ``(b, H_kv, w, D)`` -> ``(b, w, H, D)``.

    heads-split all-to-all -> SDPA over the whole sequence with ``H/sp`` heads ->
    sequence-split all-to-all. ``attention_mask`` is None (no mask interface is
    registered); the mask is the context's."""
    ctx: UlyssesContext | None = kwargs.pop(CONTEXT_KWARG, None)
    if ctx is None:
        raise RuntimeError(
            "a model set up for Ulysses sequence parallelism ran a forward without its "
            "context; every forward of such an engine goes through its sequence-parallel path"
        )
    group = ctx.group
    if key.shape[1] % group.size:  # fewer key/value heads than ranks: repeat them
        repeat = query.shape[1] // key.shape[1]
        key = key.repeat_interleave(repeat, dim=1)
        value = value.repeat_interleave(repeat, dim=1)
    # (b, H, w, D) -> (b, H/sp, L, D): send head block j to rank j, receive columns
    q, k, v = (_exchange(x, group, split=1, join=2) for x in (query, key, value))
    window = kwargs.get("sliding_window")  # a sliding-window layer's (Mistral, Gemma 3, …)
    if ctx.layout is not None:  # a packed row, segment by segment: (1, L, H/sp, D)
        out, _ = segment_attention(
            module,
            q,
            k,
            v,
            None,
            dropout,
            scaling,
            **{LAYOUT_KWARG: ctx.layout, "sliding_window": window},
        )
        out = out.transpose(1, 2)
    else:
        mask = ctx.mask if window is None else ctx.window_mask(window)
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=dropout,
            is_causal=mask is None,
            scale=scaling,
            enable_gqa=q.shape[1] != k.shape[1],
        )
    # (b, H/sp, L, D) -> (b, H, w, D): send column block j to rank j, receive heads
    out = _exchange(out, group, split=2, join=1)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make :data:`ULYSSES_KERNEL` a transformers attention implementation. Idempotent."""
    from transformers import AttentionInterface

    AttentionInterface.register(ULYSSES_KERNEL, ulysses_attention)


__all__ = [
    "CONTEXT_KWARG",
    "PACKED_KERNEL",
    "ULYSSES_KERNEL",
    "VL_MODEL_TYPES",
    "ColumnShard",
    "Rows",
    "SequenceGroup",
    "UlyssesContext",
    "check_heads",
    "check_model",
    "gather_routing",
    "language_model",
    "packed_rows",
    "padded_rows",
    "rank_columns",
    "register",
    "routing_columns",
    "sequence_groups",
    "sequence_mask",
    "shard_columns",
    "shard_routing",
    "split_language_model",
    "sum_owned",
    "ulysses_attention",
    "use_ulysses",
]
