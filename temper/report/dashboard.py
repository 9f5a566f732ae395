"""A run's dashboard: one PNG of the curves that tell whether RL training is healthy,
and a short markdown summary — both from ``metrics.jsonl`` alone, so it works on a
finished run, a running one, or a copy of its record on a laptop.

Panels: reward, validation reward (overall and per data source), KL, entropy, response
length, grad norm, throughput, and losses (an SFT run's training and validation loss
among them) — always all of them, on one step axis, so
dashboards of different runs line up; a panel whose keys the run did not log says so
(e.g. no KL without a reference). Raw values are drawn faintly with an exponential
moving average on top when there are enough points to need smoothing.

Runs chained into one (``temper report sft_run rl_run``: SFT, then RL from its
checkpoint) share one report: each stage's steps follow the stage before it on one step
axis, a dashed line marks where a stage starts, and the summary has a part per stage.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temper.report.steps import by_step

PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("reward", ("train/reward_mean", "train/score_mean")),
    ("validation reward", ("val/reward_mean",)),
    ("KL", ("actor/kl", "actor/kl_loss", "train/kl_in_reward", "distill/reverse_kl")),
    ("entropy", ("actor/entropy",)),
    ("response length", ("response/length_mean", "response/length_max")),
    ("grad norm", ("actor/grad_norm", "critic/grad_norm")),
    ("throughput (tokens/s)", ("perf/tokens_per_s",)),
    ("loss", ("actor/pg_loss", "critic/value_loss", "train/loss", "val/loss")),
    # asynchronous runs: how old the samples were (a partial rollout's tokens too), how
    # much of the trainer's work the rollout overlapped (a fraction of the shorter of the
    # two), and what a streaming rollout dropped as too stale
    (
        "rollout ahead",
        (
            "async/staleness_mean",
            "async/token_staleness_mean",
            "perf/rollout_overlap",
            "async/dropped_groups",
        ),
    ),
)


@dataclass(frozen=True)
class Stage:
    """One run of a chained report: its name and where its steps lie on the shared axis
    (its own step ``s`` is drawn at ``offset + s``)."""

    name: str
    offset: int
    last: int


def chain(runs: list[tuple[str, list[dict[str, Any]]]]) -> tuple[list[dict[str, Any]], list[Stage]]:
    """The rows of consecutive runs on one step axis: run ``k``'s steps shifted by the
    last step of run ``k-1`` (so its step 0, validation before training, is drawn where
    the stage before it ended), each row tagged with its stage's name."""
    out: list[dict[str, Any]] = []
    stages: list[Stage] = []
    offset = 0
    for name, rows in runs:
        last = max((int(r["step"]) for r in rows), default=0)
        out += [{**r, "step": int(r["step"]) + offset, "stage": name} for r in rows]
        stages.append(Stage(name, offset, offset + last))
        offset += last
    return out, stages


@dataclass(frozen=True)
class Report:
    """Where ``write_report`` put its files, and what it found wrong with the record
    (one line; see :mod:`temper.report.steps`)."""

    png: Path
    markdown: Path
    warning: str | None = None


def _metrics_file(path: Path) -> Path:
    return path / "metrics.jsonl" if path.is_dir() else path


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ``metrics.jsonl`` (a run dir or the file), as written; cut lines are
    skipped."""
    rows = []
    for line in _metrics_file(Path(path)).read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows


def series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of the finite numeric values of ``key``."""
    steps, values = [], []
    for row in rows:
        v = row.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            steps.append(int(row["step"]))
            values.append(float(v))
    return steps, values


def _ema(values: list[float], alpha: float) -> list[float]:
    out, acc = [], values[0]
    for v in values:
        acc = alpha * v + (1 - alpha) * acc
        out.append(acc)
    return out


def _keys_for(title: str, keys: tuple[str, ...], rows: list[dict[str, Any]]) -> list[str]:
    present = {k for row in rows for k in row}
    if title == "validation reward":  # per-source curves too
        per_source = sorted(
            k for k in present if k.startswith("val/") and k.endswith("/reward_mean")
        )
        keys = tuple(dict.fromkeys([*keys, *per_source]))
    return [k for k in keys if k in present]


def _stage_parts(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The rows of each stage of a chained report, in order (one part for a single run)."""
    parts: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        parts.setdefault(row.get("stage"), []).append(row)
    return list(parts.values())


def plot_dashboard(
    rows: list[dict[str, Any]],
    png: str | Path,
    title: str = "",
    stages: list[Stage] | None = None,
) -> Path:
    """Draw the panels that have data into ``png`` (``stages``: a chained report's
    runs, each start marked)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(t, _keys_for(t, keys, rows), keys) for t, keys in PANELS]
    cols = 3
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False)
    all_steps = [int(r["step"]) for r in rows]
    lo, hi = min(all_steps), max(all_steps)
    pad = max(0.5, 0.02 * (hi - lo))
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (name, keys, wanted) in zip(axes.flat, panels):
        ax.set_xlim(lo - pad, hi + pad)
        if not keys:
            ax.text(
                0.5,
                0.5,
                "not logged by this run\n(" + ", ".join(wanted) + ")",
                ha="center",
                va="center",
                fontsize=8,
                color="0.45",
                transform=ax.transAxes,
                wrap=True,
            )
        for i, key in enumerate(keys):
            color, style = f"C{i}", "-" if i == 0 else "--"
            label: str | None = key.split("/", 1)[1] if "/" in key else key
            if sum(k.split("/", 1)[-1] == label for k in keys) > 1:  # train/loss, val/loss
                label = key
            # a chained report draws each stage's curve on its own: one stage's moving
            # average does not run on into the next
            for part in _stage_parts(rows):
                steps, values = series(part, key)
                if not steps:
                    continue
                if len(values) >= 10 and not key.startswith("val/"):
                    ax.plot(steps, values, color=color, alpha=0.25, linewidth=1)
                    ema = _ema(values, 0.2)
                    ax.plot(steps, ema, color=color, linestyle=style, linewidth=1.8, label=label)
                else:
                    ax.plot(
                        steps,
                        values,
                        color=color,
                        linestyle=style,
                        marker="o",
                        markersize=3,
                        label=label,
                    )
                label = None  # one legend entry for all stages
        for stage in (stages or [])[1:]:
            ax.axvline(stage.offset, color="0.35", linestyle=":", linewidth=1)
            ax.text(
                stage.offset,
                1.0,
                f" {stage.name}",
                transform=ax.get_xaxis_transform(),
                fontsize=7,
                color="0.35",
                va="top",
            )
        ax.set_title(name, fontsize=11)
        ax.set_xlabel("step" if not stages else "step (stages chained)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
        if keys:
            ax.legend(fontsize=7, loc="best")
    if title:
        fig.suptitle(title, fontsize=13)
    fig.tight_layout()
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def _first_last(rows: list[dict[str, Any]], key: str, k: int = 5) -> tuple[float, float] | None:
    _, values = series(rows, key)
    if not values:
        return None
    k = min(k, len(values))
    return sum(values[:k]) / k, sum(values[-k:]) / k


def summary_markdown(
    rows: list[dict[str, Any]], png_name: str, title: str, warning: str | None = None
) -> str:
    """A few lines a human reads first: length, reward trend, validation, speed (and
    ``warning``, what was wrong with the record, first)."""
    lines = [f"# {title}", ""]
    if warning:
        lines += [f"> warning: {warning}", ""]
    lines += _summary_lines(rows)
    lines += ["", f"![dashboard]({png_name})", ""]
    return "\n".join(lines)


def chained_summary_markdown(
    parts: list[tuple[Stage, list[dict[str, Any]], str | None]], png_name: str, title: str
) -> str:
    """:func:`summary_markdown` with a part per stage (its own steps and warning)."""
    lines = [f"# {title}", ""]
    for i, (stage, rows, warning) in enumerate(parts, start=1):
        lines += [f"## stage {i}: {stage.name} (chained steps {stage.offset}–{stage.last})", ""]
        if warning:
            lines += [f"> warning: {warning}", ""]
        lines += [*_summary_lines(rows), ""]
    lines += [f"![dashboard]({png_name})", ""]
    return "\n".join(lines)


def _summary_lines(rows: list[dict[str, Any]]) -> list[str]:
    steps = sorted({int(r["step"]) for r in rows})
    lines = [f"- steps logged: {len(steps)} (last step {steps[-1] if steps else 0})"]
    for key in (
        "train/reward_mean",
        "train/loss",
        "response/length_mean",
        "actor/entropy",
        "actor/kl",
    ):
        fl = _first_last(rows, key)
        if fl:
            lines.append(f"- {key}: {fl[0]:.4g} → {fl[1]:.4g} (mean of first/last 5 steps)")
    for key, better in (("val/reward_mean", max), ("val/loss", min)):
        vs, vv = series(rows, key)
        if vv:
            best = better(range(len(vv)), key=vv.__getitem__)
            lines.append(
                f"- {key}: first {vv[0]:.4g} (step {vs[0]}), last {vv[-1]:.4g} "
                f"(step {vs[-1]}), best {vv[best]:.4g} (step {vs[best]})"
            )
    _, step_s = series(rows, "timing/step_s")
    if step_s:
        total = sum(step_s)
        lines.append(
            f"- time: {total:.1f} s in steps, {total / len(step_s):.2f} s/step "
            f"(max {max(step_s):.2f} s)"
        )
    _, tps = series(rows, "perf/tokens_per_s")
    if tps:
        lines.append(f"- throughput: {sum(tps) / len(tps):.1f} tokens/s (mean over steps)")
    return lines


def write_report(
    run_dirs: str | Path | list[str | Path], out_dir: str | Path | None = None
) -> Report:
    """``report.png`` and ``report.md`` for the run in ``run_dirs`` (or the runs, chained
    in the order given) into ``out_dir`` (default: the last run's directory): one point
    per step, its last value, in step order (``Report.warning`` says when a file held
    steps out of order or more than once)."""
    runs = [Path(p) for p in (run_dirs if isinstance(run_dirs, list) else [run_dirs])]
    if not runs:
        raise ValueError("no run directory given")
    parts = []
    for run in runs:
        steps = by_step(read_metrics(run), str(_metrics_file(run)))
        if not steps.rows:
            raise ValueError(f"{run}: metrics.jsonl has no rows to report")
        parts.append((_name(run), steps))
    last = runs[-1]
    out = Path(out_dir) if out_dir is not None else (last if last.is_dir() else last.parent)
    md = out / "report.md"
    if len(parts) == 1:
        (title, steps) = parts[0]
        png = plot_dashboard(steps.rows, out / "report.png", title=title)
        md.write_text(
            summary_markdown(steps.rows, png.name, title, steps.warning), encoding="utf-8"
        )
        return Report(png, md, steps.warning)
    rows, stages = chain([(name, steps.rows) for name, steps in parts])
    title = " → ".join(name for name, _ in parts)
    png = plot_dashboard(rows, out / "report.png", title=title, stages=stages)
    text = chained_summary_markdown(
        [(stage, steps.rows, steps.warning) for stage, (_, steps) in zip(stages, parts)],
        png.name,
        title,
    )
    md.write_text(text, encoding="utf-8")
    warnings = [f"{name}: {steps.warning}" for name, steps in parts if steps.warning]
    return Report(png, md, "; ".join(warnings) or None)


def _name(run: Path) -> str:
    return run.name if run.is_dir() else run.parent.name
