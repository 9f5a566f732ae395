"""Router replay on Hugging Face MoE models: the torch, fsdp2 and deepspeed engines
replay through it, and the ``hf`` rollout engine records what ``generate`` routes.

The MoE blocks of transformers' Qwen2-MoE, Qwen3-MoE and Mixtral route through a router
module (``…TopKRouter``: ``hidden (N, H) → (logits (N, E), gates (N, k), experts (N, k))``)
that the block then hands to its experts. :class:`HFRouterReplay` puts a forward hook on
every router of a model (their module order is the layer order): while recording it
keeps the experts each router chose — of one forward, or of each forward of a
generation; while replaying it replaces them by the given ones and the gates by the
router's gate function at those experts (:func:`router_gates`,
:mod:`temper.training.router_replay` states the formula). The hook stays in place through
the backward, so an activation-checkpointed layer recomputes the same routing.
:func:`moe_layer_indices` says which decoder layers of a config those routers are.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn

#: ``(router, logits (N, E), experts (N, k)) -> gates (N, k)``, as the router computes
#: its gates from its logits for its own top-k.
GateFn = Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]


def qwen_gates(router: Any, logits: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """Qwen2-/Qwen3-MoE: ``p = softmax(s)`` in fp32, ``g = p[I]``, renormalised over ``I``
    when ``norm_topk_prob``, in the logits' dtype."""
    gates = torch.softmax(logits, dtype=torch.float, dim=-1).gather(-1, experts)
    if router.norm_topk_prob:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    return gates.to(logits.dtype)


def mixtral_gates(router: Any, logits: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """Mixtral: ``p = softmax(s)`` in fp32, ``g = p[I] / Σ_I p`` (always renormalised)."""
    gates = torch.softmax(logits.float(), dim=-1).gather(-1, experts)
    return gates / gates.sum(dim=-1, keepdim=True)


@functools.cache
def router_gates() -> dict[type[nn.Module], GateFn]:
    """The router classes replay knows, with their gate functions."""
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeTopKRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    return {
        Qwen2MoeTopKRouter: qwen_gates,
        Qwen3MoeTopKRouter: qwen_gates,
        MixtralTopKRouter: mixtral_gates,
    }


class HFRouterReplay:
    """Record / replay the routing of every MoE router of one HF model.

    Attributes:
        num_layers: routers in the model (its MoE layers), ``L``.
        top_k: experts per token, ``k``.
        num_experts: experts per layer, ``E``.
    """

    def __init__(self, model: nn.Module) -> None:
        gates = router_gates()
        self._routers = [(m, gates[type(m)]) for m in model.modules() if type(m) in gates]
        if not self._routers:
            raise ValueError(
                "the model has no MoE router replay knows (Qwen2-MoE, Qwen3-MoE, Mixtral)"
            )
        first: Any = self._routers[0][0]
        self.num_layers = len(self._routers)
        self.top_k = int(first.top_k)
        self.num_experts = int(first.num_experts)
        self._recorded: list[torch.Tensor | None] = [None] * self.num_layers
        self._targets: torch.Tensor | None = None
        self._recording = False
        for layer, (router, gate) in enumerate(self._routers):
            router.register_forward_hook(self._hook(layer, gate))

    def _hook(self, layer: int, gate: GateFn) -> Callable[..., Any]:
        def hook(router: nn.Module, args: Any, output: Any) -> Any:
            logits, _, experts = output
            if self._recording:
                self._recorded[layer] = experts.detach()
                return None
            if self._targets is None:
                return None
            target = self._targets[:, layer].to(experts.device, torch.long)
            if target.shape != experts.shape:
                raise RuntimeError(
                    f"router replay: layer {layer} routes {tuple(experts.shape)} tokens × "
                    f"experts, the replayed routing is {tuple(target.shape)}"
                )
            chosen = torch.where(target >= 0, target, experts)  # -1: the router's own
            return logits, gate(router, logits, chosen), chosen

        return hook

    def _take(self) -> torch.Tensor:
        """The routing ``(N, L, k)`` the routers recorded since the last take."""
        missing = [i for i, r in enumerate(self._recorded) if r is None]
        if missing:
            raise RuntimeError(f"router replay: MoE layers {missing} did not run")
        taken = torch.stack([r for r in self._recorded if r is not None], dim=1)
        self._recorded = [None] * self.num_layers
        return taken

    @contextlib.contextmanager
    def recording(self) -> Iterator[list[torch.Tensor]]:
        """Record the forward run inside: the yielded list then holds the routing
        ``(N, L, k)`` of its ``N`` tokens (in the order the routers saw them)."""
        result: list[torch.Tensor] = []
        self._recorded = [None] * self.num_layers
        self._recording = True
        try:
            yield result
        finally:
            self._recording = False
        result.append(self._take())

    @contextlib.contextmanager
    def recording_forwards(self, model: nn.Module) -> Iterator[list[torch.Tensor]]:
        """Record each forward of ``model`` run inside — a ``generate``: the prefill, then
        one forward per decoding step: the yielded list gets each forward's routing
        ``(N, L, k)`` as that forward ends."""
        result: list[torch.Tensor] = []

        def ended(module: nn.Module, args: Any, output: Any) -> None:
            result.append(self._take())

        self._recorded = [None] * self.num_layers
        self._recording = True
        handle = model.register_forward_hook(ended)
        try:
            yield result
        finally:
            handle.remove()
            self._recording = False
            self._recorded = [None] * self.num_layers

    def replay(self, targets: torch.Tensor) -> None:
        """Forwards from now on (and backwards' recomputations) route their ``N`` tokens
        by ``targets`` ``(N, L, k)`` (``-1``: the router's own choice), until :meth:`stop`."""
        if targets.shape[1:] != (self.num_layers, self.top_k):
            raise ValueError(
                f"router replay: routing of shape {tuple(targets.shape)} for a model of "
                f"{self.num_layers} MoE layers × top-{self.top_k}"
            )
        self._targets = targets

    def stop(self) -> None:
        """Route by the routers' own top-k again."""
        self._targets = None

    @contextlib.contextmanager
    def replaying(self, targets: torch.Tensor) -> Iterator[None]:
        """:meth:`replay` for the forwards (and backwards) inside."""
        self.replay(targets)
        try:
            yield
        finally:
            self.stop()


def _field(config: Any, name: str) -> Any:
    return config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)


def moe_layer_indices(config: Any) -> list[int]:
    """The decoder layers of an HF MoE config (a ``PretrainedConfig`` or its config.json
    dict) that route through experts: every layer for Mixtral; for Qwen2-/Qwen3-MoE
    transformers' rule, layer ``i`` is an MoE layer when it is not in
    ``mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0``."""
    layers = int(_field(config, "num_hidden_layers"))
    if _field(config, "model_type") == "mixtral":
        return list(range(layers))
    step = int(_field(config, "decoder_sparse_step") or 1)
    dense = set(_field(config, "mlp_only_layers") or [])
    return [i for i in range(layers) if i not in dense and (i + 1) % step == 0]


__all__ = ["GateFn", "HFRouterReplay", "mixtral_gates", "moe_layer_indices", "qwen_gates"]
