"""The RLVR pipeline's producer: prompts → ``n`` responses → verifiable rewards.

One round draws ``data.gen_batch_size`` prompts (default ``train_batch_size``) from the
resumable sampler, generates ``rollout.n`` responses each (through verl's multi-turn
tool loop when ``rollout.multi_turn.enable``) and scores them with the reward functions
or the reward model; ReMax adds the greedy response's reward as the baseline, GDPO the
reward function's named components (``algorithm.gdpo_reward_keys``). With
``algorithm.filter_groups`` rounds repeat until the batch is full of groups with signal
(:mod:`temper.pipelines.dynamic_sampling`). Everything after the scored batch is the
driver's (:mod:`temper.pipelines.driver`).

Validation generates on the held-out prompts with ``rollout.val`` sampling (greedy by
default; verl's ``val_kwargs``) and reports ``val/reward_mean`` overall and
``val/<data_source>/reward_mean`` per source — a mixed validation set hides a regression
on one task behind gains on another; ``validation_data_dir`` gets every generation.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict
from typing import Any

import numpy as np
import torch

from temper.algorithms import estimator_inputs
from temper.cluster.reward import run_reward_model
from temper.config.errors import ConfigError
from temper.config.plan import REWARD_MODEL, RL_PARTS
from temper.config.schema import TemperConfig
from temper.data import Batch, PromptDataset, build_datasets, build_sampler, next_prompt_batch
from temper.pipelines.dumps import dump_generations, generation_rows
from temper.pipelines.dynamic_sampling import fill_groups
from temper.pipelines.preflight_data import check_prompt_data
from temper.pipelines.producer import ProducerContext, Validation
from temper.pipelines.record import Pipeline
from temper.pipelines.timing import Timer
from temper.rewards.manager import RewardScorer
from temper.rollout import RolloutEngine
from temper.rollout import sampling_params_from_config as sampling_params
from temper.rollout.partial import PartialGeneration, Segments, generate_in_segments
from temper.rollout.tool_engine import ToolCallingEngine
from temper.training.router_replay import from_rollout


class RLVRProducer:
    """Prompts → responses → rewards, in rounds (see the module docstring)."""

    headline = "val/reward_mean"

    def __init__(self, ctx: ProducerContext) -> None:
        cfg = self.cfg = ctx.cfg
        self.tokenizer = ctx.tokenizer
        train, val = build_datasets(cfg, ctx.tokenizer)
        self.val_data: PromptDataset | None = val
        if train is None:  # val_only without training data: validation is all there is
            self.train_data, self.sampler, self.total_steps = None, None, 0
        else:
            self.train_data, self.sampler = train, build_sampler(cfg, len(train), train.tags)
            epochs = cfg.experiment.total_epochs * self.sampler.batches_per_epoch
            self.total_steps = cfg.experiment.max_steps or epochs
        self.engine: RolloutEngine = ctx.engine
        # streaming's partial rollout: the one segment loop over the engine's responses
        self.generate_partial: PartialGeneration = functools.partial(
            generate_in_segments, ctx.engine
        )
        if cfg.rollout.multi_turn.enable:  # verl multi_turn: tool calls inside each response
            from temper.pipelines.agentic_rollout import rlvr_tool_engine

            tool_engine = rlvr_tool_engine(ctx.engine, cfg, ctx.tokenizer)
            self.engine, self.generate_partial = tool_engine, tool_engine.generate_partial
        self.scorer = RewardScorer.from_config(
            cfg,
            device=ctx.device,
            judge=ctx.judge,
            reward_model=run_reward_model(cfg, ctx.device, ctx.reward_model),
        )
        self.train_sampling = sampling_params(cfg.rollout, validation=False)
        # R3: the update replays the routing the rollout chose for the trained samples
        self.train_sampling.routed_experts = from_rollout(cfg.actor.router_replay)
        self.val_sampling = sampling_params(cfg.rollout, validation=True)
        self.shaping = ctx.shaping
        self.greedy_baseline = "baseline_rewards" in estimator_inputs(cfg.algorithm.adv_estimator)
        self.component_keys = list(cfg.algorithm.gdpo_reward_keys)
        self.progress = 0.0  # step / total steps: rewards may read it (ROLL's detection)

    def _at(self, done: int) -> None:
        """``progress``: ``done`` steps of the total (ROLL's global_step / max_steps)."""
        self.progress = done / self.total_steps if self.total_steps else 0.0

    def produce(self, step: int, timer: Timer) -> tuple[Batch, dict[str, float]]:
        if self.train_data is None:
            raise ConfigError("data.train_files", "no training data given", "set it")
        self._at(step - 1)  # the driver counts the step being made; ROLL counts from 0
        batch, metrics = fill_groups(
            lambda _round: self._round(timer),
            self.cfg.data.train_batch_size,
            self.cfg.algorithm.filter_groups,
            self.shaping,
            self.tokenizer.pad_token_id or 0,
        )
        metrics.update(self.train_data.metrics())
        return batch, metrics

    def _round(self, timer: Timer) -> tuple[Batch, dict[str, float]]:
        """One generation round: the next prompts, their responses and rewards."""
        return self.generate_groups(self._draw(), timer)

    def _draw(self) -> Batch:
        assert self.train_data is not None and self.sampler is not None
        prompts = next_prompt_batch(self.train_data, self.sampler)
        prompts.meta["temperature"] = self.cfg.rollout.temperature
        return prompts

    # -- the group producer protocol (async_training.mode: streaming) -------------------

    def draw_prompts(self, step: int) -> tuple[Batch, dict[str, float]]:
        """The next batch of prompts, for the step the trainer is at; and the data metrics."""
        if self.train_data is None:
            raise ConfigError("data.train_files", "no training data given", "set it")
        self._at(step - 1)
        return self._draw(), self.train_data.metrics()

    def generate_groups(
        self, prompts: Batch, timer: Timer, segments: Segments | None = None
    ) -> tuple[Batch, dict[str, float]]:
        """``prompts``' groups of ``rollout.n`` scored responses, and the round's metrics;
        with ``segments``, a partial rollout (:mod:`temper.rollout.partial`)."""
        with timer("rollout"):
            if segments is None:
                batch = self.engine.generate(prompts, self.train_sampling)
            else:
                pad = self.tokenizer.pad_token_id or 0
                batch = self.generate_partial(prompts, self.train_sampling, segments, pad)
        with timer("reward"):
            batch, metrics = self._score(batch)
            if isinstance(self.engine, ToolCallingEngine):  # tool and interaction metrics
                metrics.update(self.engine.metrics)
            if self.component_keys:
                batch["reward_components"] = reward_components(batch, self.component_keys)
            if self.greedy_baseline:
                batch["baseline_scores"] = self._greedy_baseline(prompts, batch["uid"])
        return batch, metrics

    def _score(self, batch: Batch, prefix: str = "train") -> tuple[Batch, dict[str, float]]:
        batch.meta["progress"] = self.progress
        out = self.scorer.score_batch(batch, self.tokenizer, prefix=prefix)
        batch["scores"] = out.scores
        return batch, dict(out.metrics)

    def _greedy_baseline(self, prompts: Batch, uids: list[str]) -> torch.Tensor:
        """ReMax's baseline: the reward of each prompt's greedy response, per sample row."""
        greedy = dataclasses.replace(
            self.train_sampling, n=1, do_sample=False, temperature=0.0, routed_experts=False
        )
        scored, _ = self._score(self.engine.generate(prompts, greedy), prefix="baseline")
        by_uid = dict(zip(scored["uid"], scored["scores"].tolist()))
        return torch.tensor([by_uid[u] for u in uids], dtype=torch.float32)

    def validate(self, step: int) -> Validation:
        """``val/reward_mean`` and ``val/<data_source>/reward_mean`` (module docstring)."""
        if self.val_data is None:
            return Validation({})
        self._at(step)
        cfg = self.cfg
        scores: list[float] = []
        by_source: dict[str, list[float]] = defaultdict(list)
        lengths: list[float] = []
        rows: list[dict[str, Any]] = []
        samples: list[str] = []
        size, shuffle = cfg.data.val_batch_size, cfg.data.validation_shuffle
        for prompts in self.val_data.eval_batches(size, shuffle):
            prompts.meta["temperature"] = self.val_sampling.temperature
            batch, _ = self._score(self.engine.generate(prompts, self.val_sampling), "val")
            values = batch["scores"].tolist()
            scores.extend(values)
            lengths.extend(batch["response_mask"].sum(-1).float().tolist())
            for source, value in zip(batch["data_source"], values):
                by_source[str(source)].append(value)
            for i in range(min(len(batch), cfg.experiment.log_val_generations - len(samples))):
                samples.append(
                    f"prompt: {batch['prompt_text'][i]!r}\nresponse: "
                    f"{batch['response_text'][i]!r}\nscore: {float(batch['scores'][i]):.3f}"
                )
            rows.extend(generation_rows(batch, step))
        if cfg.experiment.validation_data_dir:
            dump_generations(cfg.experiment.validation_data_dir, step, rows)
        metrics = {
            "val/reward_mean": float(np.mean(scores)) if scores else 0.0,
            "val/response_length_mean": float(np.mean(lengths)) if lengths else 0.0,
        }
        for source, values in sorted(by_source.items()):
            metrics[f"val/{source}/reward_mean"] = float(np.mean(values))
        return Validation(metrics, samples, rows)

    def dump_rows(self, batch: Batch, step: int) -> list[dict[str, Any]]:
        return generation_rows(batch, step)

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict() if self.sampler is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.sampler is not None and state.get("sampler") is not None:
            self.sampler.load_state_dict(state["sampler"])

    def close(self) -> None:
        self.scorer.close()


def reward_components(batch: Batch, keys: list[str]) -> torch.Tensor:
    """``(B, K)``: the reward function's extra fields ``keys`` of every sample (from the
    scorer's ``reward_extra_info``). A sample whose reward call failed has its score
    (``reward.failure_score``) in every component; a successful call that lacks a key,
    or gives a value that is not a finite number, stops the step with the fields it
    did return."""
    out = torch.zeros(len(batch), len(keys), dtype=torch.float32)
    scores = batch["scores"].tolist()
    sources = batch.objects.get("data_source") or ["unknown"] * len(batch)
    for i, extra in enumerate(batch["reward_extra_info"]):
        if extra.get("reward_failure"):
            out[i] = scores[i]
            continue
        for k, key in enumerate(keys):
            value = extra.get(key)
            number = float(value) if isinstance(value, (int, float)) else float("nan")
            if not np.isfinite(number):
                fields = sorted(f for f in extra if f != "reward_failure")
                raise ConfigError(
                    "algorithm.gdpo_reward_keys",
                    f"the reward function gave {key}={value!r} for sample {i} (data_source "
                    f"{sources[i]!r}); its fields beside 'score' are {fields}",
                    "return a finite number for every key, or name only the fields it returns",
                )
            out[i, k] = number
    return out


def check(cfg: TemperConfig) -> None:
    """What the RLVR pipeline cannot honour (``ConfigError``; the driver's own checks are
    in :mod:`temper.pipelines.checks`)."""
    if not cfg.data.train_files and not cfg.experiment.val_only:
        raise ConfigError(
            "data.train_files", "no training data given", "set data.train_files to a file or list"
        )
    if cfg.experiment.render_save_dir:
        raise ConfigError(
            "experiment.render_save_dir",
            "renders environment episodes; the rlvr pipeline has no environments",
            "remove experiment.render_save_dir (environments are played, and rendered, by an "
            "agentic config: agentic.train_env_manager)",
        )


PIPELINE = Pipeline(
    build=RLVRProducer,
    uses=RL_PARTS | {REWARD_MODEL},  # the producer scores with reward.model
    check=check,
    preflight=check_prompt_data,
    provides=frozenset({"baseline_rewards", "reward_components"}),
    sections=frozenset({"distill", "async_training"}),  # distill: teachers score the samples
    streams=True,
    routing=True,
)
