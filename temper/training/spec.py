"""What it takes to build an engine, in one value every strategy's factory accepts.

Roles describe the engine they need (model, trained or frozen, policy or value head,
batching) as an :class:`EngineSpec`; the registry (:mod:`temper.training.registry`)
turns it into a ``torch`` / ``fsdp2`` / … engine. One signature keeps the roles free of
strategy branches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch

from temper.config.schema import (
    FSDPConfig,
    MegatronConfig,
    ModelConfig,
    OptimConfig,
    TrainEngineConfig,
)
from temper.training.micro_batching import MicroBatching

#: ``causal_lm``: a policy (log-probs, entropy); ``value``: a critic, the backbone with a
#: scalar head saved in temper's value-model layout; ``score``: the same network saved as
#: a Hugging Face sequence-classification model (a reward model in training).
ModelKind = Literal["causal_lm", "value", "score"]


@dataclass
class EngineSpec:
    """Inputs of an engine factory.

    Attributes:
        model: the model section (path, dtype, LoRA, checkpointing, …).
        device: where compute runs.
        kind: ``causal_lm`` (log-probs, entropy), ``value`` or ``score`` (backbone +
            scalar head; see :data:`ModelKind`).
        model_path: weights to load instead of ``model.path`` (critic ``model_path``).
        train: batching, clipping and optimizer of a trained role; ``None`` = frozen.
        infer_micro: micro-batching of no-grad forwards (log-probs, values).
        entropy_chunk_size: rows per chunk of the log-prob + entropy pass (0: sized to the
            vocabulary, :func:`~temper.algorithms.logprobs.fused_chunk_rows`).
        param_offload: keep a frozen model on CPU between forwards (GPU memory).
        seed: seeds fresh heads (value model) deterministically.
        total_steps: optimizer steps of the LR schedule, if known now.
        role: config section name used in error messages (``actor``, ``critic``, …).
        fsdp: FSDP2 settings of a frozen role (trained roles use ``train.fsdp``).
        megatron: Megatron settings of a frozen role (trained roles use ``train.megatron``).
        deepspeed: DeepSpeed config of a frozen role (trained roles use ``train.deepspeed``).
        router_replay: the model's MoE routing can be recorded and replayed
            (:mod:`temper.training.router_replay`; the actor under ``actor.router_replay``).
        sequence_parallel: Ulysses group size of a frozen role (the reference runs with
            the actor's, as verl's does); trained roles use
            ``train.ulysses_sequence_parallel_size``.
    """

    model: ModelConfig
    device: torch.device
    kind: ModelKind = "causal_lm"
    model_path: str | None = None
    train: TrainEngineConfig | None = None
    infer_micro: MicroBatching = MicroBatching()
    entropy_chunk_size: int = 0
    param_offload: bool = False
    seed: int = 0
    total_steps: int | None = None
    role: str = "actor"
    fsdp: FSDPConfig | None = None
    megatron: MegatronConfig | None = None
    deepspeed: dict[str, Any] | None = None
    router_replay: bool = False
    sequence_parallel: int = 1

    @property
    def ulysses_size(self) -> int:
        """Ranks per Ulysses sequence-parallel group (:mod:`temper.training.ulysses`)."""
        if self.train is not None:
            return self.train.ulysses_sequence_parallel_size
        return self.sequence_parallel

    @property
    def value_head(self) -> bool:
        """The model is a backbone with a scalar head (forwards return ``values``)."""
        return self.kind in ("value", "score")

    @property
    def optim(self) -> OptimConfig | None:
        return self.train.optim if self.train is not None else None

    @property
    def fsdp_config(self) -> FSDPConfig:
        """FSDP2 settings: ``fsdp`` if given, else the trained role's, else defaults."""
        if self.fsdp is not None:
            return self.fsdp
        return self.train.fsdp if self.train is not None else FSDPConfig()

    @property
    def megatron_config(self) -> MegatronConfig:
        """Megatron settings: ``megatron`` if given, else the trained role's, else defaults."""
        if self.megatron is not None:
            return self.megatron
        return self.train.megatron if self.train is not None else MegatronConfig()

    @property
    def deepspeed_section(self) -> dict[str, Any]:
        """The role's DeepSpeed config section: ``deepspeed`` if given, else the trained
        role's, else empty (DeepSpeed's defaults: ZeRO stage 0)."""
        if self.deepspeed is not None:
            return self.deepspeed
        return self.train.deepspeed if self.train is not None else {}

    @property
    def train_micro(self) -> MicroBatching:
        """Micro-batching of forward/backward passes (samples or token budget)."""
        t = self.train
        if t is None:
            return self.infer_micro
        budget = t.max_token_len_per_device if t.use_dynamic_bsz else None
        return MicroBatching(size=t.micro_batch_size_per_device, max_tokens=budget)
