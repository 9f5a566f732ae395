"""A pipeline as the run sees it: one record (:class:`Pipeline`) per pipeline.

The run around a step — resume, signals, validation cadence, checkpoints, tracking, the
closing summary — is the driver's, the same for every pipeline
(:func:`temper.pipelines.driver.train`). The record says what differs: which step runs
(RL's by default, :func:`~temper.pipelines.rl_step.rl_step`; SFT brings its own), what
produces the step's batch, which optional parts of a run the step uses, which metric is
the run's curve, and the checks of its config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from temper.config.derive import prompt_groups
from temper.config.errors import ConfigError
from temper.config.plan import RL_PARTS, StepShape
from temper.config.schema import TemperConfig
from temper.pipelines.producer import Producer, ProducerContext
from temper.pipelines.rl_step import rl_step
from temper.pipelines.run import Run
from temper.pipelines.shaping import ShapingSettings

#: The tokens one sample may reach, the keys that set that bound, and what a sample is
#: (None: nothing bounds a sample here); the pre-flight compares it with the model's context.
Context = tuple[int, tuple[str, ...], str] | None


def no_check(cfg: TemperConfig) -> None:
    """A pipeline that refuses no combination of its own."""


def no_producer(ctx: ProducerContext) -> Producer:
    """The producer of a pipeline that runs under its own command (``main``): none —
    ``run_pipeline`` sends such a config to that command before the driver's loop would
    ask for one."""
    raise ConfigError(
        "pipeline",
        f"pipeline {ctx.cfg.pipeline} is not a training run: the training loop has no "
        "producer for it",
        "run it with its own command (temper generate, temper eval)",
    )


def provides_nothing_more(cfg: TemperConfig) -> frozenset[str]:
    """A pipeline whose producer's inputs do not depend on its config."""
    return frozenset()


def no_preflight(cfg: TemperConfig, notes: list[str]) -> None:
    """A pipeline that reads no files of its own before the run."""


def prompt_and_response(cfg: TemperConfig, notes: list[str]) -> Context:
    """A generated sample's length: ``max_prompt_length + response_length`` (or a longer
    ``rollout.max_model_len``); with verl's multi-turn tool calls, ``max_model_len`` only."""
    rollout = cfg.rollout
    if rollout.multi_turn.enable:
        return episode_length(cfg, notes)
    seq = cfg.data.max_prompt_length + rollout.response_length
    if rollout.max_model_len is not None and rollout.max_model_len > seq:
        return (rollout.max_model_len, ("rollout.max_model_len",), "a sequence")
    return (seq, ("data.max_prompt_length", "rollout.response_length"), "a prompt and its response")


def episode_length(cfg: TemperConfig, notes: list[str]) -> Context:
    """A multi-turn episode's turns are bounded by ``rollout.max_model_len`` only."""
    if cfg.rollout.max_model_len is not None:
        return (cfg.rollout.max_model_len, ("rollout.max_model_len",), "an episode")
    notes.append(
        "rollout.max_model_len is not set: a multi-turn episode is bounded by its turns "
        "only, not by the model's context"
    )
    return None


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """A pipeline: its producer factory, its step, and everything the run needs to know.

    One record per pipeline, registered by name in :data:`temper.pipelines.registry.PIPELINES`
    or named by the config as a dotted path (``pipeline: my_pkg.my_mod:MY_PIPELINE``):

    - ``build(ctx)``: the producer (:class:`~temper.pipelines.producer.Producer`) of a run;
    - ``step(run)``: one training step of the run, returning its metrics (default: the RL
      step — produce, log-probs, shaping, updates, weight sync); the driver's one loop
      calls it between resume and checkpoint;
    - ``uses``: the optional parts of a run the step uses (``temper.config.plan``:
      ``rollout``, ``reference``, ``critic``, default all three; ``reward_model``: the
      producer scores with ``reward.model``): the plan places and the run builds only
      these — an SFT run has no rollout engine, reference or critic;
    - ``curve``: the per-step metric that is the run's curve (the summary's first → last
      line): ``train/score_mean`` for RL;
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
      ``provides_for(cfg)``: the inputs that depend on the config (the agentic pipeline's
      env manager: step samples give ``gigpo``'s anchor states);
    - ``context(cfg, notes)``: the tokens one sample may reach (:data:`Context`): a prompt
      and its response by default, an episode's ``rollout.max_model_len`` for multi-turn
      episodes; the pre-flight compares it with the model's context;
    - ``command`` and ``main(cfg)``: a pipeline that is no training loop (``generate``,
      ``eval``) runs whole in ``main`` under its own CLI command (``temper generate``),
      which is the only one that runs it; ``train`` runs the driver's loop (``main`` None);
    - ``routing``: its producer asks the rollout engine for each token's MoE routing
      under router replay R3 (``SamplingParams.routed_experts``) and keeps it with the
      samples, so R3 applies;
    - ``streams``: its producer is a :class:`~temper.pipelines.producer.GroupProducer`
      (its step shape's groups generated a chunk at a time):
      ``async_training.mode: streaming`` applies;
    - ``checks``: the driver's pre-flight groups (:data:`temper.pipelines.preflight.CHECKS`)
      that apply (None: all); a pipeline that writes one file has no run directory.
    """

    build: Callable[[ProducerContext], Producer]
    step: Callable[[Run], dict[str, float]] = rl_step
    uses: frozenset[str] = RL_PARTS
    curve: str = "train/score_mean"
    check: Callable[[TemperConfig], None] = no_check
    preflight: Callable[[TemperConfig, list[str]], None] = no_preflight
    step_shape: Callable[[TemperConfig], StepShape] = prompt_groups
    shaping: Callable[[TemperConfig], ShapingSettings] = ShapingSettings.from_config
    sections: frozenset[str] = frozenset()
    provides: frozenset[str] = frozenset()
    provides_for: Callable[[TemperConfig], frozenset[str]] = provides_nothing_more
    context: Callable[[TemperConfig, list[str]], Context] = prompt_and_response
    command: str = "train"
    main: Callable[[TemperConfig], dict[str, Any]] | None = None
    checks: frozenset[str] | None = None
    streams: bool = False
    routing: bool = False
