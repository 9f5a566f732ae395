"""The training-engine interface (torch, fsdp2, deepspeed, megatron implement it).

An engine owns a model, its optimizer and LR schedule, and how a batch is cut into
micro-batches. Roles (actor, critic, reference) own the losses: they hand the engine
a loss function and never see devices, sharding or gradient accumulation.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from typing import Any

import torch

from temper.data.batch import Batch

# loss_fn(micro_batch, model_outputs) -> (loss already scaled by the *global*
# normalizer of the mini-batch, metrics). Summing micro-batch losses gives the
# mini-batch loss exactly, so the engine never rescales by micro-batch count.
LossFn = Callable[[Batch, dict[str, torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]


class TrainEngine(abc.ABC):
    """A trainable (or frozen) causal LM / value model behind micro-batching."""

    @abc.abstractmethod
    def forward(self, batch: Batch, *, with_entropy: bool = False, temperature: float = 1.0,
                with_values: bool = False) -> dict[str, torch.Tensor]:
        """No-grad forward in micro-batches; returns per-response-token tensors
        ``log_probs`` (B, R), optionally ``entropy`` (B, R) or ``values`` (B, R)."""

    @abc.abstractmethod
    def train_mini_batch(self, batch: Batch, loss_fn: LossFn, *, temperature: float = 1.0,
                         with_entropy: bool = False) -> dict[str, float]:
        """Forward/backward every micro-batch of ``batch``, then one optimizer step.

        Raises ``NonFiniteError`` before the optimizer step when the loss or the
        gradient norm is not finite. Returns averaged metrics plus grad_norm and lr.
        """

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


class NonFiniteError(RuntimeError):
    """A loss or gradient norm was NaN/inf; the optimizer step was skipped."""
