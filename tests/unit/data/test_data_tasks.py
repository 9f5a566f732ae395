"""Synthetic tasks: deterministic per seed, correct ground truth, loadable rows."""

from __future__ import annotations

import json
import re

import pytest

from temper.config.errors import ConfigError
from temper.config.schema import DataConfig
from temper.data import build_dataset, read_rows
from temper.data.tasks import main, make_task_rows, write_task


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
