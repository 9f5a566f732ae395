"""What a pipeline contributes to the one training loop: a producer and its validation.

The driver (:mod:`temper.pipelines.driver`) runs the same step for every pipeline; a
pipeline only turns the step's inputs into a *scored* :class:`~temper.data.batch.Batch`
— RLVR: prompts → generations → rewards; agentic: env resets → multi-turn episodes →
trajectories and returns — and validates. A produced batch carries the rollout tensors
(``prompt_ids``/``prompt_mask``, ``response_ids``/``response_mask``, optionally
``rollout_log_probs`` and ``attention_mask``), ``scores`` (B,) — the task reward of
each sample (an episode's return) — and the objects ``uid`` (one per group) and
``truncated``; agentic batches add ``turn_rewards``/``turn_ends`` for per-turn rewards.
Everything after that — log-probs, values, shaping, advantages, updates, weight sync,
checkpoints, tracking, the summary — is the driver's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from temper.config.schema import TemperConfig
from temper.data.batch import Batch
from temper.pipelines.timing import Timer
from temper.rewards.judge import JudgeEngine
from temper.rollout import RolloutEngine


@dataclasses.dataclass
class ProducerContext:
    """The run's parts a producer is built from (after the roles and the engine)."""

    cfg: TemperConfig
    tokenizer: Any
    rollout: RolloutEngine  # generates with the actor's current weights
    device: torch.device  # where the actor computes: reward models go there
    out_dir: Path
    judge: JudgeEngine | None = None  # the LLM judge (reward function llm_judge), if used


@dataclasses.dataclass
class Validation:
    """A validation's metrics (``val/…``) and a few samples as text, for the log."""

    metrics: dict[str, float]
    samples: list[str] = dataclasses.field(default_factory=list)


class Producer(Protocol):
    """A pipeline's producer (see the module docstring).

    Attributes:
        headline: the validation metric the summary reports before → after training.
        total_steps: RL steps of the run (``max_steps``, or epochs over the data).
    """

    headline: str
    total_steps: int

    def produce(self, step: int, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """The scored batch of RL step ``step`` (1-based) and the producer's metrics;
        ``timer`` takes the producer's phases (``rollout``, ``reward``)."""
        ...

    def validate(self, step: int) -> Validation:
        """Validate the current policy (held-out prompts or env seeds)."""
        ...

    def dump_rows(self, batch: Batch, step: int) -> list[dict[str, Any]]:
        """``rollout_data_dir`` rows of a shaped training batch (one per sample)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to produce exactly the batches an uninterrupted run
        would (sampler position, env-manager seeds)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        ...

    def close(self) -> None:
        """Release what the producer holds (reward workers, environments)."""
        ...


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """A ``pipeline:`` name's producer factory and its validation.

    ``check(cfg)`` raises ``ConfigError`` for what the pipeline cannot honour; it runs
    in ``temper check`` and before ``temper train`` loads anything.
    """

    build: Callable[[ProducerContext], Producer]
    check: Callable[[TemperConfig], None]
