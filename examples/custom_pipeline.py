"""A pipeline from your own code: GRPO on an arithmetic curriculum that adapts to the policy.

The built-in ``rlvr`` pipeline draws prompts from a fixed dataset. This one generates
them each step and raises the difficulty (more digits per operand) once the policy
answers most of the current level right — a curriculum no data file can express. It is
a producer (``temper.pipelines.producer.Producer``): it turns step ``N`` into a scored
batch, and temper's one training loop does everything after that (log-probs,
advantages, the update, weight sync, checkpoints, validation, tracking).

It reuses temper's parts instead of rewriting them: the rollout engine it is handed
(``hf`` or ``vllm``), the chat template, and the reward functions of ``reward.*`` (here
``arithmetic``), so every key it reads is a temper key and its ``check`` refuses the
ones it would ignore. Its state — the level and the recent accuracies — is in
``state_dict``, so a resumed run continues the same curriculum exactly.

Run it from the repository root (the path in ``pipeline:`` is relative to it)::

    temper train examples/custom_pipeline.yaml
"""

from __future__ import annotations

import random
from collections import deque
from typing import Any

import numpy as np

from temper.config.errors import ConfigError
from temper.config.schema import TemperConfig
from temper.data import Batch, PromptExample, collate_prompts
from temper.data.prompts import PromptFields, render, tokenize
from temper.pipelines import Pipeline, ProducerContext, Validation
from temper.pipelines.dumps import generation_rows
from temper.pipelines.timing import Timer
from temper.rewards.manager import RewardScorer
from temper.rollout import sampling_params_from_config

MAX_LEVEL = 3  # operands of up to 3 digits
PROMOTE_AT = 0.8  # mean accuracy over the last WINDOW steps that moves to the next level
WINDOW = 4
VAL_PER_LEVEL = 8


class CurriculumProducer:
    """Prompts of the current level → ``rollout.n`` responses each → arithmetic rewards."""

    headline = "val/accuracy"

    def __init__(self, ctx: ProducerContext) -> None:
        cfg = self.cfg = ctx.cfg
        assert cfg.experiment.max_steps is not None  # check() refuses a run without it
        self.total_steps = cfg.experiment.max_steps
        self.tokenizer = ctx.tokenizer
        self.rollout = ctx.engine
        self.scorer = RewardScorer.from_config(cfg, device=ctx.device, judge=ctx.judge)
        self.train_sampling = sampling_params_from_config(cfg.rollout, validation=False)
        self.val_sampling = sampling_params_from_config(cfg.rollout, validation=True)
        self.level = 1
        self.recent: deque[float] = deque(maxlen=WINDOW)

    # ------------------------------------------------------------------ prompts

    def _problems(self, rng: random.Random, level: int, count: int) -> list[tuple[str, int]]:
        top = 10**level - 1
        out = []
        for _ in range(count):
            a, b = rng.randint(0, top), rng.randint(0, top)
            op = rng.choice("+-")
            answer = a + b if op == "+" else a - b
            out.append((f"What is {a} {op} {b}? Answer with the number only.", answer))
        return out

    def _prompts(self, problems: list[tuple[str, int]], level: int, step: int) -> Batch:
        """Templated as temper templates dataset prompts (``data.chat_template``,
        ``data.system_prompt``); the questions are short, so nothing is truncated."""
        examples = []
        for question, answer in problems:
            fields = PromptFields(
                messages=[{"role": "user", "content": question}],
                text=None,
                ground_truth=str(answer),
                data_source="arithmetic",
                tag=f"level{level}",
                extra_info={"level": level},
            )
            text, messages = render(fields, self.cfg.data, self.tokenizer)
            (ids,) = tokenize(self.tokenizer, [text], raw=self.cfg.data.chat_template == "raw")
            if len(ids) > self.cfg.data.max_prompt_length:
                raise ConfigError(
                    "data.max_prompt_length",
                    f"a curriculum prompt has {len(ids)} tokens (system prompt included)",
                    f"raise it to ≥ {len(ids)} or shorten data.system_prompt",
                )
            examples.append(
                PromptExample(
                    prompt_ids=tuple(ids),
                    prompt_text=text,
                    raw_prompt=messages,
                    data_source=fields.data_source,
                    tag=fields.tag,
                    ground_truth=fields.ground_truth,
                    extra_info=fields.extra_info,
                    source=f"curriculum step {step}",
                )
            )
        uids = [f"{step}-{i}" for i in range(len(examples))]
        return collate_prompts(examples, uids, self.tokenizer.pad_token_id or 0)

    # ------------------------------------------------------------------ the producer

    def produce(self, step: int, timer: Timer) -> tuple[Batch, dict[str, float]]:
        # seeded by (run seed, step): a resumed run draws the same problems
        rng = random.Random(self.cfg.experiment.seed * 1_000_003 + step)
        problems = self._problems(rng, self.level, self.cfg.data.train_batch_size)
        prompts = self._prompts(problems, self.level, step)
        prompts.meta["temperature"] = self.cfg.rollout.temperature
        with timer("rollout"):
            batch = self.rollout.generate(prompts, self.train_sampling)
        with timer("reward"):
            scored = self.scorer.score_batch(batch, self.tokenizer, prefix="train")
        batch["scores"] = scored.scores
        accuracy = float(scored.scores.float().mean())
        metrics = {**scored.metrics, "curriculum/level": float(self.level)}
        self.recent.append(accuracy)
        if len(self.recent) == WINDOW and np.mean(self.recent) >= PROMOTE_AT:
            self.level = min(MAX_LEVEL, self.level + 1)
            self.recent.clear()
        return batch, metrics

    def validate(self, step: int) -> Validation:
        """Accuracy on fixed held-out problems of every level (greedy by default)."""
        rng = random.Random(-1 - self.cfg.experiment.seed)  # never a training draw
        metrics: dict[str, float] = {}
        samples: list[str] = []
        accuracies = []
        for level in range(1, MAX_LEVEL + 1):
            prompts = self._prompts(self._problems(rng, level, VAL_PER_LEVEL), level, -1)
            prompts.meta["temperature"] = self.val_sampling.temperature
            batch = self.rollout.generate(prompts, self.val_sampling)
            scores = self.scorer.score_batch(batch, self.tokenizer, prefix="val").scores
            metrics[f"val/level{level}/accuracy"] = float(scores.float().mean())
            accuracies.append(metrics[f"val/level{level}/accuracy"])
            question, answer = batch["prompt_text"][0], batch["response_text"][0]
            samples.append(f"level {level}: {question!r} -> {answer!r}")
        metrics["val/accuracy"] = float(np.mean(accuracies))
        return Validation(metrics, samples[: self.cfg.experiment.log_val_generations])

    def dump_rows(self, batch: Batch, step: int) -> list[dict[str, Any]]:
        return generation_rows(batch, step)

    def state_dict(self) -> dict[str, Any]:
        return {"level": self.level, "recent": list(self.recent)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.level = int(state["level"])
        self.recent = deque((float(a) for a in state["recent"]), maxlen=WINDOW)

    def close(self) -> None:
        self.scorer.close()


def check(cfg: TemperConfig) -> None:
    """What this pipeline cannot honour: it generates its own prompts, so data files would
    be read by nothing, and it has no epochs."""
    if cfg.experiment.max_steps is None:
        raise ConfigError(
            "experiment.max_steps", "the curriculum has no epochs (it has no dataset)", "set it"
        )
    for key, files in (("train_files", cfg.data.train_files), ("val_files", cfg.data.val_files)):
        if files:
            raise ConfigError(
                f"data.{key}",
                "the curriculum pipeline generates its prompts; no data file is read",
                f"remove data.{key}",
            )


def preflight(cfg: TemperConfig, notes: list[str]) -> None:
    """Before any model loads: the longest question of the last level, templated with the
    run's tokenizer (its files only), fits ``data.max_prompt_length``."""
    from temper.pipelines.run import load_tokenizer

    tokenizer = load_tokenizer(cfg)
    top = 10**MAX_LEVEL - 1
    question = f"What is {top} - {top}? Answer with the number only."
    fields = PromptFields([{"role": "user", "content": question}], None, "0", "", "", {})
    text, _ = render(fields, cfg.data, tokenizer)
    (ids,) = tokenize(tokenizer, [text], raw=cfg.data.chat_template == "raw")
    if len(ids) > cfg.data.max_prompt_length:
        raise ConfigError(
            "data.max_prompt_length",
            f"the curriculum's longest prompt has {len(ids)} tokens with this tokenizer and "
            "data.system_prompt",
            f"raise it to ≥ {len(ids)} or shorten data.system_prompt",
        )


CURRICULUM = Pipeline(build=CurriculumProducer, check=check, preflight=preflight)
