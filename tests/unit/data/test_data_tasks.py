"""Synthetic tasks: deterministic per seed, correct ground truth, loadable rows."""

from __future__ import annotations

import json
import re

import pytest

from temper.config.errors import ConfigError
from temper.config.schema import DataConfig
from temper.data import build_dataset, read_rows
from temper.data.tasks import evaluate_terms, main, make_task_rows, resolve_task_uri, write_task
from temper.rewards.functions.arithmetic import compute_score


def test_arithmetic_deterministic_and_correct():
    rows = make_task_rows("arithmetic", 50, seed=1, max_operand=9, num_terms=3)
    assert rows == make_task_rows("arithmetic", 50, seed=1, max_operand=9, num_terms=3)
    assert rows != make_task_rows("arithmetic", 50, seed=2, max_operand=9, num_terms=3)
    for row in rows:
        content = row["prompt"][0]["content"]
        expr = re.fullmatch(r"What is (.+)\? Put the final answer after ####\.", content)[1]
        assert len(expr.split()) == 5 and all(int(t) <= 9 for t in expr.split()[::2])
        value = eval(expr)  # digits and +/- only
        assert value >= 0 and row["reward_model"] == {"style": "rule", "ground_truth": str(value)}
        assert row["data_source"] == "arithmetic"
    assert make_task_rows("arithmetic", 1, seed=0)[0]["extra_info"]["index"] == 0


def test_arithmetic_multiplication_and_min_operand():
    rows = make_task_rows(
        "arithmetic", 60, seed=3, min_operand=2, max_operand=12, ops="+-*", num_terms=4
    )
    assert any("*" in r["extra_info"]["expression"] for r in rows)
    for row in rows:
        expr = row["extra_info"]["expression"]
        assert all(2 <= int(t) <= 12 for t in expr.split()[::2])
        assert row["reward_model"]["ground_truth"] == str(eval(expr)) and eval(expr) >= 0
    assert evaluate_terms([2, 3, 4, 5], ["+", "*", "-"]) == 2 + 3 * 4 - 5
    assert evaluate_terms([7, 2, 3], ["-", "*"]) == 1
    assert evaluate_terms([2, 3, 4], ["*", "*"]) == 24
    with pytest.raises(ValueError, match="min_operand"):
        make_task_rows("arithmetic", 2, min_operand=20, max_operand=10)
    with pytest.raises(ValueError, match="ops within"):
        make_task_rows("arithmetic", 2, ops="+/")


def test_arithmetic_default_rows_unchanged():
    """The quickstart's data (operands from 0) is what it was before min_operand existed."""
    rows = make_task_rows("arithmetic", 3, seed=0, max_operand=9)
    assert [r["extra_info"]["expression"] for r in rows] == ["6 + 6", "6 - 4", "5 + 9"]


def test_arithmetic_hard_two_digit_and_scored_exactly():
    rows = make_task_rows("arithmetic_hard", 100, seed=1)
    assert rows == make_task_rows("arithmetic_hard", 100, seed=1)
    assert rows != make_task_rows("arithmetic_hard", 100, seed=2)
    assert {r["extra_info"]["expression"].split()[1] for r in rows} == {"+", "-"}
    for row in rows:
        expr = row["extra_info"]["expression"]
        assert all(10 <= int(t) <= 99 for t in expr.split()[::2])
        truth = row["reward_model"]["ground_truth"]
        assert truth == str(eval(expr)) and int(truth) >= 0
        assert row["data_source"] == "arithmetic"  # scored by the arithmetic reward
        assert compute_score(row["data_source"], f"{expr} = {truth}", truth)["score"] == 1.0
        assert compute_score(row["data_source"], f"#### {int(truth) + 1}", truth)["score"] == 0.0
        assert compute_score(row["data_source"], "I cannot say.", truth)["format_ok"] is False
    harder = make_task_rows("arithmetic_hard", 5, seed=1, num_terms=3, ops="+-*")
    assert all(len(r["extra_info"]["expression"].split()) == 5 for r in harder)


def test_countdown_reachable_targets():
    rows = make_task_rows("countdown", 30, seed=0, num_numbers=4, max_number=10)
    assert rows == make_task_rows("countdown", 30, seed=0, num_numbers=4, max_number=10)
    for row in rows:
        truth = json.loads(row["reward_model"]["ground_truth"])
        assert len(truth["numbers"]) == 4 and all(1 <= n <= 10 for n in truth["numbers"])
        solution = row["extra_info"]["solution"]
        assert eval(solution) == truth["target"] >= 1
        used = sorted(int(n) for n in re.findall(r"\d+", solution))
        assert used == sorted(truth["numbers"])
        assert str(truth["numbers"]) in row["prompt"][0]["content"]
        assert row["data_source"] == "countdown"


def test_unknown_task():
    with pytest.raises(ConfigError, match="arithmetic"):
        make_task_rows("sudoku", 3)


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_written_tasks_load(tmp_path, tokenizer, suffix):
    path = write_task("countdown", tmp_path / f"c{suffix}", 8, seed=4)
    ds = build_dataset(path, DataConfig(max_prompt_length=512), tokenizer)
    assert len(ds) == 8 and ds[0].data_source == "countdown"
    assert json.loads(ds[0].ground_truth)["numbers"]


def test_arithmetic_hard_task_uri(tmp_path, monkeypatch):
    monkeypatch.setenv("TEMPER_CACHE", str(tmp_path))
    path = resolve_task_uri("task:arithmetic_hard?n=6&seed=4&split=test")
    rows = [r.row for r in read_rows(path)]
    assert rows == make_task_rows("arithmetic_hard", 6, seed=4, split="test")


def test_cli(tmp_path, capsys):
    main(["arithmetic", str(tmp_path / "a.jsonl"), "--n", "5", "--seed", "3", "max_operand=50"])
    assert capsys.readouterr().out.strip().endswith("a.jsonl")
    rows = [r.row for r in read_rows(tmp_path / "a.jsonl")]
    assert rows == make_task_rows("arithmetic", 5, seed=3, max_operand=50)


def test_visual_color_task_rows_have_geometry3k_shape():
    import io

    from PIL import Image

    from temper.data.tasks import make_task_rows

    rows = make_task_rows("visual_color", 12, seed=5, colors="red,blue", size=84)
    assert rows == make_task_rows("visual_color", 12, seed=5, colors="red,blue", size=84)
    for r in rows:
        assert r["prompt"][0]["content"].startswith("<image>")
        assert r["reward_model"]["ground_truth"] in ("red", "blue")
        image = Image.open(io.BytesIO(r["images"][0]["bytes"]))
        assert image.size == (84, 84)
    assert {r["reward_model"]["ground_truth"] for r in rows} == {"red", "blue"}
    with pytest.raises(ValueError, match="unknown: pink"):
        make_task_rows("visual_color", 2, colors="red,pink")
