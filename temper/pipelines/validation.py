"""Validation: generate on the held-out prompts with ``rollout.val`` sampling and score."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from temper.data.batch import Batch


def validate(run) -> dict[str, float]:  # run: temper.pipelines.setup.Run
    """``val/reward_mean`` and ``val/<data_source>/reward_mean`` over the validation set."""
    if run.val_data is None:
        return {}
    cfg = run.cfg
    scores: list[float] = []
    by_source: dict[str, list[float]] = defaultdict(list)
    lengths: list[float] = []
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
        shown = _log_generations(batch, shown, cfg.experiment.log_val_generations)
    metrics = {
        "val/reward_mean": float(np.mean(scores)) if scores else 0.0,
        "val/response_length_mean": float(np.mean(lengths)) if lengths else 0.0,
    }
    for source, values in sorted(by_source.items()):
        metrics[f"val/{source}/reward_mean"] = float(np.mean(values))
    return metrics


def _log_generations(batch: Batch, shown: int, limit: int) -> int:
    for i in range(len(batch)):
        if shown >= limit:
            break
        print(
            f"[val {shown}] prompt: {batch['prompt_text'][i]!r}\n"
            f"          response: {batch['response_text'][i]!r}  score={batch['scores'][i]:.3f}"
        )
        shown += 1
    return shown
