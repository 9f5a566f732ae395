"""Export of a megatron engine's parameters under Hugging Face names, for weight sync and
HF directories (:class:`megatron_io.MegatronCheckpointer` writes them).

Each parameter is fetched from a rank holding this rank's shard of it — broadcast within
its *holders* group (:meth:`Parallel.holders`: the pipeline's stages, and for an
expert's weight under expert parallelism the EP ranks of each stage) — then its shards
are all-gathered over the group it is split over (TP, or an expert's ETP group) and
turned back into HF tensors one at a time, in the model's layer order
(:func:`megatron_convert.hf_tensors`), so no rank holds the whole model twice. Dense and
expert weights have holders groups of their own: with an expert TP size other than TP
(ETP = 1 under TP = 2), the ranks holding other experts hold other TP shards of the
dense weights. Every public method is a collective over the engine's ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from temper.training.megatron_convert import ParamMap, hf_tensors
from temper.training.megatron_lora import LoraAdapters, to_peft
from temper.training.megatron_model import MegatronModel
from temper.training.megatron_moe import is_expert_param
from temper.training.megatron_parallel import Parallel

#: a parameter's holder (rank in its holders group), map, local shape and dtype
Owner = tuple[int, ParamMap, tuple[int, ...], torch.dtype]


def _model_order(pm: ParamMap) -> tuple[int, int]:
    """Where ``pm`` sits in the whole model: embedding, layers, then the rest (a
    stable sort keeps each layer's parameters in their order)."""
    if pm.layer is not None:
        return (1, pm.layer)
    return (0, 0) if pm.hf == ("embed_tokens.weight",) else (2, 0)


@dataclass(frozen=True)
class MegatronExport:
    """HF-name export of one megatron engine's parameters (see module doc).

    Attributes:
        model: this rank's GPTModel (its TP / ETP shard of every parameter it holds).
        built: the model's HF layout and Megatron ↔ HF parameter maps.
        parallel: the groups this rank belongs to.
        device: this rank's device.
        adapters: LoRA adapters, exported merged into their base weights and alone.
        value: a value model (backbone + value head: no ``model.`` prefix).
    """

    model: nn.Module
    built: MegatronModel
    parallel: Parallel
    device: torch.device
    adapters: LoraAdapters | None
    value: bool

    def _gather_tp(self) -> Callable[[ParamMap, torch.Tensor], list[torch.Tensor]]:
        p = self.parallel

        def gather(pm: ParamMap, local: torch.Tensor) -> list[torch.Tensor]:
            group, size = p.shard_group(is_expert_param(pm.megatron))
            if size == 1:
                return [local.detach()]
            t = local.detach().contiguous()
            shards = [torch.empty_like(t) for _ in range(size)]
            dist.all_gather(shards, t, group=group)
            return shards

        return gather

    @cached_property
    def _owners(self) -> list[Owner]:
        """Every exported parameter of the whole model in order, with the rank of its
        holders group (:meth:`Parallel.holders`: the pipeline's stages, and for an
        expert's weight under EP the EP ranks of each stage) holding it and its local (TP
        or ETP shard) shape and dtype; one object all-gather per group the first time
        (stages and EP ranks build only their own maps). A parameter held by several of
        them is taken from the first."""
        return self._owners_of(self.built.maps)

    @cached_property
    def _adapter_owners(self) -> list[Owner]:
        """:attr:`_owners` of the LoRA adapter tensors."""
        return self._owners_of(self.adapters.maps() if self.adapters is not None else [])

    def _owners_of(self, maps: list[ParamMap]) -> list[Owner]:
        params = dict(self.model.named_parameters())
        out: list[Owner] = []
        for expert in (False, True):
            mine = [
                (pm, tuple(params[pm.megatron].shape), params[pm.megatron].dtype)
                for pm in maps
                if not pm.tied_copy and is_expert_param(pm.megatron) == expert
            ]
            group, size = self.parallel.holders(expert)
            if size == 1:
                out += [(0, pm, shape, dtype) for pm, shape, dtype in mine]
                continue
            held: list[Any] = [None] * size
            dist.all_gather_object(held, mine, group=group)
            seen = set()
            for s, rows in enumerate(held):
                for pm, shape, dtype in rows:
                    if pm.global_name not in seen:
                        seen.add(pm.global_name)
                        out.append((s, pm, shape, dtype))
        # the model's order (embedding, layers by global index, final norm and head):
        # interleaved stages hold layers out of order, ranks in rank order would mix them
        return sorted(out, key=lambda row: _model_order(row[1]))

    def _fetch(
        self, owners: list[Owner], *, merge: bool = True
    ) -> Callable[[ParamMap], torch.Tensor]:
        """This TP (ETP) rank's shard of a parameter, broadcast from the rank of its
        holders group that holds it (the rank's own tensor when it holds them all);
        with ``merge``, a LoRA base weight with its adapters' ``ΔW`` added."""
        params = dict(self.model.named_parameters())
        where = {pm.global_name: (s, shape, dtype) for s, pm, shape, dtype in owners}
        comm = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        mine = {pm.global_name: pm.megatron for _, pm, _, _ in owners}
        mine.update({pm.global_name: pm.megatron for pm in self.built.maps})
        if self.adapters is not None:
            mine.update({pm.global_name: pm.megatron for pm in self.adapters.maps()})
        adapters = self.adapters if merge else None

        def local(name: str) -> torch.Tensor:
            t = params[name].detach()
            return adapters.merged(name, t) if adapters is not None else t

        def fetch(pm: ParamMap) -> torch.Tensor:
            owner, shape, dtype = where[pm.global_name]
            group, size = self.parallel.holders(is_expert_param(pm.megatron))
            if size == 1:
                return local(pm.megatron)
            if owner == dist.get_rank(group):
                t = local(mine[pm.global_name]).to(comm).contiguous()
            else:
                t = torch.empty(shape, dtype=dtype, device=comm)
            dist.broadcast(t, group=group, group_src=owner)
            return t.to(self.device)

        return fetch

    def hf_named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(hf_name, full tensor)`` of the causal LM (or value model backbone + head),
        on every rank: each parameter is broadcast from its pipeline stage, then its TP
        shards are gathered."""
        built = self.built
        value = self.value
        yield from hf_tensors(
            [pm for _, pm, _, _ in self._owners],
            built.layout,
            self._gather_tp(),
            self._fetch(self._owners),
            prefix="" if value else ("model.language_model." if built.layout.vision else "model."),
            tied_head=built.layout.tied_embeddings and not value,
        )

    def peft_named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(peft name, full tensor)`` of each LoRA adapter tensor, on every rank (the
        keys of peft's ``adapter_model.safetensors``); copies, not views of the live
        parameters (they are small)."""
        gather = self._gather_tp()
        fetch = self._fetch(self._adapter_owners, merge=False)
        for _, pm, _, _ in self._adapter_owners:
            shard = fetch(pm)
            shards = gather(pm, shard) if pm.kind != "rep" else [shard]
            yield pm.hf[0], to_peft(pm.kind, shards).clone()
