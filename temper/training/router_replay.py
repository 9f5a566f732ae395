"""Router replay for mixture-of-experts models: the modes, and where routing sits in a batch.

An MoE layer's router picks ``k`` experts per token (top-k of its scores) and weights
their outputs by gates computed from its logits. Two forwards of the same tokens can pick
different experts — other weights (after an optimizer step), other kernels (rollout
engine vs trainer), other numerics — and a flipped choice moves the token's log-prob far
more than the weights moved. Router replay records the experts of one forward and makes
later forwards use them (the rollout-vs-training mismatch on MoE models):

* ``R2`` (verl, ROLL: vanilla routing replay): the actor's old-log-prob forward records
  its routing; every training forward of the update replays it. At the first update
  step the weights are the old ones, so the replayed forward *is* the recorded one;
* ``R3`` (rollout routing replay): the rollout engine records the routing of the tokens
  it generated and returns it with each sample (``SamplingParams.routed_experts``: the
  ``hf`` engine hooks its routers while ``generate`` runs — the prefill routes the
  prompt, each decoding step the token it feeds; vLLM on a GPU returns it with
  ``enable_return_routed_experts``); the old-log-prob forward and every training forward
  replay it, and none records. The trainer then scores each token with the experts that
  generated it: the rollout's and the trainer's kernels no longer flip routing between
  them, and the old log-probs need not be recomputed for the replay to hold.

Replayed gates: the router's logits ``s`` of *this* forward, its own score function and
normalisation, evaluated at the replayed experts ``I`` instead of its top-k. For the
softmax routers here that is ``g_i = softmax(s)_i / Σ_{j∈I} softmax(s)_j`` when the model
renormalises its top-k (``norm_topk_prob``, Mixtral always) — the softmax of the logits
of ``I``, as verl and ROLL replay — and ``softmax(s)_i`` when it does not (Qwen2-MoE's
default). Gates stay differentiable in the router weights; only the selection is fixed.

Where routing sits (:mod:`temper.data.routing`): a batch holds it as ``routed_experts``
``(B, P + R, L, k)`` (int8, int16 beyond 127 experts), the experts of each token of
``prompt_ids ‖ response_ids`` in the batch's own columns, for each of the model's ``L`` MoE
layers; ``-1`` where nothing was recorded (padding, the last generated token, which no
rollout forward saw). Rows travel with their sample through shuffles, rounds of
generation padded together, mini- and micro-batch cuts like every other per-sample
tensor; a micro-batch's forward cuts out its columns (:func:`micro_routing`) and, when
packed, moves them to the packed row (:func:`to_packed`). A ``-1`` token keeps the
router's own choice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from temper.config.errors import ConfigError
from temper.data.batch import Batch
from temper.data.routing import ROUTED_EXPERTS, routing_dtype
from temper.registry import Registry
from temper.training.micro_batching import ModelInputs
from temper.training.packing import PackedInputs

#: The schema's value that turns replay off.
OFF = "none"
#: ``model_type`` values whose routers replay knows, on every engine and the ``hf``
#: rollout (HF: ``router_replay_hf.router_gates``; Megatron converts exactly these MoE
#: models).
REPLAY_MODEL_TYPES = ("qwen2_moe", "qwen3_moe", "mixtral")
#: What a no-grad forward does with the routing (``TrainEngine.forward(routing=...)``).
RoutingUse = Literal["record", "replay"]


@dataclass(frozen=True)
class ReplayMode:
    """Where a mode's routing is recorded: the actor's old-log-prob forward, or the
    rollout engine's generation."""

    recorded_at: Literal["old_log_prob", "rollout"]


ROUTER_REPLAY: Registry[ReplayMode] = Registry("router_replay")
ROUTER_REPLAY.add("R2", ReplayMode("old_log_prob"))
ROUTER_REPLAY.add("R3", ReplayMode("rollout"))


def from_rollout(mode: str) -> bool:
    """Whether ``actor.router_replay`` = ``mode`` replays the rollout engine's routing
    (R3): the rollout then returns ``routed_experts`` with its samples."""
    return mode != OFF and ROUTER_REPLAY.get(mode).recorded_at == "rollout"


class RoutingHooks(Protocol):
    """One model's MoE routers, recordable and replayable (HF:
    :mod:`temper.utils.router_replay_hf`, Megatron: ``megatron_router_replay``). Tokens
    ``N`` are in the order the routers see them (the engine's layout functions map them
    to batch columns)."""

    num_layers: int  # L, the model's MoE layers
    top_k: int  # k
    num_experts: int  # E

    def recording(self) -> contextlib.AbstractContextManager[list[torch.Tensor]]:
        """The forward inside records; the list then holds its routing ``(N, L, k)``."""
        ...

    def replay(self, targets: torch.Tensor) -> None:
        """Route the ``N`` tokens of forwards from now on by ``targets (N, L, k)``
        (``-1``: the router's own choice), until :meth:`stop`."""
        ...

    def stop(self) -> None:
        """Route by the routers' own top-k again."""
        ...


class Recording(contextlib.AbstractContextManager[Any]):
    """A micro-batch forward that records its routing; ``to_columns`` maps the recorded
    ``(N, L, k)`` to the micro-batch's ``routed_experts`` rows ``(b, P + R, L, k)``."""

    def __init__(
        self, hooks: RoutingHooks, to_columns: Callable[[torch.Tensor], torch.Tensor]
    ) -> None:
        self.hooks = hooks
        self._ctx = hooks.recording()
        self._to_columns = to_columns
        self._tokens: list[torch.Tensor] = []

    def __enter__(self) -> Recording:
        self._tokens = self._ctx.__enter__()
        return self

    def __exit__(self, *exc: Any) -> bool | None:
        return self._ctx.__exit__(*exc)

    def columns(self) -> torch.Tensor:
        """The recorded routing as batch columns (after the forward)."""
        return self._to_columns(self._tokens[0].to(routing_dtype(self.hooks.num_experts)))


def check_replay_model(model_type: object, mode: str, key: str) -> None:
    """Refuse router replay (``actor.router_replay``, ``mode``) for a model whose
    config.json names a ``model_type`` with no router replay knows (pre-flight)."""
    if model_type in REPLAY_MODEL_TYPES:
        return
    raise ConfigError(
        "actor.router_replay",
        f"router replay {mode} records and replays the experts of MoE routers; {key}'s "
        f"model_type {model_type!r} has none replay knows ({', '.join(REPLAY_MODEL_TYPES)})",
        "set actor.router_replay=none, or train one of those MoE models",
    )


def micro_routing(routed: torch.Tensor, inp: ModelInputs) -> torch.Tensor:
    """The routing ``(b, W, L, k)`` of a micro-batch's trimmed input ``inp`` (``W``
    columns) out of its rows of the batch's ``routed`` ``(b, P + R, L, k)``.

    ``inp.input_ids = prompt[:, P - W + r:] ‖ response[:, :r]``
    (:func:`~temper.training.micro_batching.model_inputs`), so its columns are
    ``P - W + r … P + r`` of the batch's."""
    width, r = inp.input_ids.shape[1], inp.response_len
    prompt = routed.shape[1] - inp.full_response_len
    return routed[:, prompt - width + r : prompt + r]


def batch_routing(per_token: torch.Tensor, inp: ModelInputs, prompt_width: int) -> torch.Tensor:
    """Inverse of :func:`micro_routing`: ``(b, W, L, k)`` → ``(b, P + R, L, k)``, ``-1``
    in the columns the micro-batch trimmed."""
    b, width = per_token.shape[:2]
    r = inp.response_len
    out = per_token.new_full((b, prompt_width + inp.full_response_len, *per_token.shape[2:]), -1)
    out[:, prompt_width - width + r : prompt_width + r] = per_token
    return out


def to_packed(padded: torch.Tensor, index: torch.Tensor, tokens: int) -> torch.Tensor:
    """``(b, W, …)`` → the packed row's ``(T, …)``; ``index (b, W)`` is each token's packed
    position (``-1`` at padding, :class:`~temper.training.packing.PackPlan`). Rows that
    share a prompt write the same position: the last one's routing is kept."""
    real = index >= 0
    out = padded.new_full((tokens, *padded.shape[2:]), -1)
    out[index[real]] = padded[real]
    return out


def from_packed(packed: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`to_packed`: ``(T, …)`` → ``(b, W, …)``, ``-1`` at padding."""
    real = index >= 0
    out = packed.new_full((*index.shape, *packed.shape[1:]), -1)
    out[real] = packed[index[real]]
    return out


def model_tokens(
    routed: torch.Tensor, inp: ModelInputs, packed: PackedInputs | None
) -> torch.Tensor:
    """A micro-batch's routing ``(b, W, L, k)`` in the order the model's routers see its
    tokens ``(N, L, k)``: row-major over ``(b, W)``, or the packed row's."""
    if packed is not None:
        return to_packed(routed, packed.token_index, packed.input_ids.shape[1])
    return routed.reshape(-1, *routed.shape[2:])


def token_columns(
    tokens: torch.Tensor, inp: ModelInputs, packed: PackedInputs | None
) -> torch.Tensor:
    """Inverse of :func:`model_tokens`, ``-1`` at padding."""
    if packed is not None:
        return from_packed(tokens, packed.token_index)
    per_token = tokens.reshape(*inp.input_ids.shape, *tokens.shape[1:])
    return per_token.masked_fill(~(inp.attention_mask > 0)[..., None, None], -1)


def route(
    hooks: RoutingHooks,
    use: RoutingUse | None,
    mb: Batch,
    inp: ModelInputs,
    device: torch.device,
    *,
    to_model: Callable[[torch.Tensor], torch.Tensor],
    to_columns: Callable[[torch.Tensor], torch.Tensor],
) -> contextlib.AbstractContextManager[Any]:
    """Routing of micro-batch ``mb``'s forward: recorded (a :class:`Recording`) in a
    forward asked to record; replayed from ``mb``'s ``routed_experts`` in a training
    forward, or a forward asked to replay, of a batch that holds them (the replay stays
    set through the backward, for recomputed layers); else the routers' own.
    ``to_model`` / ``to_columns``: the engine's token orders (:func:`model_tokens` and
    :func:`token_columns` for an HF model, sequence-first under Megatron)."""
    if use == "record":
        return Recording(
            hooks, lambda tokens: batch_routing(to_columns(tokens), inp, mb["prompt_ids"].shape[1])
        )
    if (torch.is_grad_enabled() or use == "replay") and ROUTED_EXPERTS in mb:
        hooks.replay(to_model(micro_routing(mb[ROUTED_EXPERTS], inp).to(device)))
    else:
        hooks.stop()
    return contextlib.nullcontext()


__all__ = [
    "OFF",
    "REPLAY_MODEL_TYPES",
    "ROUTED_EXPERTS",
    "ROUTER_REPLAY",
    "Recording",
    "ReplayMode",
    "RoutingHooks",
    "RoutingUse",
    "batch_routing",
    "check_replay_model",
    "from_packed",
    "from_rollout",
    "micro_routing",
    "model_tokens",
    "route",
    "routing_dtype",
    "to_packed",
    "token_columns",
]
