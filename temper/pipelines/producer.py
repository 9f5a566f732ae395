"""What a pipeline contributes to the one training loop: a producer and its validation
(the record that declares the rest is :class:`temper.pipelines.record.Pipeline`).

The driver (:mod:`temper.pipelines.driver`) runs the same loop for every pipeline; an
RL pipeline only turns the step's inputs into a *scored* :class:`~temper.data.batch.Batch`
— RLVR: prompts → generations → rewards; agentic: env resets → multi-turn episodes →
trajectories and returns — and validates. (A pipeline with a step of its own — SFT — has
its producer give that step's batch: given prompts and responses, nothing scored.) A produced batch carries the rollout tensors
(``prompt_ids``/``prompt_mask``, ``response_ids``/``response_mask``, optionally
``rollout_log_probs`` and ``attention_mask``), ``scores`` (B,) — the task reward of
each sample (an episode's return) — and the objects ``uid`` (one per group) and
``truncated``; agentic batches add ``turn_rewards``/``turn_ends`` for per-turn rewards.
Everything after that — log-probs, values, shaping, advantages, updates, weight sync,
checkpoints, tracking, the summary — is the driver's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Protocol

import torch

from temper.config.schema import TemperConfig
from temper.data.batch import Batch
from temper.pipelines.shaping import ShapingSettings
from temper.pipelines.timing import Timer
from temper.rewards.judge import JudgeEngine
from temper.rewards.model import RewardModel
from temper.roles.base import Roles
from temper.rollout import RolloutEngine
from temper.rollout.partial import Segments


@dataclasses.dataclass
class ProducerContext:
    """The run's parts a producer is built from (after the roles and the engine)."""

    cfg: TemperConfig
    tokenizer: Any
    # generates with the actor's current weights; None where the pipeline's record does
    # not use a rollout engine (SFT): such a producer reads ``engine`` never
    rollout: RolloutEngine | None
    device: torch.device  # where the actor computes: reward models go there
    out_dir: Path
    shaping: ShapingSettings  # the run's reward shaping (dynamic sampling reads it)
    judge: JudgeEngine | None = None  # the LLM judge (reward function llm_judge), if used
    roles: Roles | None = None  # the run's roles (SFT validates with the actor's forward)
    # the reward model's Ray worker group (temper.cluster.reward), where it has one; else
    # a producer that scores with the reward model builds it in this process
    reward_model: RewardModel | None = None

    @property
    def engine(self) -> RolloutEngine:
        """The rollout engine of a pipeline that generates."""
        if self.rollout is None:
            raise RuntimeError(
                "this run has no rollout engine: its pipeline record's uses lacks 'rollout'"
            )
        return self.rollout


@dataclasses.dataclass
class Validation:
    """A validation's metrics (``val/…``), a few samples as text, for the log, and
    (where the producer scores samples) every scored sample as a row
    (:func:`temper.pipelines.dumps.generation_rows`: prompt, response, data source, score)
    — what ``validation_data_dir`` and the RLVR rollout write."""

    metrics: dict[str, float]
    samples: list[str] = dataclasses.field(default_factory=list)
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)


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


class GroupProducer(Producer, Protocol):
    """A producer whose groups can be generated a few prompts at a time
    (``async_training.mode: streaming``; its pipeline record declares ``streams``)."""

    def draw_prompts(self, step: int) -> tuple[Batch, dict[str, float]]:
        """The next batch of prompts from the resumable sampler (its position is in
        :meth:`state_dict`), drawn while the trainer is at ``step``; and the data metrics."""
        ...

    def generate_groups(
        self, prompts: Batch, timer: Timer, segments: Segments | None = None
    ) -> tuple[Batch, dict[str, float]]:
        """Some of a drawn batch's prompts → their groups of scored responses (one ``uid``
        per prompt, the prompt's), and the producer's metrics; ``segments``: generate them
        as a partial rollout (:func:`temper.rollout.partial.generate_in_segments`; in a
        multi-turn episode every model turn so, its turn boundaries pushing weights too)."""
        ...
