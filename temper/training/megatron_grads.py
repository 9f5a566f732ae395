"""The megatron engine's gradients after a mini-batch's backwards: summed over the
groups that hold partial gradients of one weight, then clipped by the global norm.

Both follow Megatron-Core's ``finalize_model_grads`` and its grad-norm, on temper's own
groups (:class:`~temper.training.megatron_parallel.Parallel`), so that one update equals
the torch engine's at any TP × PP × CP × DP (× EP) layout.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from temper.training.megatron_lora import etp_summed_grads
from temper.training.megatron_moe import is_expert_param
from temper.training.megatron_parallel import Parallel, all_reduce_flat
from temper.training.megatron_pipeline import StageLink, sync_tied_grads
from temper.training.megatron_sp import tp_summed_grads


def reduce_grads(
    model: nn.Module,
    p: Parallel,
    *,
    link: StageLink,
    tied: nn.Parameter | None,
    sequence_parallel: bool,
    qk_norm: bool,
    lora: bool,
) -> None:
    """Sum the partial gradients of TP-replicated weights over the TP group (norms under
    sequence parallelism, q/k norms, an MoE router: :func:`megatron_sp.tp_summed_grads`),
    then every gradient over the DP × CP group (:func:`reduce_dp_grads`), then a tied
    embedding's over its first- and last-stage copies. With ``lora``, an expert's LoRA
    tensors kept whole on its ETP ranks are summed over them first
    (:func:`megatron_lora.etp_summed_grads`)."""
    if lora and p.etp > 1:
        all_reduce_flat(etp_summed_grads(model.named_parameters()), p.etp_group, p.etp)
    if p.tp > 1:
        grads = tp_summed_grads(
            model.named_parameters(), sequence_parallel=sequence_parallel, qk_layernorm=qk_norm
        )
        all_reduce_flat(grads, p.tp_group, p.tp)
    reduce_dp_grads(model, p)
    sync_tied_grads(link, tied)


def reduce_dp_grads(model: nn.Module, p: Parallel) -> None:
    """Sum gradients over the DP × CP group, in flat buckets (one all-reduce per dtype);
    an MoE model's expert weights, if laid out otherwise, over the expert-data-parallel
    group (the ranks holding the same expert shard; at ETP = 1 the TP ranks too)."""
    dense: list[torch.Tensor] = []
    experts: list[torch.Tensor] = []
    for name, param in model.named_parameters():
        if param.grad is None or not param.requires_grad:
            continue
        (experts if p.expert_split and is_expert_param(name) else dense).append(param.grad)
    # CP ranks hold the same weights and other positions of the same samples: their
    # partial gradients are summed with DP's (Megatron's with_context_parallel group)
    all_reduce_flat(dense, p.dp_cp_group, p.dp * p.cp)
    all_reduce_flat(experts, p.expert_dp_group, p.expert_dp)


def clip_grad_norm(
    model: nn.Module,
    params: list[nn.Parameter],
    clip: float,
    p: Parallel,
    *,
    tied_copy: nn.Parameter | None,
    device: torch.device,
    comm_device: torch.device,
) -> float:
    """The global L2 norm of ``params``' gradients over the model-parallel shards — each
    TP duplicate counted once, an expert's ETP duplicates once when experts are laid out
    otherwise, and ``tied_copy`` (the last stage's copy of a tied embedding) not at all —
    then ``torch.nn.utils.clip_grad_norm_``'s scaling: ``g × min(1, clip/(norm+1e-6))``.
    Returns the norm before clipping."""
    from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate

    grads = [q.grad for q in params if q.grad is not None]
    experts = {id(q.grad) for n, q in model.named_parameters() if is_expert_param(n)}
    split = p.expert_split

    def once(q: nn.Parameter) -> bool:
        # an expert's tensor: each ETP shard once, a tensor whole on its ETP ranks
        # (an expert's LoRA A or B) on ETP rank 0 (its TP rank may be another)
        if split and id(q.grad) in experts:
            return bool(getattr(q, "tensor_model_parallel", False)) or p.etp_rank == 0
        return param_is_not_tensor_parallel_duplicate(q)

    counted = [q.grad for q in params if q.grad is not None and once(q) and q is not tied_copy]
    sq = torch.zeros((), dtype=torch.float64, device=device)
    sq_experts = torch.zeros((), dtype=torch.float64, device=device)
    for g in counted:
        if split and id(g) in experts:
            sq_experts += g.detach().double().pow(2).sum()
        else:
            sq += g.detach().double().pow(2).sum()
    if p.tp > 1 or p.pp > 1:
        sq = sq.to(comm_device)
        dist.all_reduce(sq, group=p.model_parallel_group)
    if split:  # each shard of each expert once: squares summed over ETP × EP × PP
        sq_experts = sq_experts.to(comm_device)
        dist.all_reduce(sq_experts, group=p.expert_model_group)
        sq = sq.to(comm_device) + sq_experts
    norm = float(sq.sqrt())
    coef = clip / (norm + 1e-6)
    if coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return norm
