"""The reference policy: frozen log-probs for the KL terms.

Either its own frozen engine (a second copy of the weights, stored in the compute
dtype), or — when the actor trains LoRA adapters — the actor's engine with the adapters
switched off: the base weights *are* the reference, so no second copy is loaded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from temper.data.batch import Batch
from temper.roles.kd_loss import TEACHER_LOGITS
from temper.training.base import TrainEngine
from temper.training.micro_batching import KD_INDICES, MicroBatching


class Reference:
    """``compute_ref_log_probs`` over a frozen engine or the actor's adapter-free base."""

    def __init__(
        self,
        engine: TrainEngine,
        *,
        disable_adapters: bool = False,
        micro_batching: MicroBatching | None = None,
        temperature: float = 1.0,
        engine_from: Callable[[str], TrainEngine] | None = None,
    ) -> None:
        """``engine_from(path)``: a frozen engine like ``engine`` holding the weights of
        Hugging Face directory ``path`` (what :meth:`reload` builds); None: not reloadable."""
        if disable_adapters and not engine.has_adapters:
            raise ValueError("disable_adapters needs an engine with LoRA adapters")
        self.engine = engine
        self.disable_adapters = disable_adapters
        self.micro_batching = micro_batching
        self.temperature = temperature if temperature > 0 else 1.0
        self.engine_from = engine_from

    def reload(self, model_path: str) -> None:
        """Score with the weights of Hugging Face directory ``model_path`` from now on (online
        DPO makes the policy its reference); the engine is rebuilt as the first one was."""
        if self.engine_from is None:
            raise ValueError(
                "this reference cannot be reloaded: a LoRA reference is the actor's "
                "adapter-free base, a shared engine is not the reference's own"
            )
        self.engine = self.engine_from(model_path)

    def _context(self) -> contextlib.AbstractContextManager[None]:
        return (
            self.engine.adapters_disabled() if self.disable_adapters else contextlib.nullcontext()
        )

    def response_logits(self, batch: Batch) -> torch.Tensor:
        """Reference logits of a micro-batch: the actor's engine compares its own with them
        for the exact KL (``kl_penalty`` / ``kl_loss_type: full``)."""
        with self._context():
            return self.engine.response_logits(batch)

    def compute_ref_log_probs(self, batch: Batch) -> Batch:
        """A copy of ``batch`` with ``ref_log_probs`` (B, R), 0 on masked tokens."""
        t = float(batch.meta.get("temperature", self.temperature) or 1.0)
        with self._context():
            out = self.engine.forward(
                batch, temperature=t if t > 0 else 1.0, micro_batching=self.micro_batching
            )
        return batch.union(Batch.from_dict({"ref_log_probs": out["log_probs"]}))

    def compute_top_logits(
        self, batch: Batch, k: int, scale: float, vocab: int | None = None, log_probs: bool = False
    ) -> Batch:
        """A copy of ``batch`` with a teacher's side of offline distillation: ``kd_indices``
        (its ``k`` most likely token ids at each response token; 0: every token) and
        ``kd_teacher_logits`` (its logits there divided by ``scale``; ``log_probs``: their
        log-softmax, as on-policy distillation's top-k loss wants), ``(B, R, k)``, among
        token ids ``< vocab`` (None: every column of its output layer)."""
        with self._context():
            values, ids = self.engine.top_logits(
                batch, k, scale, self.micro_batching, vocab=vocab, log_probs=log_probs
            )
        return batch.union(Batch.from_dict({KD_INDICES: ids, TEACHER_LOGITS: values}))
