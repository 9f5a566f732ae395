"""Attention of a packed row one prefix-tree segment at a time (``temper_segments``).

A packed row (:mod:`temper.training.packing`) is a run of segments, each a prompt followed
by the responses that share it; a token attends causally within its prompt, and a
response token to its prompt and to its own response. A dense kernel with a ``(T, T)``
mask visits all ``T²`` pairs of the row, most of them masked. This kernel gathers the
segments into two padded batches and runs two SDPA calls per layer:

* the prompts, ``(S, P)`` queries against their own keys, causal;
* the responses, ``(N, R)`` queries against their prompt's keys followed by their own,
  ``(N, P + R)``: all of the prompt, causal within the response.

It visits ``S·P² + N·R·(P + R)`` pairs (``P``, ``R`` the longest prompt and response),
never more than the padded layout's ``B·L²``, and builds no ``T²`` mask; so a packed row
never costs more attention than padding, and the layout choice can follow the tokens.

Registered with transformers' attention interface as :data:`SEGMENT_KERNEL`; a forward
that passes no :class:`SegmentLayout` (the padded layout, generation) runs SDPA as
transformers' own ``sdpa`` function does (:func:`unpacked_attention`: grouped-query heads
are not copied per query head under a mask), and its masks are built by ``sdpa``'s mask
function, so a model loaded with this kernel computes what ``sdpa`` computes when it is
not packed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

SEGMENT_KERNEL = "temper_segments"
#: the forward keyword that carries a packed row's :class:`SegmentLayout` to the kernel
LAYOUT_KWARG = "temper_segment_layout"


@dataclass(frozen=True)
class SegmentLayout:
    """Where each prompt and response of a packed row sits, as padded index batches.

    Padded slots index position 0 and are never written back; a padded query may attend
    to its batch's first key, so no mask row is empty (an empty row makes SDPA return
    NaN, whose gradient would reach real tokens)."""

    prompt_index: Tensor  # (S, P) long: packed position of each prompt token
    prompt_real: Tensor  # (S, P) bool
    prompt_mask: Tensor  # (S, 1, P, P) bool: True = attend
    response_index: Tensor  # (N, R) long
    response_real: Tensor  # (N, R) bool
    response_segment: Tensor  # (N,) long: the segment (prompt) each response belongs to
    response_mask: Tensor  # (N, 1, R, P + R) bool
    # the real slots as flat indices into the (S·P) / (N·R) batches, and their packed
    # positions: the kernel writes its outputs back with index ops that never wait for
    # the device (boolean indexing would, at every layer)
    prompt_slots: Tensor
    prompt_dest: Tensor
    response_slots: Tensor
    response_dest: Tensor
    # attention calls that ran this layout (:func:`reaches_every_layer`'s count)
    uses: list[int] = field(default_factory=lambda: [0], compare=False)
    # the masks of a sliding window, by window (built at the first layer that asks)
    windowed: dict[int, tuple[Tensor, Tensor]] = field(default_factory=dict, compare=False)

    def masks(self, window: int | None) -> tuple[Tensor, Tensor]:
        """The prompt and response masks, within a sliding ``window`` when one is given:
        a query at position ``q`` attends keys at ``k > q - window`` (transformers'
        convention). Prompts start at position 0, a response goes on from its prompt's
        last token; padded queries keep their key (:func:`_never_empty`)."""
        if window is None:
            return self.prompt_mask, self.response_mask
        if window not in self.windowed:
            P, R = self.prompt_mask.shape[-1], self.response_index.shape[1]
            slots = torch.arange(max(P, R), device=self.prompt_mask.device)
            p, r = slots[:P], slots[:R]
            in_prompt = (p[:, None] - p[None, :]) < window  # (P, P)
            start = self.prompt_real.sum(1)[self.response_segment]  # (N,) prompt lengths
            to_prompt = (start[:, None, None] + r[None, :, None] - p[None, None, :]) < window
            to_own = ((r[:, None] - r[None, :]) < window).expand(len(start), -1, -1)
            near = torch.cat([to_prompt, to_own], dim=-1)  # (N, R, P + R)
            self.windowed[window] = (
                self.prompt_mask & (in_prompt | ~self.prompt_real[:, None, :, None]),
                self.response_mask & (near[:, None] | ~self.response_real[:, None, :, None]),
            )
        return self.windowed[window]


def _runs(positions: Tensor, key: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Contiguous runs of equal ``key`` along ``positions``: (run of each position, its
    rank inside the run, run lengths)."""
    _, lengths = torch.unique_consecutive(key, return_counts=True)
    run = torch.repeat_interleave(torch.arange(len(lengths), device=key.device), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    return run, torch.arange(len(positions), device=key.device) - starts[run], lengths


def _batch(positions: Tensor, key: Tensor) -> tuple[Tensor, Tensor]:
    """``(runs, longest)`` index batch of ``positions`` grouped by runs of ``key``, and
    which slots are real."""
    run, rank, lengths = _runs(positions, key)
    rows = len(lengths)
    width = max(1, int(lengths.max())) if len(lengths) else 1
    index = torch.zeros(rows, width, dtype=torch.long, device=positions.device)
    real = torch.zeros(rows, width, dtype=torch.bool, device=positions.device)
    index[run, rank] = positions
    real[run, rank] = True
    return index, real


def _causal(n: int, device: torch.device) -> Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def _never_empty(mask: Tensor, query_real: Tensor) -> Tensor:
    """Let padded queries attend to key 0 (their output is discarded)."""
    first = torch.zeros(mask.shape[-1], dtype=torch.bool, device=mask.device)
    first[0] = True
    return mask | (~query_real[:, :, None] & first)


def segment_layout(
    segment: Tensor, owner: Tensor, device: torch.device | None = None
) -> SegmentLayout:
    """The layout of a packed row from its plan: ``segment`` ``(T,)`` the segment of each
    token, ``owner`` ``(T,)`` the row of a response token, -1 for a prompt token
    (:class:`~temper.training.packing.PackPlan`; segments are contiguous, each its prompt
    then its responses). Computed where ``segment`` lives (give CPU tensors: the sizes are
    read on the host) and moved to ``device``."""
    pos = torch.arange(segment.numel(), device=segment.device)
    is_prompt = owner < 0
    n_segments = int(segment.max()) + 1 if segment.numel() else 0
    # a segment whose prompt is empty still gets its (all-padding) row: responses index it
    p_pos = pos[is_prompt]
    prompt_index = torch.zeros(n_segments, 1, dtype=torch.long, device=segment.device)
    prompt_real = torch.zeros(n_segments, 1, dtype=torch.bool, device=segment.device)
    if p_pos.numel():
        seg = segment[p_pos]
        _, rank, _ = _runs(p_pos, seg)
        width = int(rank.max()) + 1
        prompt_index = torch.zeros(n_segments, width, dtype=torch.long, device=segment.device)
        prompt_real = torch.zeros(n_segments, width, dtype=torch.bool, device=segment.device)
        prompt_index[seg, rank] = p_pos
        prompt_real[seg, rank] = True
    P = prompt_index.shape[1]
    prompt_mask = _never_empty(_causal(P, segment.device) & prompt_real[:, None, :], prompt_real)
    r_pos = pos[~is_prompt]
    response_index, response_real = _batch(r_pos, owner[r_pos])
    _, _, lengths = _runs(r_pos, owner[r_pos])
    response_segment = segment[r_pos[torch.cumsum(lengths, 0) - lengths]]
    R = response_index.shape[1]
    own = _causal(R, segment.device) & response_real[:, None, :]
    on_prompt = prompt_real[response_segment][:, None, :].expand(-1, R, -1)
    response_mask = _never_empty(torch.cat([on_prompt, own], dim=-1), response_real)
    layout = SegmentLayout(
        prompt_index=prompt_index,
        prompt_real=prompt_real,
        prompt_mask=prompt_mask[:, None],
        response_index=response_index,
        response_real=response_real,
        response_segment=response_segment,
        response_mask=response_mask[:, None],
        prompt_slots=prompt_real.flatten().nonzero().flatten(),
        prompt_dest=prompt_index[prompt_real],
        response_slots=response_real.flatten().nonzero().flatten(),
        response_dest=response_index[response_real],
    )
    if device is None:
        return layout
    moved: dict[str, Any] = {
        k: v.to(device, non_blocking=True) for k, v in vars(layout).items() if isinstance(v, Tensor)
    }
    return replace(layout, **moved)


def _heads_first(x: Tensor, index: Tensor) -> Tensor:
    """``x`` ``(T, H, D)`` gathered at ``index`` ``(n, m)`` -> ``(n, H, m, D)``
    (``index_select``: its backward is an index-add, where advanced indexing's sorts)."""
    picked = x.index_select(0, index.flatten())
    return picked.view(*index.shape, *x.shape[1:]).transpose(1, 2)


def segment_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-function signature: ``query`` ``(1, H, T, D)``, ``key`` and
    ``value`` ``(1, H_kv, T, D)`` -> ``(1, T, H, D)``. Without a layout in ``kwargs``,
    transformers' ``sdpa`` function computes it."""
    layout: SegmentLayout | None = kwargs.pop(LAYOUT_KWARG, None)
    if layout is None:
        return unpacked_attention(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    layout.uses[0] += 1
    # a sliding-window layer (Mistral, Gemma 3, OLMo 3, …) passes its window
    prompt_mask, response_mask = layout.masks(kwargs.get("sliding_window"))
    # squeeze, not [0]: a select's backward zero-fills a gradient and copies into it
    q, k, v = (x.squeeze(0).transpose(0, 1) for x in (query, key, value))  # (T, H, D)
    gqa = q.shape[1] != k.shape[1]
    kp, vp = _heads_first(k, layout.prompt_index), _heads_first(v, layout.prompt_index)
    prompts = F.scaled_dot_product_attention(
        _heads_first(q, layout.prompt_index),
        kp,
        vp,
        attn_mask=prompt_mask,
        dropout_p=dropout,
        scale=scaling,
        enable_gqa=gqa,
    ).transpose(1, 2)  # (S, P, H, D)
    # SDPA's output dtype, which autocast may make lower than the inputs'
    # (T, H, Dv): the values' head size, which MLA (DeepSeek-V3) makes differ from q's
    out = prompts.new_zeros((*q.shape[:2], v.shape[-1])).index_copy(
        0, layout.prompt_dest, prompts.flatten(0, 1).index_select(0, layout.prompt_slots)
    )
    if layout.response_dest.numel():
        seg = layout.response_segment
        responses = F.scaled_dot_product_attention(
            _heads_first(q, layout.response_index),
            torch.cat([kp[seg], _heads_first(k, layout.response_index)], dim=2),
            torch.cat([vp[seg], _heads_first(v, layout.response_index)], dim=2),
            attn_mask=response_mask,
            dropout_p=dropout,
            scale=scaling,
            enable_gqa=gqa,
        ).transpose(1, 2)  # (N, R, H, D)
        picked = responses.flatten(0, 1).index_select(0, layout.response_slots)
        out = out.index_copy(0, layout.response_dest, picked.to(out.dtype))
    return out[None], None


def unpacked_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """A forward without a layout (a padded row, a generation step): transformers' ``sdpa``
    function, except that grouped-query heads stay grouped under a mask.

    transformers repeats each key/value head for its query heads whenever a mask is given
    (CUDA's fused kernels take no mask with grouped heads), which in generation copies the
    whole KV cache at every layer of every decoding step. This kernel runs on CPU, where
    SDPA's ``enable_gqa`` takes the mask: the same sums, without the copies
    (``benchmarks/gqa_attention.py``).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    # transformers' own test for grouped heads: the attention module's group count
    groups = int(getattr(module, "num_key_value_groups", 1))
    plain = not any(kwargs.get(k) is not None for k in ("position_bias", "cache"))
    if attention_mask is None or groups == 1 or not plain or query.device.type != "cpu":
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


def reaches_every_layer(model: torch.nn.Module) -> bool:
    """Whether ``model``'s layers hand a packed row's layout to every attention call: one
    tiny packed forward (two 2-token segments), on the loaded model before any sharding,
    so every rank decides alike. A decoder layer that drops its forward keywords
    (Nemotron's) never passes the layout on, and the kernel would run transformers' SDPA
    across the whole packed row."""
    config: Any = model.config
    device = next(model.parameters()).device
    layout = segment_layout(torch.tensor([0, 0, 1, 1]), torch.full((4,), -1), device=device)
    with torch.no_grad():
        model(
            input_ids=torch.zeros(1, 4, dtype=torch.long, device=device),
            position_ids=torch.tensor([[0, 1, 0, 1]], device=device),
            use_cache=False,
            **{LAYOUT_KWARG: layout},
        )
    return layout.uses[0] == int(config.get_text_config().num_hidden_layers)


def hands_keywords_to_attention(model: torch.nn.Module) -> bool | None:
    """Whether ``model``'s layers pass their forward keywords on to every attention call
    (what a kernel that takes its layout as a keyword — this one, Ulysses' — needs):
    :func:`reaches_every_layer` with the segment kernel set for the probe and the
    model's own implementation restored after it. None where no probe can run: its
    parameters are not whole (ZeRO-3 partitions them at load; a meta init has none)."""
    if not all(p.numel() and p.device.type != "meta" for p in model.parameters()):
        return None
    config: Any = model.config
    before = config._attn_implementation
    register()
    model.set_attn_implementation(SEGMENT_KERNEL)  # type: ignore[operator]
    try:
        return reaches_every_layer(model)
    finally:
        model.set_attn_implementation(before)  # type: ignore[operator]


def suits_generation(config: Any, auto_cls: Any) -> bool:
    """Whether a model loaded only to generate (no packed rows) on CPU may take this
    kernel where it would run ``sdpa``: its unpacked forwards are ``sdpa``'s sums without
    copying grouped key/value heads (:func:`unpacked_attention`). Only for a text model
    that transformers itself implements (remote code may not call the attention
    interface), with SDPA support, layers that call the attention interface, and plain
    softmax attention (a sliding window is fine: ``sdpa``'s mask carries it)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from temper.training.attention_kind import attention_limit, declares

    keys = config.to_dict()
    return (
        keys.get("model_type") in CONFIG_MAPPING
        and getattr(config, "vision_config", None) is None
        and attention_limit(keys, windows=True) is None
        and declares(keys, "_supports_sdpa", (auto_cls,))
        and declares(keys, "_supports_attention_backend", (auto_cls,))
    )


def register() -> None:
    """Make :data:`SEGMENT_KERNEL` a transformers attention implementation (its masks, for
    unpacked forwards, are ``sdpa``'s). Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(SEGMENT_KERNEL, segment_attention)
    AttentionMaskInterface.register(SEGMENT_KERNEL, sdpa_mask)


__all__ = [
    "LAYOUT_KWARG",
    "SEGMENT_KERNEL",
    "SegmentLayout",
    "hands_keywords_to_attention",
    "register",
    "segment_attention",
    "segment_layout",
    "suits_generation",
    "unpacked_attention",
]
