"""``temper report``: a PNG dashboard and a markdown summary from metrics.jsonl."""

from __future__ import annotations

import json

from temper.cli.main import main
from temper.report import read_metrics, summary_markdown
from temper.report.dashboard import chain


def _run_dir(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": 0, "val/reward_mean": 0.1, "val/arith/reward_mean": 0.1}]
    for s in range(1, 13):
        rows.append(
            {
                "step": s,
                "train/reward_mean": s / 12,
                "actor/kl": 0.001 * s,
                "actor/entropy": 2.0 - 0.1 * s,
                "response/length_mean": 10.0 + s,
                "actor/grad_norm": 1.0,
                "perf/tokens_per_s": 100.0,
                "timing/step_s": 2.0,
            }
        )
    rows.append({"step": 12, "val/reward_mean": 0.8, "val/arith/reward_mean": 0.8})
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows) + '{"step": 13, "cut'
    )
    return run


def test_report_cli_writes_png_and_markdown(tmp_path, capsys):
    run = _run_dir(tmp_path)
    assert main(["report", str(run)]) == 0
    png = run / "report.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    md = (run / "report.md").read_text()
    assert "train/reward_mean: 0.25 → 0.8333" in md
    assert "val/reward_mean: first 0.1 (step 0), last 0.8 (step 12), best 0.8 (step 12)" in md
    assert "![dashboard](report.png)" in md
    assert str(png) in capsys.readouterr().out


def test_report_on_an_empty_run_is_an_error(tmp_path, capsys):
    (tmp_path / "metrics.jsonl").write_text("")
    assert main(["report", str(tmp_path)]) == 1
    assert "no rows" in capsys.readouterr().err


def test_summary_skips_missing_keys(tmp_path):
    rows = read_metrics(_run_dir(tmp_path))
    assert len(rows) == 14
    text = summary_markdown(rows[:1], "r.png", "t")
    assert "steps logged: 1" in text and "train/reward_mean" not in text


def test_chained_runs_share_one_report_stage_after_stage(tmp_path, capsys):
    """SFT (4 steps), then RL from its checkpoint (the run of _run_dir, 12 steps): the RL
    steps follow the SFT ones on one axis, each stage summarised on its own."""
    sft = tmp_path / "sft"
    sft.mkdir()
    rows = [{"step": 0, "val/loss": 2.0}]
    rows += [{"step": s, "train/loss": 2.0 - 0.4 * s} for s in range(1, 5)]
    rows.append({"step": 4, "val/loss": 0.5})
    (sft / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rl = _run_dir(tmp_path)
    assert main(["report", str(sft), str(rl), "--out", str(tmp_path / "chain")]) == 0
    md = (tmp_path / "chain" / "report.md").read_text()
    assert md.startswith("# sft → run")
    assert "## stage 1: sft (chained steps 0–4)" in md
    assert "## stage 2: run (chained steps 4–16)" in md
    assert "val/loss: first 2 (step 0), last 0.5 (step 4), best 0.5 (step 4)" in md
    assert "train/reward_mean: 0.25 → 0.8333" in md  # the RL stage's own steps
    assert (tmp_path / "chain" / "report.png").read_bytes()[:4] == b"\x89PNG"
    chained, stages = chain([("sft", read_metrics(sft)), ("run", read_metrics(rl))])
    assert [s.offset for s in stages] == [0, 4]
    assert max(r["step"] for r in chained if r["stage"] == "run") == 16
