"""Sequence packing of a training micro-batch (``model.use_remove_padding``).

A micro-batch arrives padded (:func:`~temper.training.micro_batching.model_inputs`: left
padded prompts ‖ right padded responses, ``(B, L)``). Packed, its real tokens are one row
``(1, T)``, ``T = Σ lᵢ``, with position ids restarting at 0 for every sequence, and the
attention kept inside each sequence:

* ``flash_attention_2``/``_3``: no mask; transformers derives ``cu_seqlens`` from the
  restarting position ids and runs flash-attn's varlen kernel (transformers 5:
  ``modeling_flash_attention_utils._is_packed_sequence``), so attention costs ``Σ lᵢ²``;
* ``temper_segments`` (what an ``sdpa`` model is loaded with on CPU when packing is on;
  :mod:`temper.training.segment_attention`): no mask; the row's
  :class:`~temper.training.segment_attention.SegmentLayout` rides along with the forward
  and the kernel attends prompt by prompt and response by response, visiting no more pairs
  than the padded layout;
* ``sdpa`` (on CUDA): a block-diagonal causal 4-D bool mask ``(1, 1, T, T)``. Position ids
  alone do not separate the sequences when a 2-D mask is passed (transformers then builds
  a plain causal mask over the whole row), so the mask is built here, explicitly. The
  fused kernel still visits all ``T²`` pairs;
* ``eager``: the same mask, additive;
* any other kernel (``flex_attention``, …): no mask, the position ids alone, from which
  transformers builds its own block mask (``masking_utils.find_packed_sequence_indices``).

**Shared prompts.** Rows of a micro-batch with the same prompt (a GRPO group: ``n``
responses to one prompt) carry that prompt once in the packed row, followed by each row's
response, and the mask is a prefix tree: a response attends to the shared prompt and to
itself, never to a sibling. Under causal attention a prompt's hidden states do not depend
on what follows it, so every log-prob, value and gradient is the one of the unshared
layout (the gradient a shared prompt token receives is the sum of what its copies would
receive). With short responses this removes most of a group's tokens (8 prompts × 4
responses of 16 tokens after ~36-token prompts: 416 tokens → 200). Segment and masked
kernels only: a varlen kernel cannot express a prefix tree, so there each row keeps its own
prompt.

Because a dense ``T²`` masked attention can cost more than padding (long, similar
lengths), each micro-batch takes the cheaper layout by a cost model (:func:`model_cost`):
``cost ≈ linear FLOPs per token · tokens + w · attention FLOPs per pair · pairs``, both
from the model's config, with ``w`` (:data:`CPU_ATTENTION_WEIGHT`) the measured price of
a masked dense attention FLOP relative to a matmul FLOP. The choice is a pure function of
the lengths and the config — never of timings taken during the run — so a resumed run
makes the same choices as an uninterrupted one and every data-parallel rank decides alike.
With a varlen or the segment kernel packing never costs more (``T ≤ B·L`` and
``Σ lᵢ² ≤ B·L²``), so the cost model packs whenever packing removes a token.

Packing also cuts the LM head to the positions that score a real response token (the
padded layout computes it on every row's last ``r + 1`` positions); the cost model leaves
that saving out, so it errs towards padding.

Not packed, by choice: vision-language rows (Qwen2-VL's 3-D M-RoPE positions are computed
by the model from the padded 2-D mask and the image grids; see
:mod:`temper.training.vision`), the Megatron engine (its own model and forward,
:mod:`temper.training.megatron_engine`), and, unless a varlen kernel runs them, models
whose attention is not the plain causal softmax the masks here encode (a sliding window,
sinks, soft-capping, non-attention layers: :mod:`temper.training.attention_kind`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from temper.training.micro_batching import ModelInputs, to_device
from temper.training.segment_attention import (
    LAYOUT_KWARG,
    SEGMENT_KERNEL,
    SegmentLayout,
    segment_layout,
)

log = logging.getLogger(__name__)

Layout = Literal["padded", "packed"]

#: attention kernels that run packed rows as variable-length sequences (cost Σ lᵢ²)
VARLEN_KERNELS = ("flash_attention_2", "flash_attention_3")
#: attention kernels that get the block-diagonal mask built here
MASKED_KERNELS = ("sdpa", "eager")
#: kernels that run a packed row segment by segment from its :class:`SegmentLayout`
SEGMENT_KERNELS = (SEGMENT_KERNEL,)
#: kernels that can run a prefix tree (a prompt shared by its group's responses)
PREFIX_TREE_KERNELS = MASKED_KERNELS + SEGMENT_KERNELS


@dataclass(frozen=True)
class LayoutCost:
    """Predicted forward seconds ``≈ per_token·tokens + per_pair·attention pairs`` (the
    per-forward constant is the same for both layouts and cancels).

    ``varlen``: the attention of a packed row costs ``Σ lᵢ²`` (flash-attn varlen) instead
    of ``T²`` (a dense masked kernel)."""

    per_token: float
    per_pair: float
    varlen: bool = False


def layout_costs(
    lengths: Sequence[int], width: int, cost: LayoutCost, packed_tokens: int | None = None
) -> tuple[float, float]:
    """``(padded, packed)`` predicted cost of a micro-batch of real ``lengths`` whose padded
    layout is ``len(lengths) × width``; ``packed_tokens``: the packed row's length when
    shared prompts make it shorter than ``Σ lengths`` (masked kernels only)."""
    rows = len(lengths)
    total = sum(lengths) if packed_tokens is None else packed_tokens
    pairs = sum(n * n for n in lengths) if cost.varlen else total * total
    padded = cost.per_token * rows * width + cost.per_pair * rows * width * width
    packed = cost.per_token * total + cost.per_pair * pairs
    return padded, packed


def choose_layout(
    lengths: Sequence[int], width: int, cost: LayoutCost, packed_tokens: int | None = None
) -> Layout:
    """The cheaper layout; ``padded`` when packing removes no token (one row, or every
    row filling ``width`` and no prompt shared) or on a tie."""
    total = sum(lengths) if packed_tokens is None else packed_tokens
    if len(lengths) < 2 or total == len(lengths) * width:
        return "padded"
    padded, packed = layout_costs(lengths, width, cost, packed_tokens)
    return "packed" if packed < padded else "padded"


#: Cost of one FLOP of masked dense attention (sdpa/eager with a 4-D mask, fp32, CPU)
#: relative to one FLOP of the linear layers, for SmolLM2-135M (the CPU model users
#: train), fwd+bwd, 2 threads, 8 rows per micro-batch:
#: * ``benchmarks/packing.py --model smollm2 --threads 2``, rows of 112-128 tokens and
#:   nothing shared: packed is 1.14x padded's time, which any weight above 0.25 predicts;
#: * GRPO groups of 4 at 128 response tokens with their ~35-token prompts shared
#:   (the shapes of ``benchmarks/vs_trl.py --length 128``): packed is 0.89x padded's
#:   time, which any weight below 0.71 predicts;
#: * ``--calibrate`` fits (no-grad forwards up to 128 tokens): 0.4-0.65, some fits ~0.
#: 0.5 sits in all three. The weight depends on the model: a 19M-parameter toy Llama fits
#: 1.2-3.2, so there an even-length micro-batch may pack at a loss (~15%).
CPU_ATTENTION_WEIGHT = 0.5


def model_cost(config: Any, *, varlen: bool) -> LayoutCost:
    """:class:`LayoutCost` of a decoder-only transformer from its (Hugging Face) config.

    ``per_token = 2·layers·(d·(h + 2·kv)·hd + h·hd·d + 3·d·ffn)`` (the q, k, v, o
    projections and a gated MLP; embeddings and the LM head are alike in both layouts) and
    ``per_pair = w · 4·layers·h·hd`` (``QKᵀ`` and ``softmax·V``), ``w`` =
    :data:`CPU_ATTENTION_WEIGHT` for a masked kernel, 1 for varlen."""
    d = int(config.hidden_size)
    layers = int(config.num_hidden_layers)
    heads = int(config.num_attention_heads)
    hd = int(getattr(config, "head_dim", None) or d // heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    ffn = int(getattr(config, "intermediate_size", None) or 4 * d)
    per_token = 2.0 * layers * (d * (heads + 2 * kv) * hd + heads * hd * d + 3 * d * ffn)
    weight = 1.0 if varlen else CPU_ATTENTION_WEIGHT
    return LayoutCost(
        per_token=per_token, per_pair=weight * 4.0 * layers * heads * hd, varlen=varlen
    )


def fit_layout_cost(samples: Sequence[tuple[int, int, float]]) -> LayoutCost:
    """Least-squares ``seconds = c₀ + per_token·rows·len + per_pair·rows·len²`` over
    ``(rows, len, seconds)`` timings of dense masked forwards; coefficients clamped to be
    non-negative (a noisy fit must not reward extra work). The calibration behind
    :data:`CPU_ATTENTION_WEIGHT` (``benchmarks/packing.py --calibrate``)."""
    a = torch.tensor([[1.0, r * n, r * n * n] for r, n, _ in samples], dtype=torch.float64)
    b = torch.tensor([[s] for _, _, s in samples], dtype=torch.float64)
    coef = torch.linalg.lstsq(a, b).solution.flatten().tolist()
    per_token, per_pair = max(coef[1], 0.0), max(coef[2], 0.0)
    if per_token == 0.0 and per_pair == 0.0:
        per_token = 1.0  # no signal: tokens decide (packing never adds tokens)
    return LayoutCost(per_token=per_token, per_pair=per_pair)


#: calibration shapes (rows, length): equal token counts with different attention
#: pairs separate the two coefficients; the short ones pin the constant
CALIBRATION_SHAPES = ((1, 128), (2, 64), (8, 16), (1, 32), (4, 8))


def measure_layout_cost(run: Callable[[int, int], None], *, repeats: int = 2) -> LayoutCost:
    """Time ``run(rows, length)`` (one dense masked no-grad forward of a model) on
    :data:`CALIBRATION_SHAPES`, best of ``repeats`` each after one warm-up, and fit
    :class:`LayoutCost` (for ``benchmarks/packing.py --calibrate``; training never times
    anything to choose a layout)."""
    start = time.perf_counter()
    run(*CALIBRATION_SHAPES[0])  # warm-up: first-call allocations, kernel selection
    samples = []
    for rows, length in CALIBRATION_SHAPES:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            run(rows, length)
            best = min(best, time.perf_counter() - t0)
        samples.append((rows, length, best))
    cost = fit_layout_cost(samples)
    log.info(
        "packing cost model measured in %.2f s: %.3g s/token, %.3g s/attention pair",
        time.perf_counter() - start,
        cost.per_token,
        cost.per_pair,
    )
    return cost


def prefix_tree_mask(
    segment: torch.Tensor, owner: torch.Tensor, *, additive_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``(1, 1, T, T)`` mask of a packed row: token ``t`` attends to ``s`` iff ``s ≤ t``, both
    are in the same ``segment`` (a prompt and the responses that share it) and ``s`` is a
    prompt token (``owner[s] = -1``) or of ``t``'s own response (``owner[s] = owner[t]``).

    Bool (True: attend) for sdpa; with ``additive_dtype``, 0 / dtype-min for eager."""
    idx = torch.arange(segment.numel(), device=segment.device)
    mask = (
        (segment[:, None] == segment[None, :])
        & (idx[:, None] >= idx[None, :])
        & ((owner[None, :] == -1) | (owner[None, :] == owner[:, None]))
    )[None, None]
    if additive_dtype is None:
        return mask
    zero = torch.zeros((), dtype=additive_dtype, device=segment.device)
    return torch.where(mask, zero, torch.finfo(additive_dtype).min)


def block_causal_mask(
    lengths: torch.Tensor, *, additive_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``(1, 1, T, T)`` causal attention inside each sequence of ``lengths``, none across
    (:func:`prefix_tree_mask` with nothing shared)."""
    segment = torch.repeat_interleave(torch.arange(len(lengths), device=lengths.device), lengths)
    return prefix_tree_mask(segment, torch.full_like(segment, -1), additive_dtype=additive_dtype)


@dataclass(frozen=True)
class PackPlan:
    """Where every real token of a padded micro-batch sits in its packed row.

    Segments are laid out one after the other, each as its prompt then its rows'
    responses in row order; without sharing a segment is one row."""

    where: torch.Tensor  # (B, L) long: packed index of each real token, -1 at padding
    segment: torch.Tensor  # (T,) segment of each packed token
    owner: torch.Tensor  # (T,) row of a response token, -1 for a prompt token
    lengths: torch.Tensor  # (S,) tokens per segment

    @property
    def tokens(self) -> int:
        """``T``, the packed row's length."""
        return int(self.segment.numel())


def plan_packing(inp: ModelInputs, *, share_prompts: bool) -> PackPlan:
    """The packed layout of ``inp``; with ``share_prompts``, rows whose real prompt tokens
    are identical form one segment that carries the prompt once (module doc)."""
    host = inp.host  # planned on the host: no waits for the device
    real = (host.attention_mask > 0).cpu()
    p_cols = real.shape[1] - inp.response_len
    ids = host.input_ids.cpu()
    members: dict[tuple[int, ...], list[int]] = {}
    for i in range(real.shape[0]):
        prompt = ids[i, :p_cols][real[i, :p_cols]]
        members.setdefault(tuple(prompt.tolist()) if share_prompts else (i,), []).append(i)
    where = torch.full(real.shape, -1, dtype=torch.long)
    segment: list[torch.Tensor] = []
    owner: list[torch.Tensor] = []
    cursor = 0
    for s, rows in enumerate(members.values()):
        n = int(real[rows[0], :p_cols].sum())  # the members' prompts are the same tokens
        for i in rows:
            where[i, :p_cols][real[i, :p_cols]] = torch.arange(cursor, cursor + n)
        segment.append(torch.full((n,), s))
        owner.append(torch.full((n,), -1))
        cursor += n
        for i in rows:
            cols = real[i, p_cols:]
            m = int(cols.sum())
            where[i, p_cols:][cols] = torch.arange(cursor, cursor + m)
            segment.append(torch.full((m,), s))
            owner.append(torch.full((m,), i))
            cursor += m
    seg = torch.cat(segment)
    device = inp.input_ids.device
    return PackPlan(
        where=to_device(where, device),
        segment=to_device(seg, device),
        owner=to_device(torch.cat(owner), device),
        lengths=to_device(torch.bincount(seg, minlength=len(members)), device),
    )


@dataclass
class PackedInputs:
    """A micro-batch as one row, and where its response scores sit in it.

    ``keep`` are the packed positions whose outputs score the response tokens ``valid``
    (row-major), so ``outputs[keep]`` unpacks with ``valid.put``."""

    input_ids: torch.Tensor  # (1, T)
    position_ids: torch.Tensor  # (1, T), restarting at 0 per segment (responses go on
    # from their prompt's end)
    attention_mask: torch.Tensor | None  # (1, 1, T, T) or None (kernel derives it)
    lengths: torch.Tensor  # (S,) tokens per segment
    keep: torch.Tensor  # (K,)
    valid: Scored  # the (B, r) response tokens scored
    token_index: torch.Tensor  # (B, L) packed position of each padded token, -1 at padding
    segments: SegmentLayout | None = None  # the segment kernel's layout

    def model_inputs(self) -> dict[str, Any]:
        """The model's forward keywords for this row (the segment kernel's layout rides
        along as a keyword transformers hands to the attention function)."""
        out: dict[str, Any] = {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "position_ids": self.position_ids,
        }
        if self.segments is not None:
            out[LAYOUT_KWARG] = self.segments
        return out


@dataclass(frozen=True)
class Scored:
    """The response positions ``(B, r)`` a forward scores, on the model's device: ``mask``
    (bool) and their row-major coordinates ``rows``, ``cols`` ``(K,)``.

    Selecting by coordinates needs no count from the device; a boolean mask's selection
    (and its backward) reads one back, a wait for the device at every use on a GPU."""

    mask: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """``x[mask]``: the scored entries ``(K, …)`` of ``x`` ``(B, ≥r, …)``
        (differentiable)."""
        return x[self.rows, self.cols]

    def put(self, x: torch.Tensor) -> torch.Tensor:
        """Per-scored-position ``x`` ``(K, …)`` back to ``(B, r, …)``, zeros elsewhere
        (differentiable)."""
        out = x.new_zeros(tuple(self.mask.shape) + tuple(x.shape[1:]))
        return out.index_put((self.rows, self.cols), x)


def scored_positions(inp: ModelInputs) -> Scored:
    """The response tokens a forward scores — real, and after a real token (the logits at
    padded column ``L-r-1+k`` score response token ``k``). Both layouts compute log-probs
    and entropy on these positions only, never on padding. Found on the host's copy of
    the mask when ``inp`` keeps one."""
    host = inp.host
    real = host.attention_mask > 0
    L, r = real.shape[1], host.response_len
    mask = real[:, L - r :] & real[:, L - r - 1 : L - 1]
    rows, cols = mask.nonzero(as_tuple=True)
    device = inp.attention_mask.device
    return Scored(to_device(mask, device), to_device(rows, device), to_device(cols, device))


def pack(
    inp: ModelInputs,
    attn_implementation: str,
    dtype: torch.dtype,
    plan: PackPlan | None = None,
) -> PackedInputs:
    """Pack the padded ``inp`` into one row by ``plan`` (default: nothing shared; module
    doc: the mask per kernel). A shared prompt must have a masked kernel.

    Position ids are ``inp.position_ids`` at real tokens (``cumsum(mask) - 1`` per row),
    which a shared prompt's rows agree on; the logits that score a row's first response
    token sit at its (possibly shared) last prompt token."""
    real = inp.attention_mask > 0
    L, r = real.shape[1], inp.response_len
    plan = plan if plan is not None else plan_packing(inp, share_prompts=False)
    shared = plan.tokens < int((inp.host.attention_mask > 0).sum())
    if shared and attn_implementation not in PREFIX_TREE_KERNELS:
        raise ValueError(
            f"shared prompts need a masked or segment attention kernel, not {attn_implementation}"
        )
    valid = scored_positions(inp)
    segments = None
    if attn_implementation in SEGMENT_KERNELS:
        # built on the host (its sizes are host numbers), then moved: no device waits
        segments = segment_layout(plan.segment.cpu(), plan.owner.cpu(), device=real.device)
        # a 4-D mask is passed through by transformers' mask builders untouched: this
        # placeholder stops them building a (T, T) mask the segment kernel never reads
        mask: torch.Tensor | None = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=real.device)
    elif attn_implementation in MASKED_KERNELS:
        additive = dtype if attn_implementation == "eager" else None
        mask = prefix_tree_mask(plan.segment, plan.owner, additive_dtype=additive)
    else:
        mask = None
    index = plan.where[real]
    input_ids = inp.input_ids.new_empty(plan.tokens).index_put_((index,), inp.input_ids[real])
    positions = inp.position_ids.new_empty(plan.tokens).index_put_((index,), inp.position_ids[real])
    return PackedInputs(
        input_ids=input_ids[None],
        position_ids=positions[None],
        attention_mask=mask,
        lengths=plan.lengths,
        keep=valid.take(plan.where[:, L - r - 1 : L - 1]),
        valid=valid,
        token_index=plan.where,
        segments=segments,
    )


__all__ = [
    "CALIBRATION_SHAPES",
    "CPU_ATTENTION_WEIGHT",
    "PREFIX_TREE_KERNELS",
    "SEGMENT_KERNELS",
    "Layout",
    "LayoutCost",
    "PackPlan",
    "PackedInputs",
    "Scored",
    "block_causal_mask",
    "choose_layout",
    "fit_layout_cost",
    "layout_costs",
    "measure_layout_cost",
    "model_cost",
    "pack",
    "plan_packing",
    "prefix_tree_mask",
    "scored_positions",
]
