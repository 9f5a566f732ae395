"""Megatron sequence parallelism (``TransformerConfig.sequence_parallel``) in temper's
engine.

With TP > 1 and sequence parallelism, the activations outside the TP-split linears —
embedding output, norms, residual stream, an MoE router's input — hold ``L / TP``
positions of each sequence on each TP rank instead of all ``L`` on every rank. Megatron's
layers do the communication (the embedding reduce-scatters, a column-parallel linear
all-gathers its input, a row-parallel one reduce-scatters its output, the output layer
gathers the sequence back); temper supplies what lies outside them:

* **Length.** The reduce-scatter splits the sequence evenly: each micro-batch's
  right-aligned ids are padded at the end to ``⌈L / TP⌉ · TP`` (:func:`padded_length`).
  Causal attention keeps the added positions out of every real token's output, and the
  engine reads outputs at real positions only, so no loss, log-prob or value sees them
  (an MoE router's padding mask covers them as it covers the row's own padding).
* **Norms.** On Megatron's local (non-TransformerEngine) layer spec the RMSNorm is
  torch's, which Megatron refuses under sequence parallelism; :class:`SequenceParallelRMSNorm`
  is the same norm with its weight tagged ``sequence_parallel`` as Megatron's own norms
  tag theirs (:func:`with_sequence_parallel_norms` puts it in a spec).
* **Gradients.** A weight applied to a rank's share of the positions (norms, an MoE
  router: tagged ``sequence_parallel``) gets a partial gradient on each TP rank, and so
  does a q/k-norm weight (each rank normalizes its own heads): Megatron's
  ``finalize_model_grads`` sums both over the TP group; :func:`tp_summed_grads` picks
  the same gradients for the engine's own reduction.
* **Value head.** The critic's head replaces Megatron's output layer, so it gathers the
  sequence itself (:func:`gather_sequence`).
* **CPU.** Megatron's sequence-parallel collectives allocate on CUDA; off CUDA the TP
  layers keep their plain tensor-parallel communication (gloo) and the sequence is
  split and gathered around them (:func:`use_host_sequence_parallel`), which computes
  what Megatron's gather / reduce-scatter pairs compute.

An MoE layer under TP needs sequence parallelism (Megatron's MoE layer refuses to train
under TP without it): its router sees this rank's positions, and the token dispatcher
gathers the positions of the ETP × EP group for the experts, each split over ETP (at
ETP = EP = 1 it gathers nothing: each TP rank runs its own positions through whole
experts).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

import torch

from temper.config.schema import MegatronConfig


def uses_sequence_parallel(m: MegatronConfig, *, moe: bool, lora: bool) -> bool:
    """Sequence parallelism runs at TP > 1 when the section asks for it, and always for
    an MoE model (Megatron's MoE layer trains under TP only with it); at TP = 1 there is
    nothing to split (Megatron refuses it there). Not asked for under LoRA on a dense
    model: the adapters read their linear's whole input and add to its whole output
    (megatron_lora), which sequence parallelism splits; memory only, so the option is
    noted as not applied (megatron_check). An MoE model under LoRA runs it with temper's
    host collectives, which give the linears (and their adapters) the whole sequence
    (:func:`host_sequence_parallel`)."""
    return m.tensor_model_parallel_size > 1 and (moe or (m.sequence_parallel and not lora))


def host_sequence_parallel(device_type: str, *, lora: bool) -> bool:
    """Whether sequence parallelism runs with temper's collectives around the TP layers
    (:func:`use_host_sequence_parallel`) rather than Megatron's inside them: off CUDA
    (Megatron's allocate on CUDA), and under LoRA (the adapters read a column-parallel
    linear's input and add to a row-parallel one's output, which Megatron's keep split
    over the sequence)."""
    return device_type != "cuda" or lora


def padded_length(length: int, tp: int) -> int:
    """``⌈length / tp⌉ · tp``: the sequence length a TP group of ``tp`` ranks splits
    evenly."""
    return -(-length // tp) * tp


def pad_sequence(ids: torch.Tensor, tp: int) -> torch.Tensor:
    """``ids (b, L)`` right-padded with token 0 to ``(b, padded_length(L, tp))``; the added
    positions come after every real token, so causal attention hides them."""
    extra = padded_length(ids.shape[1], tp) - ids.shape[1]
    if extra == 0:
        return ids
    return torch.nn.functional.pad(ids, (0, extra), value=0)


class SequenceParallelRMSNorm(torch.nn.RMSNorm):
    """``x / sqrt(mean(x²) + eps) · weight`` (torch's RMSNorm), built as Megatron builds
    a norm (``config``, ``hidden_size``, ``eps``) and with ``weight.sequence_parallel``
    set as Megatron's own norms set it, so that its gradient is summed over TP."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
        super().__init__(hidden_size, eps=eps)
        self.weight.sequence_parallel = bool(config.sequence_parallel)  # type: ignore[attr-defined]


#: the norm fields of Megatron's ``TransformerLayerSubmodules`` / attention submodules
_LAYER_NORMS = ("input_layernorm", "pre_mlp_layernorm")
_QK_NORMS = ("q_layernorm", "k_layernorm")


def _norms_replaced(layer: Any) -> Any:
    """A copy of a layer spec whose norms are :class:`SequenceParallelRMSNorm`."""
    layer = copy.deepcopy(layer)
    sub, attn = layer.submodules, layer.submodules.self_attention.submodules
    for owner, names in ((sub, _LAYER_NORMS), (attn, _QK_NORMS)):
        for name in names:
            if _is_norm(getattr(owner, name)):
                setattr(owner, name, SequenceParallelRMSNorm)
    return layer


def _is_norm(module: Any) -> bool:
    """Whether a spec entry is a norm (not absent, not Megatron's ``IdentityOp``
    placeholder for a layer without one)."""
    from megatron.core.transformer.identity_op import IdentityOp

    return module is not None and module is not IdentityOp


def with_sequence_parallel_norms(spec: Any, config: Any, vp_stage: int | None) -> Any:
    """The decoder block spec of ``spec`` (a layer spec, or a block spec from
    ``get_gpt_decoder_block_spec``) with every norm — per layer, q/k, final — a
    :class:`SequenceParallelRMSNorm` (Megatron's local spec names torch's norm, which it
    refuses under sequence parallelism)."""
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )

    if isinstance(spec, TransformerBlockSubmodules):
        layers = list(spec.layer_specs)
    else:  # one layer spec, repeated over this chunk's layers as Megatron's block does
        layers = [spec] * get_num_layers_to_build(config, vp_stage=vp_stage)
    return TransformerBlockSubmodules(
        layer_specs=[_norms_replaced(layer) for layer in layers],
        layer_norm=SequenceParallelRMSNorm,
    )


def tp_summed_grads(
    named_params: Iterable[tuple[str, torch.nn.Parameter]],
    *,
    sequence_parallel: bool,
    qk_layernorm: bool,
) -> list[torch.Tensor]:
    """The gradients Megatron's ``finalize_model_grads`` sums over the TP group: of
    weights tagged ``sequence_parallel`` (under sequence parallelism each TP rank saw its
    share of the positions: ``∂L/∂w = Σ_r ∂L_r/∂w``) and of q/k norms (each rank
    normalized its own heads with the shared weight)."""
    out = []
    for name, p in named_params:
        if p.grad is None or not p.requires_grad:
            continue
        tagged = sequence_parallel and bool(getattr(p, "sequence_parallel", False))
        qk = qk_layernorm and ("q_layernorm" in name or "k_layernorm" in name)
        if tagged or qk:
            out.append(p.grad)
    return out


class _GatherSequence(torch.autograd.Function):
    """``x (L/TP, …)`` of every rank of ``group`` concatenated to ``(L, …)``; backward:
    this rank's rows of the gradient (which must be whole on every rank: a replicated
    consumer, or one whose own backward all-reduces it)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        size = torch.distributed.get_world_size(group)
        out = x.new_empty((x.shape[0] * size, *x.shape[1:]))
        torch.distributed.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _rows_of_rank(grad, ctx.group), None


class _SplitSequence(torch.autograd.Function):
    """This rank's rows ``(L/TP, …)`` of ``x (L, …)`` (whole on every rank of
    ``group``); backward: every rank's rows of the gradient gathered."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return _rows_of_rank(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _GatherSequence.forward(ctx, grad, ctx.group), None


def _rows_of_rank(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Rows ``[r·L/TP, (r+1)·L/TP)`` of ``x (L, …)`` for rank r of ``group``."""
    size, rank = torch.distributed.get_world_size(group), torch.distributed.get_rank(group)
    return x.chunk(size, dim=0)[rank].contiguous()


def gather_sequence(hidden: torch.Tensor, group: Any) -> torch.Tensor:
    """``hidden (L/TP, b, H)`` of every TP rank, concatenated to ``(L, b, H)``; backward:
    this rank's positions of the gradient (for a replicated consumer such as the value
    head: every rank computes the same loss from the gathered tensor)."""
    out: torch.Tensor = _GatherSequence.apply(hidden, group)
    return out


def split_sequence(x: torch.Tensor, group: Any) -> torch.Tensor:
    """This rank's rows ``(L/TP, …)`` of ``x (L, …)``, whole on every rank of ``group``;
    backward: every rank's rows of the gradient gathered (Megatron's
    ``scatter_to_sequence_parallel_region``, on any device)."""
    out: torch.Tensor = _SplitSequence.apply(x, group)
    return out


def stage_padding_mask(padding: torch.Tensor, module: Any, group: Any) -> torch.Tensor:
    """An MoE router's padding mask ``(b, L)`` for the model chunk ``module``: Megatron's
    ``GPTModel`` splits it to this TP rank's positions ``(b, L/TP)`` under sequence
    parallelism only where it embeds the tokens (the first pipeline stage); a later
    stage's chunk gets the same split here."""
    if module.pre_process or not module.config.sequence_parallel:
        return padding
    return _rows_of_rank(padding.transpose(0, 1), group).transpose(0, 1).contiguous()


def use_host_sequence_parallel(module: torch.nn.Module, group: Any) -> None:
    """Run ``module``'s sequence parallelism with collectives on the tensors' device.

    Megatron's sequence-parallel gather and reduce-scatter (in its mappings and its
    linear layers' autograd) allocate their outputs with ``torch.cuda.current_device()``,
    so on CPU each TP layer is switched to its plain tensor-parallel communication,
    which runs on gloo, and the sequence is split and gathered around it:

    * column-parallel linear (its backward all-reduces the input gradient): input
      gathered first, gradient split back — together Megatron's all-gather /
      reduce-scatter pair;
    * row-parallel linear (it all-reduces its output): output split after —
      all-reduce + split is Megatron's reduce-scatter, backward an all-gather;
    * embedding (it all-reduces the vocabulary shards' lookups): output split after.

    Expert linears (``explicit_expert_comm``: their dispatcher communicates) are left
    as they are; an expert linear on an expert TP group of one rank without EP (ETP = 1
    under TP > 1) is not ``explicit_expert_comm`` for Megatron, and its sequence-parallel
    gather / reduce-scatter over that one rank are identities: it is switched off."""
    from megatron.core.models.common.embeddings.language_model_embedding import (
        LanguageModelEmbedding,
    )
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    def gather_input(_: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (_GatherSequence.apply(args[0], group), *args[1:])

    def split_output(_: torch.nn.Module, __: Any, output: Any) -> Any:
        if isinstance(output, tuple):  # a linear's (output, bias)
            return (_SplitSequence.apply(output[0], group), *output[1:])
        return _SplitSequence.apply(output, group)

    for sub in module.modules():
        if isinstance(sub, ColumnParallelLinear | RowParallelLinear):
            if sub.explicit_expert_comm or not sub.sequence_parallel:
                continue
            if sub.is_expert:  # a group of one rank: the dispatcher has placed the tokens
                sub.sequence_parallel = False
                continue
            sub.sequence_parallel = False
            if isinstance(sub, ColumnParallelLinear):
                sub.register_forward_pre_hook(gather_input)
            else:
                sub.register_forward_hook(split_output)
        elif isinstance(sub, LanguageModelEmbedding) and sub.config.sequence_parallel:
            sub.reduce_scatter_embeddings = False
            sub.word_embeddings.reduce_scatter_embeddings = False
            sub.scatter_to_sequence_parallel = False
            sub.register_forward_hook(split_output)
