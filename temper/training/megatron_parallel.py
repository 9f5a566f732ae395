"""Megatron-Core's parallel state for the ranks of one role.

A role's ranks are one ``torch.distributed`` world (the Ray worker group joins them;
tests use ``spawn_ranks``). ``initialize_model_parallel`` cuts that world into tensor-
(TP), pipeline- (PP) and context-parallel (CP) groups, Megatron's default order
``tp-cp-ep-dp-pp``: consecutive ranks form a TP group, the ranks holding the same TP
shard in different TP groups of one stage form a data-parallel (DP) group, and the
stages of one pipeline are ``TP × CP × DP`` ranks apart. The TP groups of one pipeline
compute on the same samples; DP ranks on different ones. The CP ranks of one DP rank
(``TP`` ranks apart) hold the same weights and the same samples, each a share of every
sequence (:mod:`megatron_cp`); their gradients are summed with DP's, over the DP × CP
group. With virtual (interleaved)
pipeline stages each rank of a pipeline holds several model chunks; the groups are the
same (Megatron records only the virtual size). Expert parallelism (EP) lies
inside data parallelism: consecutive DP ranks form an EP group, which splits each MoE
layer's experts and exchanges tokens (every rank keeps its own samples); ranks holding
the same experts form the expert-data-parallel group.

The experts have a tensor-parallel size of their own (ETP, ``expert_tensor_parallel_size``;
TP by default). Megatron cuts each stage's ranks a second time for them, in the order
``tp-ep-dp``: consecutive ranks form an ETP group, consecutive ETP groups an EP group,
and the ranks holding the same expert shard the expert-data-parallel (EDP) group, of
``stage ranks / (ETP × EP)`` ranks. At ETP = 1 under TP = 2 (the common layout) each
rank holds whole experts: at EP = 2 each TP pair is an EP group (half the experts on
each rank), at EP = 1 it holds two copies of every expert. The token dispatcher
exchanges tokens over the ETP × EP group — nothing at ETP = EP = 1: each rank runs its
own share of the positions (sequence parallelism) through its whole experts.

On the local backend a role runs in the driver process, which has no process group: a
one-rank world (gloo on CPU, nccl on GPU) is created for it, so the same Megatron code
runs with TP = DP = 1. Several roles in one process (actor, reference, critic) share the
parallel state, which must then agree.

RNG: on CUDA ``model_parallel_cuda_manual_seed`` seeds Megatron's tracker (dropout in
TP regions). It calls ``torch.cuda.get_rng_state``, so on CPU the inference tracker is
used instead (``initialize_rng_tracker(inference_rng_tracker=True)``): its ``fork()`` is
a no-op and dropout draws from torch's default RNG — identical masks on every TP rank,
which only matters at a non-zero dropout (HF Llama/Qwen checkpoints have none).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from temper.config.errors import ConfigError
from temper.config.schema import MegatronConfig
from temper.training.local_world import ensure_local_world


@dataclass(frozen=True)
class Parallel:
    """This rank's place in the role's world."""

    rank: int
    world: int
    tp: int
    tp_rank: int
    dp: int
    dp_rank: int
    tp_group: Any
    dp_group: Any
    model_parallel_group: Any  # TP × PP: where a gradient norm is summed
    pp: int = 1
    pp_rank: int = 0
    pp_group: Any = None
    prev_rank: int = 0  # global ranks of the neighbouring pipeline stages
    next_rank: int = 0
    embedding_group: Any = None  # first and last stage of a pipeline (a tied copy's grads)
    ep: int = 1  # expert parallelism: the experts of an MoE layer split over EP ranks
    ep_rank: int = 0
    expert_dp: int = 1  # ranks holding the same experts: their gradients are summed there
    expert_dp_group: Any = None
    # EP × PP ranks of one model copy (every expert and stage once): export gathers there
    expert_model_group: Any = None
    # the EP × PP ranks of one ETP rank (every stage and expert once, this ETP shard):
    # where the export fetches an expert's weight; expert_model_group at ETP = 1
    expert_holders_group: Any = None
    etp: int = 1  # expert tensor parallelism: each expert split over ETP ranks
    etp_rank: int = 0
    etp_group: Any = None
    vp: int = 1  # model chunks per rank (virtual pipeline stages, megatron_chunks)
    # the pipeline's ranks again, for the transfers from the last rank back to the first
    # between chunks (megatron_pipeline: a channel of their own, apart from the others)
    wrap_group: Any = None
    cp: int = 1  # context parallelism: each sequence split over CP ranks (megatron_cp)
    cp_rank: int = 0
    cp_group: Any = None
    # DP × CP: the ranks holding the same weights, whose gradients are summed (CP ranks
    # see other tokens of the same samples); the DP group when CP = 1
    dp_cp_group: Any = None

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    @property
    def expert_split(self) -> bool:
        """The experts are laid out otherwise than the dense weights: split over EP ranks
        or over an ETP other than TP. Their gradients are then summed over the EDP group and
        their norm over the ETP × EP × PP group (Megatron's ``finalize_model_grads`` and
        ``get_grad_norm``), not over DP and TP × PP."""
        return self.ep > 1 or self.etp != self.tp

    def shard_group(self, expert: bool) -> tuple[Any, int]:
        """The group over which a parameter is split, and its size: the ETP group for an
        expert's weight, the TP group otherwise."""
        return (self.etp_group, self.etp) if expert else (self.tp_group, self.tp)

    def holders(self, expert: bool) -> tuple[Any, int]:
        """The group whose ranks together hold one copy of this rank's TP (ETP) shard of
        every dense (expert) parameter, and its size: the pipeline's stages, and for an
        expert's weight under EP the EP ranks of each stage; ``(None, 1)`` when this rank
        holds them all."""
        if expert and self.ep > 1:
            return self.expert_holders_group, self.ep * self.pp
        return (self.pp_group, self.pp) if self.pp > 1 else (None, 1)

    def first_chunk(self, chunk: int) -> bool:
        """``chunk`` of this rank is the pipeline's first (it embeds the tokens)."""
        return self.first_stage and chunk == 0

    def last_chunk(self, chunk: int) -> bool:
        """``chunk`` of this rank is the pipeline's last (its output layer makes logits)."""
        return self.last_stage and chunk == self.vp - 1


def megatron_degrees(m: MegatronConfig) -> dict[str, int | None]:
    """The section's degrees as Megatron-Core takes them: one virtual stage is no
    interleaving (Megatron wants ``None`` then; it refuses 1 without pipeline stages)."""
    degrees = m.degrees()
    if (degrees.get("virtual_pipeline_model_parallel_size") or 1) <= 1:
        degrees["virtual_pipeline_model_parallel_size"] = None
    return degrees


def ensure_process_group(device: torch.device) -> None:
    """A one-rank world and its launcher variables for an engine in a process without
    one (the local backend; :mod:`temper.training.local_world`)."""
    ensure_local_world(device)


# What Megatron-Core says when it is imported without Apex / TransformerEngine: true, and
# expected here (the local spec is used on purpose); said once per module, per process
_FALLBACK_WARNINGS = (
    r"Apex is not installed",
    r"Transformer Engine and Apex are not installed",
)


@contextlib.contextmanager
def quiet_fallback_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        for message in _FALLBACK_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=UserWarning)
        yield


def import_megatron() -> None:
    """Import the Megatron-Core modules the engine uses, without the fallback warnings."""
    with quiet_fallback_warnings():
        import megatron.core.models.gpt.gpt_layer_specs
        import megatron.core.models.gpt.gpt_model
        import megatron.core.tensor_parallel  # noqa: F401


def init_parallel(m: MegatronConfig, *, role: str, device: torch.device, seed: int) -> Parallel:
    """Initialize (or join the already initialized) Megatron parallel state."""
    import_megatron()
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    if device.type != "cuda":
        # Megatron's TP linear layers recommend CUDA_DEVICE_MAX_CONNECTIONS=1 (a CUDA
        # stream setting) at every forward; meaningless on CPU
        warnings.filterwarnings(
            "ignore", message=r"When using async grad allreduce", category=UserWarning
        )
    ensure_process_group(device)
    world = dist.get_world_size()
    split = m.model_parallel_size
    if world % split:
        raise ConfigError(
            f"{role}.megatron",
            f"the {world} ranks of {role} are not divisible by TP×PP×CP = {split}",
            "choose parallel sizes whose product divides the role's device count",
        )
    degrees = megatron_degrees(m)
    wanted = (
        m.tensor_model_parallel_size,
        m.pipeline_model_parallel_size,
        m.context_parallel_size,
        m.expert_model_parallel_size,
        degrees["virtual_pipeline_model_parallel_size"],
        m.expert_tensor_parallel_size or m.tensor_model_parallel_size,
    )
    if ps.model_parallel_is_initialized():
        have = (
            ps.get_tensor_model_parallel_world_size(),
            ps.get_pipeline_model_parallel_world_size(),
            ps.get_context_parallel_world_size(),
            ps.get_expert_model_parallel_world_size(),
            ps.get_virtual_pipeline_model_parallel_world_size(),
            ps.get_expert_tensor_parallel_world_size(),
        )
        if have != wanted:
            raise ConfigError(
                f"{role}.megatron",
                f"this process already runs Megatron roles with (TP, PP, CP, EP, VPP, ETP) = {have}, "
                f"not {wanted}",
                "give colocated megatron roles in one process the same parallel sizes",
            )
    else:
        ps.initialize_model_parallel(
            **degrees,
            # gloo copies of every group are only needed for CPU-side collectives of
            # Megatron's own optimizer/checkpointing on GPU; on a gloo world they would
            # be the same groups twice
            create_gloo_process_groups=device.type == "cuda",
        )
        if device.type == "cuda":
            tensor_parallel.model_parallel_cuda_manual_seed(seed)
        else:
            tensor_parallel.random.initialize_rng_tracker(inference_rng_tracker=True)
    pp = ps.get_pipeline_model_parallel_world_size()
    ep = ps.get_expert_model_parallel_world_size()
    vp = ps.get_virtual_pipeline_model_parallel_world_size() or 1
    tp = ps.get_tensor_model_parallel_world_size()
    etp = ps.get_expert_tensor_parallel_world_size()
    cp = ps.get_context_parallel_world_size()
    split = ep > 1 or etp != tp
    expert_model = ps.get_expert_tensor_model_pipeline_parallel_group() if split else None
    holders = expert_model if etp == 1 or ep == 1 else _same_etp_rank_group(expert_model, ps)
    return Parallel(
        rank=dist.get_rank(),
        world=world,
        tp=tp,
        tp_rank=ps.get_tensor_model_parallel_rank(),
        dp=ps.get_data_parallel_world_size(),
        dp_rank=ps.get_data_parallel_rank(),
        tp_group=ps.get_tensor_model_parallel_group(),
        dp_group=ps.get_data_parallel_group(),
        model_parallel_group=ps.get_model_parallel_group(),
        pp=pp,
        pp_rank=ps.get_pipeline_model_parallel_rank(),
        pp_group=ps.get_pipeline_model_parallel_group() if pp > 1 else None,
        prev_rank=ps.get_pipeline_model_parallel_prev_rank() if pp > 1 else 0,
        next_rank=ps.get_pipeline_model_parallel_next_rank() if pp > 1 else 0,
        embedding_group=ps.get_embedding_group(check_initialized=False) if pp > 1 else None,
        ep=ep,
        ep_rank=ps.get_expert_model_parallel_rank(),
        expert_dp=ps.get_expert_data_parallel_world_size(),
        expert_dp_group=ps.get_expert_data_parallel_group(),
        expert_model_group=expert_model,
        expert_holders_group=holders,
        etp=etp,
        etp_rank=ps.get_expert_tensor_parallel_rank(),
        etp_group=ps.get_expert_tensor_parallel_group(),
        vp=vp,
        wrap_group=_wrap_group(ps.get_pipeline_model_parallel_group()) if vp > 1 else None,
        cp=cp,
        cp_rank=ps.get_context_parallel_rank(),
        cp_group=ps.get_context_parallel_group() if cp > 1 else None,
        dp_cp_group=ps.get_data_parallel_group(with_context_parallel=True),
    )


_WRAP_GROUPS: dict[tuple[int, ...], Any] = {}
_HOLDER_GROUPS: dict[tuple[int, ...], Any] = {}


def _same_etp_rank_group(expert_model: Any, ps: Any) -> Any:
    """The ranks of ``expert_model`` (the ETP × EP × PP group) with this rank's ETP rank
    (the EP × PP ranks holding this ETP shard of every expert), as a group of its own,
    made once per process (``new_group`` is a collective over the world)."""
    world = dist.get_world_size()
    members = tuple(dist.get_process_group_ranks(expert_model))
    mine = (dist.get_rank(), ps.get_expert_tensor_parallel_rank(), members)
    every: list[Any] = [None] * world
    dist.all_gather_object(every, mine)
    etp_rank = {r: t for r, t, _ in every}
    sets = sorted({tuple(m for m in ms if etp_rank[m] == t) for _, t, ms in every})
    for ranks in sets:
        if ranks not in _HOLDER_GROUPS:
            _HOLDER_GROUPS[ranks] = dist.new_group(list(ranks))
    return _HOLDER_GROUPS[tuple(m for m in members if etp_rank[m] == mine[1])]


def _wrap_group(pp_group: Any) -> Any:
    """A second group over this rank's pipeline, made once per process: every rank
    creates one for every pipeline of the world, in the same order (``new_group`` is a
    collective over the world)."""
    mine = tuple(dist.get_process_group_ranks(pp_group))
    if mine not in _WRAP_GROUPS:
        pipelines: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(pipelines, mine)
        for ranks in sorted(set(pipelines)):
            group = dist.new_group(list(ranks))
            if ranks == mine:
                _WRAP_GROUPS[mine] = group
    return _WRAP_GROUPS[mine]


def all_reduce_flat(grads: list[torch.Tensor], group: Any, size: int) -> None:
    """Sum ``grads`` over ``group`` in flat buckets, one all-reduce per dtype."""
    if size == 1 or not grads:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for same in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in same])
        dist.all_reduce(flat, group=group)
        offset = 0
        for g in same:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
