"""The hooks of the one-process engine that the distributed engines override
(:mod:`temper.training.fsdp2_engine`, :mod:`temper.training.deepspeed_engine`,
:mod:`temper.training.megatron_engine`): loading, wrapping and running the model,
splitting a batch, backward, reductions, clipping and the optimizer step. Here one
process is the world; :class:`temper.training.torch_engine.TorchEngine` builds on them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from temper.data.batch import Batch
from temper.training.base import TrainEngine
from temper.training.liger import apply_liger
from temper.training.micro_batching import MicroBatching, split_micro_batches
from temper.training.router_replay import RoutingHooks
from temper.training.spec import EngineSpec
from temper.training.torch_model import load_model, sparse_tied_embedding_grad
from temper.training.weights import is_peft_model
from temper.utils.router_replay_hf import HFRouterReplay


class OneProcessHooks(TrainEngine):
    """The overridable steps of :class:`~temper.training.torch_engine.TorchEngine`, as one
    process runs them (its ``__init__`` sets the attributes below)."""

    spec: EngineSpec
    compute_dtype: torch.dtype
    trainable: bool
    optimizer: torch.optim.Optimizer | None
    #: True while :meth:`adapters_disabled` runs the base model (the reference itself)
    _adapters_off: bool

    def _load_device(self) -> torch.device:
        """Where weights are loaded (an offloaded frozen model stays on the CPU)."""
        return torch.device("cpu") if self.spec.param_offload else self.device

    def _load_model(self) -> nn.Module:
        """The HF model (or value model) this engine trains, in its storage dtype."""
        model = load_model(
            self.spec, self._load_device(), self.compute_dtype, trainable=self.trainable
        )
        if self.spec.model.use_liger:
            apply_liger(model, self.device, self.spec.role)
        return model

    def _sparse_tied_embedding_grad(self) -> None:
        """Tied input/output embeddings get a sparse input-embedding gradient
        (:func:`temper.training.torch_model.sparse_tied_embedding_grad`); sharded engines
        keep their dense gradients."""
        sparse_tied_embedding_grad(self.model)

    def _router_replay(self) -> RoutingHooks:
        """The record/replay hooks of this engine's MoE routers (engines on another
        model implementation override it)."""
        return HFRouterReplay(self.model)

    def _wrap_model(self, model: nn.Module) -> nn.Module:
        """Hook for distributed engines (sharding) before the optimizer sees the params."""
        return model

    def _module(self) -> nn.Module:
        """What forwards are called on: the model, or a wrapper that runs it (DeepSpeed)."""
        return self.model

    def _split(self, batch: Batch, spec: MicroBatching) -> tuple[list[Batch], list[list[int]]]:
        """Micro-batches and their rows; an empty row list marks a padding micro-batch."""
        return split_micro_batches(batch, spec)

    def _all_finite(self, loss: torch.Tensor) -> bool:
        return bool(torch.isfinite(loss))

    def _backward(self, loss: torch.Tensor, *, last: bool) -> None:
        """Backward of one micro-batch's loss; ``last``: the mini-batch's final one."""
        loss.backward()

    def _reduce_sums(self, sums: dict[str, float]) -> dict[str, float]:
        """Partial sums of this rank → sums over all data-parallel ranks."""
        return sums

    def _reduce_grads(self) -> None:
        """Hook: combine gradients over data-parallel ranks before clipping (FSDP does it
        inside backward; the megatron engine here)."""

    def _clip_grad_norm(self, params: list[nn.Parameter], clip: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_(params, clip))

    def _optimizer_step(self) -> None:
        assert self.optimizer is not None
        self.optimizer.step()

    def _zero_grad(self) -> None:
        """Start a mini-batch with no gradients."""
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)

    def _discard_gradients(self, mb: Batch, out: dict[str, torch.Tensor]) -> None:
        """Drop the gradients accumulated so far (a micro-batch's loss was not finite);
        ``mb``/``out`` are that micro-batch and its outputs, for engines that must run a
        collective to clear their buffers."""
        self._zero_grad()

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.compute_dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.compute_dtype)

    @contextlib.contextmanager
    def _on_device(self) -> Iterator[None]:
        """With ``param_offload`` the weights visit the device only for the forward."""
        if not self.spec.param_offload or self.device.type == "cpu":
            yield
            return
        self.model.to(self.device)
        try:
            yield
        finally:
            self.model.to("cpu")

    @contextlib.contextmanager
    def adapters_disabled(self) -> Iterator[None]:
        """Run the base model without its LoRA adapters (the reference policy, for free)."""
        if not is_peft_model(self.model):
            raise RuntimeError("adapters_disabled() needs a LoRA model (model.lora.rank > 0)")
        self._adapters_off = True  # the reference itself: no KL to compare with
        try:
            peft: Any = self.model  # a peft model (is_peft_model)
            with peft.disable_adapter():
                yield
        finally:
            self._adapters_off = False

    @property
    def shareable_module(self) -> nn.Module | None:
        """The live Hugging Face model, which an in-process HF rollout may share."""
        return self.model

    @property
    def has_adapters(self) -> bool:
        return is_peft_model(self.model)
