"""What a pipeline contributes to the one training loop: a producer, its validation,
and the record (:class:`Pipeline`) that declares what the pipeline needs.

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

from temper.config.derive import prompt_groups
from temper.config.plan import StepShape
from temper.config.schema import TemperConfig
from temper.data.batch import Batch
from temper.pipelines.shaping import ShapingSettings
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
    shaping: ShapingSettings  # the run's reward shaping (dynamic sampling reads it)
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


def no_check(cfg: TemperConfig) -> None:
    """A pipeline that refuses no combination of its own."""


def no_preflight(cfg: TemperConfig, notes: list[str]) -> None:
    """A pipeline that reads no files of its own before the run."""


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """A pipeline: its producer factory and everything the run needs to know of it.

    One record per pipeline, registered by name in :data:`temper.pipelines.registry.PIPELINES`
    or named by the config as a dotted path (``pipeline: my_pkg.my_mod:MY_PIPELINE``):

    - ``build(ctx)``: the producer (:class:`Producer`) of a run;
    - ``check(cfg)``: a ``ConfigError`` for a combination the pipeline cannot honour (runs
      in ``temper check``, inside the one translation into the user's dialect);
    - ``preflight(cfg, notes)``: what it reads on this machine before a run (data files,
      environments), a ``ConfigError`` for the first problem, notes for what it settled;
    - ``step_shape(cfg)``: samples per step, and how ``temper check`` explains them;
    - ``shaping(cfg)``: the run's reward-shaping settings (once per run);
    - ``sections``: the config sections only this pipeline reads (``agentic``): set under
      another pipeline, they are refused rather than ignored;
    - ``provides``: the advantage estimators' inputs (``AdvantageInputs`` field names) its
      producer puts in the batch beyond what the driver computes (a critic's ``values``,
      ``old_log_probs``): RLVR adds ``baseline_rewards`` and ``reward_components``. An
      estimator that needs an input nothing provides is refused at ``temper check``;
    - ``multi_turn``: its samples are multi-turn episodes, whose length
      ``rollout.max_model_len`` bounds (not ``max_prompt_length + response_length``: the
      pre-flight compares the one that applies with the model's context).
    """

    build: Callable[[ProducerContext], Producer]
    check: Callable[[TemperConfig], None] = no_check
    preflight: Callable[[TemperConfig, list[str]], None] = no_preflight
    step_shape: Callable[[TemperConfig], StepShape] = prompt_groups
    shaping: Callable[[TemperConfig], ShapingSettings] = ShapingSettings.from_config
    sections: frozenset[str] = frozenset()
    provides: frozenset[str] = frozenset()
    multi_turn: bool = False
