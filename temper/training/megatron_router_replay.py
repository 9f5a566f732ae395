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
routers' order — Megatron's sequence-first ``(S, b)`` flattened; under sequence
parallelism each TP rank routes its ``S / TP`` positions, so a record is gathered over
the TP group and a replay cut to the rank's share. The layout of ``(S, b)`` against the
batch's columns is the engine's (:func:`model_tokens`, :func:`token_columns`).
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

    Attributes:
        num_layers: routers this rank holds (every MoE layer at one pipeline stage), ``L``.
        top_k: experts per token, ``k``.
        num_experts: experts per layer, ``E``.
    """

    def __init__(self, chunks: list[nn.Module], tp_group: Any, sequence_parallel: bool) -> None:
        self._routers: list[MaskedRouterReplay] = []
        first: TopKRouter | None = None
        for chunk in chunks:
            for module in chunk.modules():
                if isinstance(module, TopKRouter):
                    module.router_replay = MaskedRouterReplay()
                    self._routers.append(module.router_replay)
                    if first is None:
                        first = module
        if first is None:
            raise ValueError("the model has no MoE router (router replay needs an MoE model)")
        self.num_layers = len(self._routers)
        self.top_k = int(first.topk)
        self.num_experts = int(first.config.num_moe_experts)
        self._group = tp_group
        self._tp = dist.get_world_size(tp_group) if sequence_parallel else 1

    def _set(self, action: RouterReplayAction | None) -> None:
        for r in self._routers:
            if action is None:
                r.clear_router_replay_action()
            else:
                r.set_router_replay_action(action)

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[torch.Tensor]]:
        """Record the forward inside: the list then holds its routing ``(S·b, L, k)``,
        every TP rank's positions (sequence parallel) gathered in order."""
        result: list[torch.Tensor] = []
        for r in self._routers:
            r.clear_indices()
        self._set(RouterReplayAction.RECORD)
        try:
            yield result
        finally:
            self._set(None)
        recorded = [r.get_recorded_indices() for r in self._routers]
        missing = [i for i, t in enumerate(recorded) if t is None]
        if missing:
            raise RuntimeError(f"router replay: MoE layers {missing} did not run")
        local = torch.stack([t for t in recorded if t is not None], dim=1)
        for r in self._routers:
            r.clear_indices()
        if self._tp > 1:  # each TP rank routed one contiguous share of the positions
            parts = [torch.empty_like(local) for _ in range(self._tp)]
            dist.all_gather(parts, local.contiguous(), group=self._group)
            local = torch.cat(parts)
        result.append(local)

    def replay(self, targets: torch.Tensor) -> None:
        """Route forwards (and backward recomputations) from now on by ``targets``
        ``(S·b, L, k)`` (``-1``: the router's own), this rank's share under sequence
        parallelism, until :meth:`stop`."""
        if targets.shape[1:] != (self.num_layers, self.top_k):
            raise ValueError(
                f"router replay: routing of shape {tuple(targets.shape)} for a model of "
                f"{self.num_layers} MoE layers × top-{self.top_k}"
            )
        if self._tp > 1:
            share = targets.shape[0] // self._tp
            rank = dist.get_rank(self._group)
            targets = targets[rank * share : (rank + 1) * share]
        for layer, r in enumerate(self._routers):
            r.clear_indices()
            r.target_topk_idx = targets[:, layer]
        self._set(RouterReplayAction.REPLAY_FORWARD)

    def stop(self) -> None:
        """Route by the routers' own top-k again."""
        self._set(None)
        for r in self._routers:
            r.clear_indices()


def _right_aligned(inp: ModelInputs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(columns (b, n), real (b, n))``: the trimmed column each right-aligned model
    position holds (``megatron_engine.right_align``), and whether it is a real token."""
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


__all__ = ["MaskedRouterReplay", "MegatronRouterReplay", "model_tokens", "token_columns"]
