"""The rollout-engine interface every engine (hf, vllm, sglang) implements.

Token in, token out: prompts arrive as token ids (left-padded ``prompt_ids`` with
``prompt_mask``) and responses leave as token ids with the log-probs they were
sampled with, so nothing is re-tokenized between rollout and training.

Everything a caller uses is declared here — the driver (weight sync, checkpoints,
close), the multi-turn runner (stop and pad ids) and the wrappers (tool calling, the
Ray handle) — so no caller probes an engine with ``getattr``.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from temper.data.batch import Batch


@dataclasses.dataclass
class SamplingParams:
    """Per-call sampling settings (training or validation)."""

    n: int = 1
    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: disabled
    do_sample: bool = True
    ignore_eos: bool = False
    repetition_penalty: float = 1.0
    stop: list[str] = dataclasses.field(default_factory=list)
    stop_token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: bool = True
    #: also return ``routed_experts`` (B·n, P + R, L, k): the experts each MoE layer chose
    #: for each token (router replay R3; :mod:`temper.data.routing`)
    routed_experts: bool = False

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature <= 0.0


@dataclasses.dataclass(frozen=True)
class TensorParallelShard:
    """One rank of a tensor-parallel engine whose ranks are separate processes (the Ray
    backend's ``actor_infer`` ranks, ``rollout.tensor_parallel_size`` per engine): every
    rank runs the same engine on the same prompts (SPMD) and holds 1/``world`` of each
    sharded weight; ``addr:port`` is where the engine's ranks meet."""

    rank: int
    world: int
    addr: str
    port: int
    local_rank: int  # the device index in this process (0 where Ray shows one GPU)


class RolloutEngine(abc.ABC):
    """Generates responses for a batch of tokenized prompts.

    Attributes:
        shared: the engine generates with the trainer's own module (``hf`` colocated),
            so its weights are always current and ``load_weights`` is never needed;
            False for engines holding their own copy (vLLM, remote ranks), which the
            driver syncs after updates.
        eos_token_ids: ids the engine stops on by default (empty: the tokenizer's EOS).
        pad_token_id: id right-padding responses (None: the tokenizer's).
    """

    shared: bool = False
    eos_token_ids: Sequence[int] = ()
    pad_token_id: int | None = None

    @abc.abstractmethod
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """Return ``params.n`` responses per prompt, rows grouped per prompt (aabb).

        Input tensors: ``prompt_ids`` (B, P) left-padded, ``prompt_mask`` (B, P).
        Output: the prompt rows repeated ``n`` times (objects too) plus
        ``response_ids`` (B·n, R) right-padded with the pad id, ``response_mask``
        (B·n, R) 1 on generated tokens (EOS included, nothing after it),
        ``rollout_log_probs`` (B·n, R) log-probs under the *sampling* distribution
        (after temperature/top-k/top-p), 0 where masked, and object column
        ``truncated`` (bool: the response hit max_new_tokens without EOS/stop).
        With ``params.routed_experts``, also ``routed_experts`` (B·n, P + R, L, k): each
        MoE layer's experts for each token of ``prompt ‖ response`` in these columns, -1
        where no forward of the engine routed one (padding, the last generated token).
        """

    @abc.abstractmethod
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights with the trainer's (Hugging Face names)."""

    def sleep(self) -> None:  # noqa: B027 (optional hook, no-op by default)
        """Free device memory between rollouts (engines that can)."""

    def wake_up(self) -> None:  # noqa: B027 (optional hook, no-op by default)
        """Take device memory back before a rollout."""

    def close(self) -> None:  # noqa: B027 (optional hook, no-op by default)
        """Release the engine."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold to resume generation exactly (engine-side RNG
        streams, …); ``{}`` when sampling depends only on the torch RNG, which the
        checkpoint captures anyway."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:  # noqa: B027 (optional hook)
        """Inverse of :meth:`state_dict`."""
