"""Evaluating a policy on the validation set: the ``rlvr_rollout`` pipeline (``temper eval``
on a ROLL RLVR file; ROLL's ``RLVRRolloutPipeline``, ``start_rlvr_rollout_pipeline.py``).

No training: the RLVR pipeline's own validation step
(:meth:`temper.pipelines.rlvr.RLVRProducer.validate`) runs once, at step 0, with the
policy of ``model.path`` — the prompts of ``data.val_files`` built as RL prompts are,
``rollout.val`` sampling on the rollout engine ``rollout.engine`` names, scored by the
run's rewards (routes by tag, reward functions, the LLM judge) in the reward workers.

Reported to the trackers in ``experiment.output_dir`` (``metrics.jsonl`` always) and to
stdout, as ROLL names them (:func:`correct_metrics`): ``val_correct/all/mean`` and
``val_correct/<tag>/mean`` per tag (the data source: ROLL rows' ``tag``), beside the
validation's ``val/reward_mean``, ``val/<source>/reward_mean`` and ``time/step_generate``;
the first ``experiment.log_val_generations`` samples are printed. Every scored response
goes to ``<output_dir>/rollout_scores.jsonl`` (prompt, response, data source, ground
truth, response length, score).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from temper.config.dialects.roll.rlvr_rollout import (
    EXPERIMENT_READS,
    RESOURCE_READS,
    SECTIONS,
    UNREAD,
)
from temper.config.errors import ConfigError
from temper.config.plan import NO_TRAINING, REWARD_MODEL, ROLLOUT, StepShape
from temper.config.schema import TemperConfig
from temper.pipelines.preflight import writable
from temper.pipelines.preflight_data import check_prompt_data
from temper.pipelines.record import Pipeline, no_producer
from temper.pipelines.unread import refuse_run_keys, refuse_unread

#: The file of scored responses, in ``experiment.output_dir``.
SCORES_FILE = "rollout_scores.jsonl"
#: The experiment and resources keys a validation rollout reads (the rest: refused).
READS = {"experiment": EXPERIMENT_READS, "resources": RESOURCE_READS}


def correct_metrics(scores: Sequence[float], tags: Sequence[str]) -> dict[str, float]:
    """ROLL's validation accuracy: the fraction of samples whose score is exactly 1,
    ``val_correct/all/mean = |{i: s_i = 1}| / N`` over all samples, and
    ``val_correct/<tag>/mean`` the same over the samples of each tag."""
    groups: dict[str, list[float]] = defaultdict(list)
    for score, tag in zip(scores, tags, strict=True):
        groups[str(tag)].append(score)
    out: dict[str, float] = {}
    for name, values in [("all", list(scores)), *sorted(groups.items())]:
        if values:
            out[f"val_correct/{name}/mean"] = sum(v == 1 for v in values) / len(values)
    return out


def rollout(cfg: TemperConfig) -> dict[str, Any]:
    """Generate and score the validation set once (module docstring); the summary."""
    import torch

    from temper.cluster.generation import build_generation_engine
    from temper.cluster.judge import build_judge
    from temper.cluster.placement import worker_device
    from temper.data.row_files import write_rows
    from temper.pipelines.demand import demand_of
    from temper.pipelines.producer import ProducerContext
    from temper.pipelines.rlvr import RLVRProducer
    from temper.pipelines.run import load_tokenizer, output_dir, seed_everything
    from temper.pipelines.shaping import ShapingSettings
    from temper.tracking import build_trackers
    from temper.training.models import import_external_lib

    exp = cfg.experiment
    start = time.perf_counter()
    seed_everything(exp.seed)
    import_external_lib(cfg.model.external_lib)  # it may register the architecture
    out_dir = output_dir(cfg)
    tokenizer = load_tokenizer(cfg)
    device = worker_device(cfg)
    engine = build_generation_engine(cfg, tokenizer, demand_of(cfg))
    judge = producer = None
    tracker = build_trackers(
        exp.trackers,
        out_dir,
        total_steps=0,
        kwargs=exp.tracker_kwargs,
        project=exp.project_name,
        name=exp.experiment_name,
    )
    try:
        judge = build_judge(cfg, device, None)
        context = ProducerContext(
            cfg, tokenizer, engine, torch.device(device), out_dir,
            ShapingSettings.from_config(cfg), judge=judge,
        )  # fmt: skip
        producer = RLVRProducer(context)
        begin = time.perf_counter()
        result = producer.validate(0)
        seconds = time.perf_counter() - begin
        rows = result.rows
        metrics = {
            **correct_metrics([r["score"] for r in rows], [r["data_source"] for r in rows]),
            **result.metrics,
            "time/step_generate": seconds,
        }
        tracker.log(metrics, 0)
        for k, text in enumerate(result.samples):
            print(f"[val step 0 #{k}] " + text.replace("\n", "\n    "), flush=True)
            tracker.log_text(f"val/generations/{k}", text, 0)
        path = write_rows(rows, out_dir / SCORES_FILE)
    finally:
        tracker.close()
        if producer is not None:
            producer.close()
        engine.close()
        if judge is not None:
            judge.close()
    for name, value in metrics.items():
        if name.startswith("val_correct/"):
            print(f"{name}: {value:.4f}", flush=True)
    print(
        f"scored {len(rows)} responses in {seconds:.1f}s: {path} (metrics: "
        f"{out_dir / 'metrics.jsonl'})",
        flush=True,
    )
    return {
        "metrics": metrics,
        "output_path": str(path),
        "responses": len(rows),
        "seconds": time.perf_counter() - start,
    }


def check(cfg: TemperConfig) -> None:
    """Keys a validation rollout reads nothing of are refused with why; it needs
    validation prompts."""
    refuse_unread(cfg, "rlvr_rollout", SECTIONS, UNREAD)
    refuse_run_keys(
        cfg,
        "rlvr_rollout",
        "a validation rollout generates and scores once from the rollout's engines (no "
        "steps, checkpoints or training roles to place)",
        READS,
    )
    if not cfg.data.val_files:
        raise ConfigError(
            "data.val_files",
            "a validation rollout generates over the validation prompts, and none are given",
            "set data.val_files",
        )


def preflight(cfg: TemperConfig, notes: list[str]) -> None:
    """The validation files hold the prompt column and resolve a reward for every tag;
    the output directory can be written."""
    from temper.pipelines.run import output_dir

    check_prompt_data(cfg, notes)
    writable(output_dir(cfg), "experiment.output_dir")


def validation_prompts(cfg: TemperConfig) -> StepShape:
    """One pass over ``data.val_files``, ``rollout.val.n`` responses to each prompt."""
    n = cfg.rollout.val.n
    return StepShape(
        samples=n,
        rows=(
            ("prompts", "all", "data.val_files"),
            ("responses per prompt", str(n), "rollout.val.n"),
        ),
    )


PIPELINE = Pipeline(
    build=no_producer,
    uses=frozenset({ROLLOUT, NO_TRAINING, REWARD_MODEL}),
    check=check,
    preflight=preflight,
    step_shape=validation_prompts,
    command="eval",
    main=rollout,
    checks=frozenset({"engines", "models", "model_files", "rewards", "trackers", "pipeline"}),
)
