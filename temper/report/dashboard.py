"""A run's dashboard: one PNG of the curves that tell whether RL training is healthy,
and a short markdown summary — both from ``metrics.jsonl`` alone, so it works on a
finished run, a running one, or a copy of its record on a laptop.

Panels: reward, validation reward (overall and per data source), KL, entropy, response
length, grad norm, throughput, and losses (an SFT run's training and validation loss
among them) — always all of them, on one step axis, so
dashboards of different runs line up; a panel whose keys the run did not log says so
(e.g. no KL without a reference). Raw values are drawn faintly with an exponential
moving average on top when there are enough points to need smoothing.
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
    ("KL", ("actor/kl", "actor/kl_loss", "train/kl_in_reward")),
    ("entropy", ("actor/entropy",)),
    ("response length", ("response/length_mean", "response/length_max")),
    ("grad norm", ("actor/grad_norm", "critic/grad_norm")),
    ("throughput (tokens/s)", ("perf/tokens_per_s",)),
    ("loss", ("actor/pg_loss", "critic/value_loss", "train/loss", "val/loss")),
)


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


def plot_dashboard(rows: list[dict[str, Any]], png: str | Path, title: str = "") -> Path:
    """Draw the panels that have data into ``png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(t, _keys_for(t, keys, rows), keys) for t, keys in PANELS]
    cols = 4
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
            steps, values = series(rows, key)
            if not steps:
                continue
            color, style = f"C{i}", "-" if i == 0 else "--"
            label = key.split("/", 1)[1] if "/" in key else key
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
        ax.set_title(name, fontsize=11)
        ax.set_xlabel("step", fontsize=9)
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
    steps = sorted({int(r["step"]) for r in rows})
    lines = [f"# {title}", ""]
    if warning:
        lines += [f"> warning: {warning}", ""]
    lines.append(f"- steps logged: {len(steps)} (last step {steps[-1] if steps else 0})")
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
    lines += ["", f"![dashboard]({png_name})", ""]
    return "\n".join(lines)


def write_report(run_dir: str | Path, out_dir: str | Path | None = None) -> Report:
    """``report.png`` and ``report.md`` for the run in ``run_dir`` (into ``out_dir``): one
    point per step, its last value, in step order (``Report.warning`` says when the file
    held steps out of order or more than once)."""
    run_dir = Path(run_dir)
    steps = by_step(read_metrics(run_dir), str(_metrics_file(run_dir)))
    rows = steps.rows
    if not rows:
        raise ValueError(f"{run_dir}: metrics.jsonl has no rows to report")
    out = (
        Path(out_dir) if out_dir is not None else (run_dir if run_dir.is_dir() else run_dir.parent)
    )
    title = run_dir.name if run_dir.is_dir() else run_dir.parent.name
    png = plot_dashboard(rows, out / "report.png", title=title)
    md = out / "report.md"
    md.write_text(summary_markdown(rows, png.name, title, steps.warning), encoding="utf-8")
    return Report(png, md, steps.warning)
