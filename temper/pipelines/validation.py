"""Validation: generate on the held-out prompts with ``rollout.val`` sampling and score.

Sampling follows ``rollout.val`` (greedy by default; verl's ``val_kwargs``). Metrics are
``val/reward_mean`` overall and ``val/<data_source>/reward_mean`` per source, because a
mixed validation set hides a regression on one task behind gains on another. The first
``log_val_generations`` samples are printed (and go to the trackers that take text);
``validation_data_dir`` gets every generation as ``<step>.jsonl``.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from temper.data.batch import Batch
from temper.pipelines.dumps import dump_generations, generation_rows


def validate(run) -> dict[str, float]:  # run: temper.pipelines.setup.Run
    """``val/reward_mean`` and ``val/<data_source>/reward_mean`` over the validation set."""
    if run.val_data is None:
        return {}
    cfg = run.cfg
    scores: list[float] = []
    by_source: dict[str, list[float]] = defaultdict(list)
    lengths: list[float] = []
    rows: list[dict] = []
    shown = 0
    for prompts in run.val_data.eval_batches(cfg.data.val_batch_size, cfg.data.validation_shuffle):
        prompts.meta["temperature"] = run.val_sampling.temperature
        batch = run.rollout.generate(prompts, run.val_sampling)
        batch, _ = run.rewards.score(batch, prefix="val")
        values = batch["scores"].tolist()
        scores.extend(values)
        lengths.extend(batch["response_mask"].sum(-1).float().tolist())
        for source, value in zip(batch["data_source"], values):
            by_source[str(source)].append(value)
        shown = _log_generations(run, batch, shown, cfg.experiment.log_val_generations)
        if cfg.experiment.validation_data_dir:
            rows.extend(generation_rows(batch, run.step))
    if cfg.experiment.validation_data_dir:
        dump_generations(cfg.experiment.validation_data_dir, run.step, rows)
    metrics = {
        "val/reward_mean": float(np.mean(scores)) if scores else 0.0,
        "val/response_length_mean": float(np.mean(lengths)) if lengths else 0.0,
    }
    for source, values in sorted(by_source.items()):
        metrics[f"val/{source}/reward_mean"] = float(np.mean(values))
    return metrics


def _log_generations(run, batch: Batch, shown: int, limit: int) -> int:
    """Print up to ``limit`` generations in all, and send them to the text trackers."""
    for i in range(len(batch)):
        if shown >= limit:
            break
        text = (
            f"prompt: {batch['prompt_text'][i]!r}\n"
            f"response: {batch['response_text'][i]!r}\nscore: {float(batch['scores'][i]):.3f}"
        )
        print(f"[val step {run.step} #{shown}] " + text.replace("\n", "\n    "), flush=True)
        run.tracker.log_text(f"val/generations/{shown}", text, run.step)
        shown += 1
    return shown
