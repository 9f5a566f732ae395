"""The modules temper puts into a Megatron-Core ``GPTModel`` so that it runs on CPU too.

Megatron-Core's local layer spec (``get_gpt_layer_local_spec``) needs neither Apex nor
TransformerEngine, but a few of its pieces assume a GPU. Each workaround below goes
through Megatron's public extension points (layer specs, ``RotaryEmbedding``'s
interface, ``GPTModel.output_layer``'s call signature) and says why it exists:

* :class:`SDPACoreAttention` — Megatron's ``DotProductAttention`` allocates its score
  buffer with ``torch.cuda.current_device()``; this module computes the same attention
  with ``torch.nn.functional.scaled_dot_product_attention`` and is put into the spec at
  ``submodules.self_attention.submodules.core_attention``. Causal masking only: the
  engine feeds rows whose real tokens start at position 0 (see megatron_engine). Under
  context parallelism it gathers the keys and values over the CP group and masks by
  global position (:mod:`megatron_cp`).
* :class:`HFRotaryEmbedding` — ``RotaryEmbedding.get_emb`` moves ``inv_freq`` to CUDA
  unconditionally; this subclass keeps it where the model is, and takes ``inv_freq``
  from transformers' own RoPE initializer for the checkpoint's config
  (:func:`megatron_convert.hf_inv_freq`), so ``rope_theta`` and ``rope_scaling``
  (linear, llama3) are exactly Hugging Face's.
* :class:`HostTopKRouter` — ``TopKRouter.gating`` moves a CPU router weight to CUDA;
  this subclass computes the same logits where the weight is (an MoE layer's
  ``submodules.router``, see :func:`moe_block_spec`).
* :class:`HostAllGatherTokenDispatcher` — Megatron's all-gather token dispatcher (the
  one that runs on gloo: all-gather and reduce-scatter; the all-to-all dispatcher makes
  a CUDA stream when built) allocates its collectives' outputs on CUDA; this subclass
  exchanges the same tensors where they are. Swapped into each MoE layer after the
  model is built (:func:`use_host_dispatchers`), as the RoPE module is.
* :class:`ValueHead` — the critic's scalar head, called where ``GPTModel`` calls its
  output layer (``(hidden, weight=…, runtime_gather_output=…) -> (out, bias)``).

On CUDA with TransformerEngine installed :func:`layer_spec` returns TE's spec (fused
kernels, sequence parallel); everything else there is Megatron's own.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.moe.moe_layer import MoELayer, MoESubmodules
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.moe.token_dispatcher import MoEAllGatherTokenDispatcher
from torch import nn

from temper.training.megatron_cp import (
    causal_mask,
    cp_positions,
    gather_kv,
    held_positions,
    rotary_rows,
)


def has_transformer_engine() -> bool:
    """True when TransformerEngine imports (CUDA machines with ``transformer_engine``)."""
    try:
        import transformer_engine  # noqa: F401
    except Exception:  # ImportError, or a broken CUDA install raising at import
        return False
    return True


class SDPACoreAttention(MegatronModule):
    """Core attention (``softmax(QKᵀ·scale)·V``, causal) with torch's SDPA kernel.

    Same constructor and call signature as Megatron's ``DotProductAttention``; inputs
    ``query (sq, b, np, hn)``, ``key``/``value (sk, b, ng, hn)`` (grouped-query heads
    are repeated), output ``(sq, b, np·hn)``. Under context parallelism (the CP group
    from ``pg_collection``, as Megatron's attention gets it) the inputs are this rank's
    share of the sequence (:mod:`megatron_cp`'s layout): the keys and values of every CP
    rank are gathered and the causal mask is applied by global positions, so each query
    sees what it sees at CP = 1.
    """

    def __init__(
        self,
        config: Any,
        layer_number: int,
        attn_mask_type: Any,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: Any = None,
    ) -> None:
        super().__init__(config=config)
        self.cp_group = None
        if config.context_parallel_size > 1:
            from megatron.core import parallel_state

            cp = getattr(pg_collection, "cp", None) if pg_collection is not None else None
            self.cp_group = cp if cp is not None else parallel_state.get_context_parallel_group()
        head_dim = config.kv_channels
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1 / math.sqrt(head_dim)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        if attention_mask is not None or attention_bias is not None or packed_seq_params:
            raise ValueError("SDPACoreAttention takes causal, unpacked inputs only")
        sq, b, heads, dim = query.shape
        mask = None
        if self.cp_group is not None:  # keys/values of the whole sequence, masked by position
            cp = torch.distributed.get_world_size(self.cp_group)
            rank = torch.distributed.get_rank(self.cp_group)
            key, value = gather_kv(key, self.cp_group), gather_kv(value, self.cp_group)
            length = sq * cp
            q_pos = cp_positions(length, cp, rank).to(query.device)
            mask = causal_mask(q_pos, held_positions(length, cp).to(query.device))
        groups = key.shape[2]
        if heads != groups:  # grouped-query attention: each K/V head serves heads/groups Qs
            key = key.repeat_interleave(heads // groups, dim=2)
            value = value.repeat_interleave(heads // groups, dim=2)
        # (s, b, h, d) -> (b, h, s, d)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        out = torch.nn.functional.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=mask is None,
            dropout_p=self.dropout if self.training else 0.0,
            scale=self.softmax_scale,
        )
        return out.permute(2, 0, 1, 3).reshape(sq, b, heads * dim)


class HFRotaryEmbedding(RotaryEmbedding):
    """Megatron's ``RotaryEmbedding`` with Hugging Face's ``inv_freq``, on any device.

    :meth:`get_emb` is replaced (the parent moves ``inv_freq`` to CUDA there); the
    frequencies are ``outer(positions, inv_freq)`` duplicated over both halves, as in the
    parent and in transformers. :meth:`forward` too, for context parallelism: the parent
    moves its CP row index to CUDA.
    """

    def __init__(self, inv_freq: torch.Tensor, *, cp_group: Any = None) -> None:
        dim = 2 * inv_freq.numel()
        super().__init__(
            kv_channels=dim, rotary_percent=1.0, use_cpu_initialization=True, cp_group=cp_group
        )
        self.inv_freq = inv_freq.clone()

    def get_emb(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb[:, None, None, :]

    def forward(
        self,
        max_seq_len: int,
        offset: int = 0,
        packed_seq: bool = False,
        cp_group: Any = None,
    ) -> torch.Tensor:
        """The table for ``max_seq_len`` positions; under context parallelism (unpacked)
        this CP rank's rows (:func:`megatron_cp.rotary_rows`), as the parent selects them."""
        emb = self.get_emb(max_seq_len, offset)
        group = cp_group if cp_group is not None else self.cp_group
        if group is not None and group.size() > 1 and not packed_seq:
            emb = rotary_rows(emb, group.size(), group.rank())
        return emb

    def to_device(self, device: torch.device) -> None:
        """``inv_freq`` is a plain attribute (not a buffer): moved explicitly (the table is
        made at each call, :meth:`forward` keeps no cache)."""
        self.inv_freq = self.inv_freq.to(device)


class ValueHead(nn.Module):
    """``values = Linear(hidden, 1)``, replicated on every tensor-parallel rank.

    Its input (the final-norm hidden states) is the same on every TP rank, so its
    gradient is too; no collective is needed. Called like ``GPTModel.output_layer``.
    Under sequence parallelism (``sequence_group``: the TP group) each rank holds its
    share of the positions, gathered first as Megatron's output layer gathers them.
    """

    def __init__(
        self,
        hidden_size: int,
        dtype: torch.dtype,
        device: torch.device,
        sequence_group: Any = None,
    ) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1, dtype=dtype, device=device)
        self.sequence_group = sequence_group

    def forward(
        self,
        hidden: torch.Tensor,
        weight: torch.Tensor | None = None,
        runtime_gather_output: bool | None = None,
    ) -> tuple[torch.Tensor, None]:
        if self.sequence_group is not None:
            from temper.training.megatron_sp import gather_sequence

            hidden = gather_sequence(hidden, self.sequence_group)
        return self.linear(hidden.to(self.linear.weight.dtype)), None


def layer_spec(*, qk_layernorm: bool, use_te: bool) -> Any:
    """The decoder layer spec: TransformerEngine's (CUDA, TE installed) or the local one
    with RMSNorm and :class:`SDPACoreAttention`."""
    if use_te:
        from megatron.core.models.gpt.gpt_layer_specs import (
            get_gpt_layer_with_transformer_engine_spec,
        )

        return get_gpt_layer_with_transformer_engine_spec(qk_layernorm=qk_layernorm)
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    spec = get_gpt_layer_local_spec(qk_layernorm=qk_layernorm, normalization="RMSNorm")
    spec.submodules.self_attention.submodules.core_attention = SDPACoreAttention
    return spec


class HostTopKRouter(TopKRouter):
    """Megatron's ``TopKRouter`` with its weight left where the model is.

    Only :meth:`gating` is replaced: the parent moves a CPU router weight to CUDA on its
    first call, and its ``router_gating_linear`` names TransformerEngine's GEMM even
    where TE is not installed (a ``NameError``); this one computes the same logits,
    ``input · weightᵀ (+ bias)`` in the configured ``moe_router_dtype``, with torch's
    linear on the weight's device.
    """

    def gating(self, input: torch.Tensor) -> torch.Tensor:
        router_dtype = input.dtype
        if self.config.moe_router_dtype == "fp32":
            router_dtype = torch.float32
        elif self.config.moe_router_dtype == "fp64":
            router_dtype = torch.float64
        bias = self.bias.to(router_dtype) if self.bias is not None else None
        return torch.nn.functional.linear(
            input.to(router_dtype), self.weight.to(router_dtype), bias
        )


def moe_block_spec(config: Any, *, use_te: bool, vp_stage: int | None = None) -> Any:
    """The decoder block of a mixture-of-experts model: Megatron's per-layer specs (MoE
    or dense layers after ``config.moe_layer_freq``) with ``SequentialMLP`` experts; off
    TransformerEngine, :class:`SDPACoreAttention` and :class:`HostTopKRouter` in each.
    ``vp_stage``: the model chunk whose layers the block holds (interleaved stages)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    block = get_gpt_decoder_block_spec(
        config, use_transformer_engine=use_te, normalization="RMSNorm", vp_stage=vp_stage
    )
    if use_te:
        return block
    for spec in block.layer_specs:
        spec.submodules.self_attention.submodules.core_attention = SDPACoreAttention
        mlp = spec.submodules.mlp
        if isinstance(mlp.submodules, MoESubmodules):
            mlp.submodules.router = HostTopKRouter
    return block


class _GatherTokens(torch.autograd.Function):
    """Every rank's rows of ``x`` (``sizes[r]`` rows on rank r of ``group``), in rank
    order; backward: reduce-scatter (each rank's rows get the gradient every rank's
    experts gave them)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, sizes: list[int]) -> torch.Tensor:
        ctx.group, ctx.sizes = group, sizes
        return _gather_rows(x, group, sizes)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _scatter_rows(grad, ctx.group, ctx.sizes), None, None


class _ScatterTokens(torch.autograd.Function):
    """The sum over ``group`` of every rank's ``x`` (all ranks' rows), this rank's rows
    kept; backward: all-gather."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, sizes: list[int]) -> torch.Tensor:
        ctx.group, ctx.sizes = group, sizes
        return _scatter_rows(x, group, sizes)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _gather_rows(grad, ctx.group, ctx.sizes), None, None


def _pad_to(x: torch.Tensor, rows: int) -> torch.Tensor:
    if x.shape[0] == rows:
        return x.contiguous()
    return torch.cat([x, x.new_zeros((rows - x.shape[0], *x.shape[1:]))])


def _gather_rows(x: torch.Tensor, group: Any, sizes: list[int]) -> torch.Tensor:
    """All-gather of a different number of rows per rank: padded to the most, gathered,
    the padding dropped."""
    most = max(sizes)
    out = x.new_empty((most * len(sizes), *x.shape[1:]))
    torch.distributed.all_gather_into_tensor(out, _pad_to(x, most), group=group)
    return torch.cat([out[i * most : i * most + n] for i, n in enumerate(sizes)])


def _scatter_rows(x: torch.Tensor, group: Any, sizes: list[int]) -> torch.Tensor:
    """Reduce-scatter of rows ``sizes[r]`` to rank r: each rank's block padded to the
    most, summed over the group, this rank's rows kept."""
    most = max(sizes)
    blocks = torch.cat([_pad_to(b, most) for b in x.split(sizes)])
    out = x.new_empty((most, *x.shape[1:]))
    torch.distributed.reduce_scatter_tensor(out, blocks, group=group)
    return out[: sizes[torch.distributed.get_rank(group)]]


class HostAllGatherTokenDispatcher(MoEAllGatherTokenDispatcher):
    """Megatron's all-gather token dispatcher with its two collectives on the tokens'
    device, for any number of tokens per rank.

    Megatron's sequence-parallel gather / reduce-scatter allocate their outputs with
    ``torch.cuda.current_device()`` and need the same number of tokens on every rank
    (Megatron pads all sequences to one length); temper's ranks run micro-batches of
    their own lengths. :meth:`token_dispatch` and :meth:`token_combine` here do the
    same exchange (routing map, probabilities and hidden states gathered over the
    TP × EP group; expert outputs reduce-scattered back), each rank's row count
    exchanged first. Routing, permutation and the experts are the parent's.
    """

    _sizes: list[int]

    def token_dispatch(
        self, hidden_states: torch.Tensor, probs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.tp_size > 1 or self.ep_size > 1:
            group = self.tp_ep_group
            mine = torch.tensor([hidden_states.shape[0]], device=hidden_states.device)
            sizes = mine.new_empty(torch.distributed.get_world_size(group))
            torch.distributed.all_gather_into_tensor(sizes, mine, group=group)
            self._sizes = [int(n) for n in sizes.tolist()]
            with torch.no_grad():
                self.routing_map = _gather_rows(self._routing_map(), group, self._sizes)
            probs = _GatherTokens.apply(probs, group, self._sizes)
            hidden_states = _GatherTokens.apply(hidden_states, group, self._sizes)
        return hidden_states, probs

    def _routing_map(self) -> torch.Tensor:
        """This rank's ``(tokens, experts)`` routing map (set by ``dispatch_preprocess``)."""
        routing: torch.Tensor = self.routing_map
        return routing

    def token_combine(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.tp_size > 1 or self.ep_size > 1:
            dtype = hidden_states.dtype
            summed = hidden_states.to(self.local_probs.dtype)
            hidden_states = _ScatterTokens.apply(summed, self.tp_ep_group, self._sizes)
            hidden_states = hidden_states.to(dtype)
        return hidden_states


def use_host_dispatchers(module: nn.Module) -> None:
    """Give every MoE layer of ``module`` a :class:`HostAllGatherTokenDispatcher` (it
    holds no parameters: the parent's is dropped before any forward)."""
    from megatron.core.process_groups_config import ProcessGroupCollection

    groups = ProcessGroupCollection.use_mpu_process_groups()
    for layer in module.modules():
        if isinstance(layer, MoELayer) and isinstance(
            layer.token_dispatcher, MoEAllGatherTokenDispatcher
        ):
            old = layer.token_dispatcher
            layer.token_dispatcher = HostAllGatherTokenDispatcher(
                old.num_local_experts,
                old.local_expert_indices,
                config=old.config,
                pg_collection=groups,
            )
