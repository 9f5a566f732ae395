"""Router replay on the megatron engine, through Megatron-Core's own ``RouterReplay``.

Megatron-Core 0.16's ``TopKRouter`` routes through ``router.router_replay`` when it has
one (``moe_enable_routing_replay`` builds it): with the action ``RECORD`` it keeps the
top-k indices it computed, with ``REPLAY_FORWARD`` it takes given indices and gathers its
scores at them — the logits when the top-k logits are softmaxed afterwards
(``moe_router_pre_softmax=False``: Qwen3-MoE, Mixtral), the full softmax otherwise
(Qwen2-MoE) — which are the gates :mod:`temper.training.router_replay` states.

:class:`MaskedRouterReplay` adds what temper's routing holds and Megatron's does not:
``-1`` for a token the record does not cover (padding, a trimmed column), routed by the
router's own top-k. :class:`MegatronRouterReplay` gives every router of a model one and
is the engine's :class:`~temper.training.router_replay.RoutingHooks`. Tokens are in the
routers' order — Megatron's sequence-first ``(S, b)`` flattened; under context
parallelism each CP rank routes its share of the positions (:func:`held_order`), under
sequence parallelism each TP rank routes ``1 / TP`` of those, so a record is gathered
over TP and CP and a replay cut to the rank's share. Under pipeline parallelism each
stage routes its own layers: the stages' records are gathered over the pipeline into the
whole ``(N, L, k)`` after a forward, and each stage replays its layers' columns. The
layout of ``(S, b)`` against the batch's columns is the engine's (:func:`model_tokens`,
:func:`token_columns`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.moe.router_replay import RouterReplay, RouterReplayAction
from torch import nn

from temper.training.megatron_cp import gathered_order, held_positions
from temper.training.megatron_parallel import Parallel
from temper.training.micro_batching import ModelInputs

TopK = Callable[..., tuple[torch.Tensor, torch.Tensor]]


class MaskedRouterReplay(RouterReplay):
    """One router's replay state; a replayed index of ``-1`` keeps the router's own.

    Megatron-Core lists every instance in a class-level registry for its global
    setters; temper drives each model's instances itself, so an instance leaves that
    list (a rebuilt model would otherwise keep the old routers' targets alive there)."""

    def __init__(self) -> None:
        super().__init__()
        RouterReplay.global_router_replay_instances.remove(self)

    def get_replay_topk(
        self,
        scores: torch.Tensor,
        topk: int,
        num_groups: int | None = None,
        group_topk: int | None = None,
        default_compute_topk: TopK | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Megatron's record; a replay at the target indices, ``-1`` filled in by the
        router's own top-k; else the router's own."""
        assert default_compute_topk is not None
        replaying = self.router_replay_action in (
            RouterReplayAction.REPLAY_FORWARD,
            RouterReplayAction.REPLAY_BACKWARD,
        )
        if not replaying or self.target_topk_idx is None:
            return super().get_replay_topk(
                scores, topk, num_groups, group_topk, default_compute_topk
            )
        target = self.target_topk_idx.to(scores.device, torch.long)
        if bool((target < 0).any()):
            _, own = default_compute_topk(
                scores, topk, num_groups=num_groups, group_topk=group_topk
            )
            target = torch.where(target >= 0, target, own)
        return scores.gather(1, target), target


class MegatronRouterReplay:
    """Record / replay the routing of every ``TopKRouter`` of a model's chunks.

    Each rank holds the routers of its pipeline stage (its virtual stages' chunks): the
    model's MoE layers are numbered in model order over the whole pipeline (Megatron's
    global ``layer_number``), and this rank's routers are columns :attr:`layers` of the
    ``(N, L, k)`` routing. Tokens are in the routers' order over the ranks that split a
    sequence: CP rank by CP rank (each its share of the positions, see the engine's
    layout), within one TP rank by TP rank under sequence parallelism — so a record is
    gathered over TP, then CP, and a replay cut to the CP, then the TP share.

    Attributes:
        num_layers: the model's MoE layers, ``L`` (every pipeline stage's).
        top_k: experts per token, ``k``.
        num_experts: experts per layer, ``E``.
        layers: the column in ``L`` of each router this rank holds, chunk by chunk.
    """

    def __init__(
        self,
        chunks: list[nn.Module],
        parallel: Parallel,
        sequence_parallel: bool,
        comm: torch.device,
    ) -> None:
        self._by_chunk: list[list[MaskedRouterReplay]] = []
        numbers: list[int] = []
        shape: tuple[int, int] | None = None
        for chunk in chunks:
            mine: list[MaskedRouterReplay] = []
            for module in chunk.modules():
                if isinstance(module, TopKRouter):
                    module.router_replay = MaskedRouterReplay()
                    mine.append(module.router_replay)
                    numbers.append(int(module.layer_number))
                    shape = (int(module.topk), int(module.config.num_moe_experts))
            self._by_chunk.append(mine)
        self._routers = [r for mine in self._by_chunk for r in mine]
        stages: list[Any] = [(numbers, shape)]
        if parallel.pp > 1:  # a stage may hold no MoE layer (a dense first layer)
            stages = [None] * parallel.pp
            dist.all_gather_object(stages, (numbers, shape), group=parallel.pp_group)
        everywhere = sorted(n for nums, _ in stages for n in nums)
        shapes = [s for _, s in stages if s is not None]
        if not shapes:
            raise ValueError("the model has no MoE router (router replay needs an MoE model)")
        self.num_layers = len(everywhere)
        self.top_k, self.num_experts = shapes[0]
        self.layers = [everywhere.index(n) for n in numbers]
        self._stage_layers = [[everywhere.index(n) for n in nums] for nums, _ in stages]
        self._p = parallel
        self._comm = comm
        self._tp = parallel.tp if sequence_parallel else 1

    def _set(self, action: RouterReplayAction | None) -> None:
        for r in self._routers:
            if action is None:
                r.clear_router_replay_action()
            else:
                r.set_router_replay_action(action)

    def _gather(self, local: torch.Tensor, group: Any, size: int) -> torch.Tensor:
        """Every rank of ``group``'s tokens in rank order."""
        if size == 1:
            return local
        parts = [torch.empty_like(local) for _ in range(size)]
        dist.all_gather(parts, local.contiguous(), group=group)
        return torch.cat(parts)

    @contextlib.contextmanager
    def recording_chunk(self, chunk: int) -> Iterator[list[torch.Tensor]]:
        """Record model chunk ``chunk``'s forward inside: the list then holds its
        routers' routing ``(N, L_chunk, k)``, gathered over TP (sequence parallel) and CP
        (the chunk's forward runs on every rank of both groups at once)."""
        routers = self._by_chunk[chunk]
        result: list[torch.Tensor] = []
        for r in routers:
            r.clear_indices()
            r.set_router_replay_action(RouterReplayAction.RECORD)
        try:
            yield result
        finally:
            for r in routers:
                r.clear_router_replay_action()
        recorded = [r.get_recorded_indices() for r in routers]
        missing = [self.layers[i] for i, t in enumerate(recorded) if t is None]
        if missing:
            raise RuntimeError(f"router replay: MoE layers {missing} did not run")
        for r in routers:
            r.clear_indices()
        if not routers:
            result.append(torch.empty((0, 0, self.top_k), dtype=torch.long))
            return
        local = torch.stack([t for t in recorded if t is not None], dim=1)
        local = self._gather(local, self._p.tp_group, self._tp)
        result.append(self._gather(local, self._p.cp_group, self._p.cp))

    def whole(self, chunks: list[torch.Tensor]) -> torch.Tensor:
        """This rank's chunks' records of one forward (:meth:`recording_chunk`, in chunk
        order) as the model's ``(N, L, k)``: the stages' layers gathered over the
        pipeline (a collective of the pipeline group)."""
        held = [c for c in chunks if c.shape[1] > 0]
        n = held[0].shape[0] if held else 0
        if self._p.pp == 1:
            return torch.cat(held, dim=1)
        widest = max(len(s) for s in self._stage_layers)
        # a stage holding no MoE layer routed nothing: it learns the token count here
        count = torch.tensor([n], dtype=torch.long, device=self._comm)
        sizes = [torch.empty_like(count) for _ in range(self._p.pp)]
        dist.all_gather(sizes, count, group=self._p.pp_group)
        n = max(int(s) for s in sizes)
        mine = torch.full((n, widest, self.top_k), -1, dtype=torch.long, device=self._comm)
        if held:
            local = torch.cat(held, dim=1)
            mine[:, : local.shape[1]] = local.to(self._comm)
        parts = [torch.empty_like(mine) for _ in range(self._p.pp)]
        dist.all_gather(parts, mine, group=self._p.pp_group)
        out = mine.new_full((n, self.num_layers, self.top_k), -1)
        for part, columns in zip(parts, self._stage_layers):
            out[:, columns] = part[:, : len(columns)]
        device = held[0].device if held else self._comm
        return out.to(device)

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[torch.Tensor]]:
        """Record the forward inside (every chunk of this rank): the list then holds its
        routing ``(N, L, k)`` (see :meth:`recording_chunk`, :meth:`whole`)."""
        result: list[torch.Tensor] = []
        with contextlib.ExitStack() as stack:
            got = [stack.enter_context(self.recording_chunk(c)) for c in range(len(self._by_chunk))]
            yield result
        result.append(self.whole([g[0] for g in got]))

    def replay(self, targets: torch.Tensor) -> None:
        """Route forwards (and backward recomputations) from now on by ``targets``
        ``(N, L, k)`` (``-1``: the router's own) — this rank's layers, its CP share and
        under sequence parallelism its TP share of the tokens — until :meth:`stop`."""
        if targets.shape[1:] != (self.num_layers, self.top_k):
            raise ValueError(
                f"router replay: routing of shape {tuple(targets.shape)} for a model of "
                f"{self.num_layers} MoE layers × top-{self.top_k}"
            )
        for share, group in ((self._p.cp, self._p.cp_group), (self._tp, self._p.tp_group)):
            if share > 1:
                size = targets.shape[0] // share
                rank = dist.get_rank(group)
                targets = targets[rank * size : (rank + 1) * size]
        for layer, r in zip(self.layers, self._routers):
            r.clear_indices()
            r.target_topk_idx = targets[:, layer]
        self._set(RouterReplayAction.REPLAY_FORWARD)

    def stop(self) -> None:
        """Route by the routers' own top-k again."""
        self._set(None)
        for r in self._routers:
            r.clear_indices()


def held_order(
    tokens: torch.Tensor, length: int, cp: int, *, inverse: bool = False
) -> torch.Tensor:
    """Sequence-first tokens ``(S·b, …)`` (``S = length``) in the CP ranks' order — rank
    0's positions (:func:`~temper.training.megatron_cp.cp_positions`), then rank 1's, … —
    or back (``inverse``); the identity at CP = 1."""
    if cp == 1:
        return tokens
    order = gathered_order(length, cp) if inverse else held_positions(length, cp)
    seq = tokens.reshape(length, -1, *tokens.shape[1:])
    return seq.index_select(0, order.to(tokens.device)).reshape(tokens.shape)


def _right_aligned(inp: ModelInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(columns (b, n), real (b, n))``: the trimmed column each right-aligned model
    position holds (``megatron_head.right_align``), and whether it is a real token."""
    mask = inp.attention_mask
    lead = (mask.cumsum(dim=1) == 0).sum(dim=1)
    lengths = mask.sum(dim=1)
    n = int(lengths.max())
    at = torch.arange(n, device=mask.device).unsqueeze(0)
    columns = (at + lead.unsqueeze(1)).clamp(max=mask.shape[1] - 1)
    return columns, at < lengths.unsqueeze(1)


def model_tokens(routed: torch.Tensor, inp: ModelInputs, width: int) -> torch.Tensor:
    """A micro-batch's routing ``(b, W, L, k)`` in the routers' order ``(S·b, L, k)``:
    right-aligned, padded with ``-1`` to the model's ``width`` = ``S`` positions,
    sequence-first."""
    columns, real = _right_aligned(inp)
    index = columns.reshape(*columns.shape, 1, 1).expand(-1, -1, *routed.shape[2:])
    tokens = routed.gather(1, index).masked_fill(~real[..., None, None], -1)
    pad = width - tokens.shape[1]
    tokens = torch.nn.functional.pad(tokens, (0, 0, 0, 0, 0, pad), value=-1)
    return tokens.transpose(0, 1).reshape(-1, *routed.shape[2:])


def token_columns(tokens: torch.Tensor, inp: ModelInputs) -> torch.Tensor:
    """Inverse of :func:`model_tokens`: ``(S·b, L, k)`` → ``(b, W, L, k)``, ``-1`` where
    the column holds padding."""
    b, width = inp.attention_mask.shape
    columns, real = _right_aligned(inp)
    seq_first = tokens.reshape(-1, b, *tokens.shape[1:]).transpose(0, 1)
    out = tokens.new_full((b, width, *tokens.shape[1:]), -1)
    rows = torch.arange(b, device=columns.device).unsqueeze(1).expand_as(columns)
    out[rows[real], columns[real]] = seq_first[:, : columns.shape[1]][real]
    return out


__all__ = [
    "MaskedRouterReplay",
    "MegatronRouterReplay",
    "held_order",
    "model_tokens",
    "token_columns",
]
