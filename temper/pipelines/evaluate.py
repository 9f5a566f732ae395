"""Scoring a file of responses: the ``eval`` pipeline (``temper eval``; verl's ``main_eval``).

Every response of every row of ``evaluate.files`` (:mod:`temper.data.responses`: a
row's ``evaluate.response_key`` list, its data source, ground truth, extra info and tag)
is scored by the run's reward — the reward registry's functions by data source
(``reward.function: auto``) or by name, ROLL-style routes by tag, a
``custom_reward_function`` file, the LLM judge — in the reward worker processes, with
the deadlines and failure scores of an RL run (:class:`temper.rewards.RewardScorer`).

Reported per data source and over all rows (:func:`source_metrics`): mean@n, the mean
over prompts of their responses' mean score (verl's ``test_score/<data_source>``), and
pass@k for the ``evaluate.k`` (default 1, 2, 4, … up to n), a response passing when its
score reaches ``evaluate.pass_threshold`` (:mod:`temper.algorithms.pass_at_k`: the
unbiased estimator from n samples). Printed as a table; written as JSON to
``evaluate.output_path`` when set.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from temper.algorithms.pass_at_k import default_ks, mean_at_n, mean_pass_at_k
from temper.config.errors import ConfigError
from temper.config.plan import NO_POLICY, NO_TRAINING, StepShape
from temper.config.schema import TemperConfig
from temper.pipelines.preflight_data import check_eval_data
from temper.pipelines.record import Context, Pipeline, no_producer
from temper.pipelines.unread import refuse_run_keys, refuse_unread

ALL = "all"


def source_metrics(
    scores: Sequence[Sequence[float]],
    sources: Sequence[str],
    ks: Sequence[int],
    threshold: float,
) -> dict[str, float]:
    """The metrics of prompts ``j`` with response scores ``scores[j]`` and data source
    ``sources[j]``, per source and over all (``ALL``):

    - ``<source>/prompts``, ``<source>/responses``;
    - ``<source>/mean@n``: :func:`mean_at_n` of the source's prompts;
    - ``<source>/pass@k`` for each ``k`` of ``ks`` (default: :func:`default_ks` of the
      fewest responses of a prompt) that every prompt of the source has: the mean over
      prompts of the unbiased pass@k, response ``i`` correct when ``s_ji ≥ threshold``.
    """
    groups: dict[str, list[Sequence[float]]] = defaultdict(list)
    for row, source in zip(scores, sources):
        groups[source].append(row)
    out: dict[str, float] = {}
    for source, rows in [*sorted(groups.items()), (ALL, list(scores))]:
        if source == ALL and len(groups) == 1:
            continue  # one source: its lines are the totals
        fewest = min(len(r) for r in rows)
        out[f"{source}/prompts"] = float(len(rows))
        out[f"{source}/responses"] = float(sum(len(r) for r in rows))
        out[f"{source}/mean@n"] = mean_at_n(rows)
        correct = [[s >= threshold for s in r] for r in rows]
        for k in ks or default_ks(fewest):
            if k <= fewest:
                out[f"{source}/pass@{k}"] = mean_pass_at_k(correct, k)
    return out


def evaluate(cfg: TemperConfig) -> dict[str, Any]:
    """Score ``evaluate.files`` and report per data source (module docstring); returns
    the summary (the metrics under ``metrics``)."""
    from temper.cluster.judge import build_judge
    from temper.cluster.placement import worker_device
    from temper.data.batch import Batch
    from temper.data.responses import load_response_rows
    from temper.rewards.manager import RewardScorer

    start = time.perf_counter()
    rows, skipped = load_response_rows(cfg.evaluate.files, cfg)
    objects: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        for text in row.responses:
            objects["response_text"].append(text)
            objects["data_source"].append(row.data_source)
            objects["ground_truth"].append(row.ground_truth)
            objects["extra_info"].append(row.extra_info)
            objects["tag"].append(row.tag)
            # what the LLM judge asks about: the chat's question, or the prompt text
            objects["raw_prompt"].append(row.prompt if isinstance(row.prompt, list) else None)
            objects["prompt_text"].append(row.prompt if isinstance(row.prompt, str) else None)
    judge = build_judge(cfg, worker_device(cfg), None)
    with RewardScorer(cfg.reward, judge=judge, model=cfg.model) as scorer:
        flat, _extra, failures = scorer.score_texts(Batch.from_dict(objects=objects))
    values = flat.tolist()
    scores: list[list[float]] = []
    for row in rows:
        scores.append(values[: len(row.responses)])
        values = values[len(row.responses) :]
    metrics = source_metrics(
        scores, [r.data_source for r in rows], cfg.evaluate.k, cfg.evaluate.pass_threshold
    )
    metrics["reward_failures"] = float(len(failures))
    metrics["skipped_rows"] = float(len(skipped))
    print("\n".join(metrics_table(metrics)), flush=True)
    if failures:
        first = failures[0]
        print(
            f"{len(failures)} responses scored reward.failure_score={cfg.reward.failure_score} "
            f"(their reward failed; first: {first.function}: {first.kind}: {first.reason})",
            flush=True,
        )
    path = cfg.evaluate.output_path
    if path:
        out = Path(path).expanduser()
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(metrics, indent=1) + "\n", encoding="utf-8")
        print(f"metrics: {out}", flush=True)
    return {
        "metrics": metrics,
        "output_path": path or None,
        "seconds": time.perf_counter() - start,
    }


def metrics_table(metrics: dict[str, float]) -> list[str]:
    """The metrics as a table: a line per data source (``all`` last), a column per
    metric (prompts, responses, mean@n, pass@k by k)."""
    sources = list(dict.fromkeys(k.split("/")[0] for k in metrics if "/" in k))
    names = list(dict.fromkeys(k.split("/", 1)[1] for k in metrics if "/" in k))
    names.sort(key=lambda n: (n.startswith("pass@"), int(n[5:]) if n.startswith("pass@") else 0))
    width = max(len("data source"), *(len(s) for s in sources))
    lines = [f"{'data source':<{width}}  " + "  ".join(f"{n:>9}" for n in names)]
    for source in sources:
        cells = []
        for name in names:
            value = metrics.get(f"{source}/{name}")
            if value is None:
                cells.append(f"{'-':>9}")
            elif name in ("prompts", "responses"):
                cells.append(f"{int(value):>9d}")
            else:
                cells.append(f"{value:>9.4f}")
        lines.append(f"{source:<{width}}  " + "  ".join(cells))
    return lines


# ------------------------------------------------------------------------ the config

LOADS_NO_MODEL = "temper eval scores texts: it loads no policy and generates nothing"
#: Sections an evaluation reads nothing of, and why.
UNREAD_SECTIONS = {
    "model": LOADS_NO_MODEL,
    "rollout": LOADS_NO_MODEL,
    "actor": LOADS_NO_MODEL,
    "critic": LOADS_NO_MODEL,
    "reference": LOADS_NO_MODEL,
    "algorithm": "temper eval reports scores: no advantages or shaping",
}
#: Keys of the reward section only a training run reads, and why.
UNREAD_REWARD_KEYS = {
    f"reward.{key}": "temper eval has no steps to fail: responses whose reward failed "
    "score reward.failure_score and are counted"
    for key in ("max_failure_fraction", "max_failed_steps")
}
#: The ``data`` keys an evaluation reads; the others are refused.
DATA_READS = ("prompt_key", "data_source_key", "ground_truth_key", "extra_info_key", "tag_key")
DATA_READS_ALSO = ("bad_rows",)


def _unread_data_keys() -> dict[str, str]:
    from dataclasses import fields

    from temper.config.schema import DataConfig

    reads = (*DATA_READS, *DATA_READS_ALSO)
    return {
        f"data.{f.name}": "a file of responses is read with evaluate.* and the data keys "
        f"{', '.join(DATA_READS)}"
        for f in fields(DataConfig)
        if f.name not in reads
    }


def check(cfg: TemperConfig) -> None:
    """Keys an evaluation reads nothing of are refused with why; then its own limits."""
    refuse_unread(cfg, "eval", UNREAD_SECTIONS, {**_unread_data_keys(), **UNREAD_REWARD_KEYS})
    refuse_run_keys(
        cfg,
        "eval",
        "temper eval prints its metrics (and writes evaluate.output_path) in this process: "
        "no run directory, checkpoints, trackers or placement",
        {"experiment": ("device",)},
    )
    ev = cfg.evaluate
    if not ev.files:
        raise ConfigError("evaluate.files", "no files of responses given", "set evaluate.files")
    bad = [k for k in ev.k if k < 1]
    if bad:
        raise ConfigError("evaluate.k", f"pass@k needs k >= 1, got {bad}", "list k values >= 1")
    if cfg.reward.model.enable:
        raise ConfigError(
            "reward.model.enable",
            "a reward model scores the token ids of a prompt and its response in the policy's "
            "template; temper eval scores a file's texts and loads no policy tokenizer",
            "score with reward functions (reward.function, routes, a custom function, "
            "llm_judge), or score with the reward model in an RL run's validation",
        )


def no_context(cfg: TemperConfig, notes: list[str]) -> Context:
    """Nothing is tokenized for a policy: no sample length to compare with a model."""
    return None


def rows_scored(cfg: TemperConfig) -> StepShape:
    """An evaluation scores every row of ``evaluate.files`` once."""
    return StepShape(samples=1, rows=(("rows scored", "all", "evaluate.files"),))


PIPELINE = Pipeline(
    build=no_producer,
    uses=frozenset({NO_POLICY, NO_TRAINING}),
    check=check,
    preflight=check_eval_data,
    step_shape=rows_scored,
    sections=frozenset({"evaluate"}),
    context=no_context,
    command="eval",
    main=evaluate,
    checks=frozenset({"rewards", "pipeline"}),
)
