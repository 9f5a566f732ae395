"""Hostile input at run time (issue 29's smaller defects): data files, the run's record,
reward functions and stop signals.

- Data: a UTF-8 byte-order mark keeps every row (jsonl, json, csv); ``prompt: null`` is a
  bad row (reported, and skipped or fatal per ``data.bad_rows``), not a missing column;
  an empty file is said to be empty by ``check`` and ``train`` alike.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from temper.cli.main import main
from temper.config.schema import DataConfig
from temper.data import DataError, build_dataset
from temper.data.sources import read_rows

ROW_A = {"prompt": "1+1=", "ground_truth": "2", "data_source": "arith"}
ROW_B = {"prompt": "2+2=", "ground_truth": "4", "data_source": "arith"}
BOM = b"\xef\xbb\xbf"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from temper.utils.tiny import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("tiny_tok"))


@pytest.fixture
def no_run(monkeypatch):
    """``train`` must stop before the run: reaching the pipeline fails the test."""

    def run_pipeline(cfg, plan=None):
        raise AssertionError("train started a run although it should refuse the config")

    monkeypatch.setattr("temper.pipelines.run_pipeline", run_pipeline)


def refused(args: list[str], capsys) -> str:
    """The one-line refusal of ``check`` and of ``train`` (the same), exit 2, no
    traceback; the message without its ``config error:`` prefix."""
    messages = []
    for command in ("check", "train"):
        assert main([command, *args]) == 2, command
        out, err = capsys.readouterr()
        err = err.strip()
        assert err.startswith("config error: ") and "\n" not in err, err
        assert "Traceback" not in err + out
        messages.append(err)
    assert messages[0] == messages[1]
    return messages[0].removeprefix("config error: ")


def native(tmp_path: Path, model_dir: Path | str, **sections) -> Path:
    """A small native RLVR config on ``model_dir`` (sections update its defaults)."""
    data: dict = {
        "model": {"path": str(model_dir)},
        "data": {"train_batch_size": 2, "max_prompt_length": 96},
        "rollout": {"n": 2, "response_length": 8},
        "actor": {"mini_batch_size": 4, "micro_batch_size_per_device": 4},
        "reward": {"function": "format", "num_workers": 1},
        "experiment": {"output_dir": str(tmp_path / "out"), "max_steps": 1},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# --------------------------------------------------------------------------- data files


def _csv(rows: list[dict]) -> str:
    columns = list(rows[0])
    return "\n".join([",".join(columns), *(",".join(r[c] for c in columns) for r in rows)]) + "\n"


@pytest.mark.parametrize(
    ("suffix", "text"),
    [
        (".jsonl", "".join(json.dumps(r) + "\n" for r in (ROW_A, ROW_B))),
        (".json", json.dumps([ROW_A, ROW_B])),
        (".csv", _csv([ROW_A, ROW_B])),
    ],
    ids=["jsonl", "json", "csv"],
)
def test_a_byte_order_mark_keeps_the_first_row(tmp_path, suffix, text):
    path = tmp_path / f"bom{suffix}"
    path.write_bytes(BOM + text.encode())
    rows = list(read_rows(path))
    assert [r.problem for r in rows] == [None, None]
    assert [r.row for r in rows] == [ROW_A, ROW_B]


def test_a_byte_order_mark_file_trains_on_all_its_prompts(tmp_path, tokenizer):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(BOM + "".join(json.dumps(r) + "\n" for r in (ROW_A, ROW_B)).encode())
    ds = build_dataset(path, DataConfig(max_prompt_length=64, bad_rows="error"), tokenizer)
    assert len(ds) == 2 and ds.skipped_rows == 0


def test_a_null_prompt_is_a_bad_row_not_a_missing_column(tmp_path, tokenizer, caplog):
    path = tmp_path / "null.jsonl"
    rows = [{**ROW_A, "prompt": None}, ROW_B]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds = build_dataset(path, DataConfig(max_prompt_length=64), tokenizer)  # bad_rows: skip
    assert len(ds) == 1 and ds.skipped_rows == 1
    assert (
        str(ds.skip_reasons[0]) == f"{path}:line 1: column 'prompt' is null: the row has no prompt"
    )
    assert "missing column" not in caplog.text
    with pytest.raises(DataError) as err:
        build_dataset(path, DataConfig(max_prompt_length=64, bad_rows="error"), tokenizer)
    assert str(err.value).startswith(
        f"data.train_files: malformed row {path}:line 1: column 'prompt' is null"
    )


@pytest.mark.parametrize("content", [b"", b"\n\n", BOM + b"\n"], ids=["empty", "blank", "bom"])
def test_an_empty_data_file_is_said_to_be_empty(tmp_path, tiny_path, capsys, no_run, content):
    data = tmp_path / "empty.jsonl"
    data.write_bytes(content)
    config = native(tmp_path, tiny_path, data={"train_files": [str(data)]})
    assert refused([str(config)], capsys) == (
        f"data.train_files: {data} is empty (no rows). "
        "Fix: point data.train_files at a file that holds prompts"
    )


def test_an_empty_file_fails_the_loader_as_empty(tmp_path, tokenizer):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    with pytest.raises(DataError, match=r"empty\.jsonl is empty \(no rows\)"):
        build_dataset(path, DataConfig(), tokenizer)
