"""The training-engine interface (torch, fsdp2, deepspeed, megatron implement it).

An engine owns a model, its optimizer and LR schedule, and how a batch is cut into
micro-batches. Roles (actor, critic, reference) own the losses: they hand the engine
a loss function and never see devices, sharding or gradient accumulation.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch
from torch import nn

from temper.algorithms.aggregation import GlobalNormalizers, compute_global_normalizers
from temper.data.batch import Batch
from temper.training.micro_batching import MicroBatching
from temper.training.router_replay import RoutingUse

# loss_fn(micro_batch, model_outputs) -> (loss already scaled by the *global*
# normalizer of the mini-batch, metrics). Summing micro-batch losses gives the
# mini-batch loss exactly, so the engine never rescales by micro-batch count.
# Metrics follow the same rule: the engine *sums* them over micro-batches, so a
# loss_fn reports a partial sum (e.g. a micro-batch mean times its share of the
# mini-batch's tokens), and the sum is the mini-batch value whatever the split.
LossFn = Callable[[Batch, dict[str, torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]


class LogitsSource(Protocol):
    """A frozen model whose logits an engine compares its own with (the reference)."""

    def response_logits(self, batch: Batch) -> torch.Tensor:
        """No-grad logits ``(b, r, V)`` scoring the response tokens of micro-batch
        ``batch``, trimmed as :func:`temper.training.micro_batching.model_inputs` trims."""
        ...


class TrainEngine(abc.ABC):
    """A trainable (or frozen) causal LM / value model behind micro-batching.

    Attributes:
        model: the module this process holds (a shard under data parallelism).
        device: where it computes.
        kl_reference: set (by the role builder) when the run uses the exact KL over the
            vocabulary (``kl_penalty`` / ``kl_loss_type: full``): every causal-LM forward
            then also returns ``full_kl`` (B, R), KL(this model ‖ reference) per token,
            computed micro-batch by micro-batch from both models' logits (differentiable
            in the training forward). Only engines with ``supports_full_kl`` take one.
    """

    model: nn.Module
    device: torch.device
    kl_reference: LogitsSource | None = None
    supports_full_kl: bool = False

    def response_logits(self, batch: Batch) -> torch.Tensor:
        """The :class:`LogitsSource` method, for engines with ``supports_full_kl``."""
        raise RuntimeError(f"{type(self).__name__} has no logits for the exact KL")

    @property
    def has_adapters(self) -> bool:
        """The model trains LoRA adapters (its base weights are then the reference)."""
        return False

    def adapters_disabled(self) -> contextlib.AbstractContextManager[None]:
        """A context in which the model runs without its adapters (needs adapters)."""
        raise RuntimeError(f"{type(self).__name__} has no LoRA adapters to disable")

    @abc.abstractmethod
    def forward(
        self,
        batch: Batch,
        *,
        with_entropy: bool = False,
        temperature: float = 1.0,
        with_values: bool = False,
        micro_batching: MicroBatching | None = None,
        with_sum_pi_squared: bool = False,
        routing: RoutingUse | None = None,
    ) -> dict[str, torch.Tensor]:
        """No-grad forward in micro-batches; returns per-response-token tensors
        ``log_probs`` (B, R), optionally ``entropy`` (B, R), ``sum_pi_squared`` (B, R)
        (``Σ_v π_v²`` of the tempered distribution at each token) or ``values`` (B, R), in
        batch order, 0 on masked tokens. ``micro_batching`` overrides the engine's
        inference micro-batching (the reference may share the actor's engine).
        ``routing`` (engines built with ``router_replay``): ``record`` also returns the MoE
        routing ``routed_experts`` (B, P + R, L, k); ``replay`` routes by the batch's
        (:mod:`temper.training.router_replay`). A training forward of a batch holding
        ``routed_experts`` replays them."""

    @abc.abstractmethod
    def top_logits(
        self,
        batch: Batch,
        k: int,
        scale: float,
        micro_batching: MicroBatching | None = None,
        *,
        vocab: int | None = None,
        log_probs: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """No-grad: at every response token the ``k`` largest logits divided by ``scale``
        among token ids ``< vocab`` (None: every column of the output layer) and their ids
        (``k = 0``: every token), ``(B, R, k)`` each in batch order,
        zero on masked tokens — a teacher's side of offline distillation. ``log_probs``:
        the values are the log-softmax of ``logits / scale`` over those ids instead (a
        teacher of on-policy distillation's top-k loss). A training forward of a batch
        holding those ids (``kd_indices``) returns the model's own logits at them
        (``kd_logits``, differentiable)."""

    @abc.abstractmethod
    def train_mini_batch(
        self, batch: Batch, loss_fn: LossFn, *, temperature: float = 1.0, with_entropy: bool = False
    ) -> dict[str, float]:
        """Forward/backward every micro-batch of ``batch``, then one optimizer step.

        Raises ``NonFiniteError`` before the optimizer step when the loss or the
        gradient norm is not finite. Returns the loss_fn metrics summed over
        micro-batches plus ``loss`` (the mini-batch loss), ``grad_norm`` (before
        clipping) and ``lr`` (of this step).
        """

    @abc.abstractmethod
    def trainable_parameters(self) -> Iterator[torch.nn.Parameter]:
        """Parameters the optimizer updates (LoRA: the adapters only)."""

    @abc.abstractmethod
    def set_total_steps(self, total_steps: int) -> None:
        """Optimizer steps of the whole run (LR decay length, warmup_ratio base)."""

    @abc.abstractmethod
    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full (gathered, merged-LoRA) weights under Hugging Face names, for sync."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer, scheduler state for checkpoints."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of ``state_dict``."""

    @abc.abstractmethod
    def save_hf(self, path: str) -> None:
        """Write a Hugging Face model directory (weights + config + tokenizer)."""

    def save_checkpoint(self, path: str) -> None:
        """Resumable state in directory ``path``: trainable weights as safetensors, the
        rest (optimizer, schedule) with ``torch.save``. Sharded engines write their own
        format (one writer per rank); this is the one-process one."""
        from pathlib import Path

        from safetensors.torch import save_file

        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        state = dict(self.state_dict())
        model = state.pop("model")
        save_file(
            {k: v.detach().to("cpu").contiguous() for k, v in model.items()},
            str(out / "model.safetensors"),
        )
        torch.save(state, out / "state.pt")

    def load_checkpoint(self, path: str) -> None:
        """Inverse of :meth:`save_checkpoint`."""
        from pathlib import Path

        from safetensors.torch import load_file

        src = Path(path)
        state = torch.load(src / "state.pt", map_location="cpu", weights_only=True)
        self.load_state_dict({"model": load_file(str(src / "model.safetensors")), **state})

    @property
    def shareable_module(self) -> torch.nn.Module | None:
        """A Hugging Face causal LM that *is* this engine's live weights, which an
        in-process HF rollout may generate with instead of holding a copy; ``None`` when
        the weights live in another form (sharded, Megatron) and must be synced."""
        return None

    # Data parallelism. A role builds its loss from the mini-batch's *global* counts; on
    # one process these are its own, a data-parallel engine sums them over its ranks.

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks, each holding a different share of every mini-batch."""
        return 1

    @property
    def dp_rank(self) -> int:
        """This rank's index among the ``dp_size`` data-parallel shares (ranks with the
        same index — a tensor-parallel group — must be given the same samples)."""
        if self.dp_size > 1 and torch.distributed.is_initialized():
            return torch.distributed.get_rank()
        return 0

    def global_sum(self, values: list[float]) -> list[float]:
        """Element-wise sum over the data-parallel ranks (a collective: all ranks call it)."""
        return [float(v) for v in values]

    def global_normalizers(self, response_mask: torch.Tensor) -> GlobalNormalizers:
        """Loss denominators of the whole mini-batch, this rank's share being ``response_mask``."""
        g = compute_global_normalizers(response_mask)
        tokens, seqs = self.global_sum([g.num_tokens, g.num_seqs])
        return GlobalNormalizers(num_tokens=tokens, num_seqs=seqs, max_len=g.max_len)


class NonFiniteError(RuntimeError):
    """A loss or gradient norm was NaN/inf; the optimizer step was skipped."""
