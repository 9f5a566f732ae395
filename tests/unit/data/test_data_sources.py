"""Every input format gives the same prompts; paths expand; file-level errors are clear."""

from __future__ import annotations

import json
import sys

import pytest

from temper.config.schema import DataConfig
from temper.data import DataError, build_dataset, read_rows, write_rows

ROWS = [
    {
        "data_source": "arithmetic",
        "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
        "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
        "extra_info": {"index": i},
    }
    for i in range(3)
]


def _cfg(**kw) -> DataConfig:
    return DataConfig(chat_template="raw", max_prompt_length=64, **kw)


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl", ".json", ".csv"])
def test_each_format_gives_the_same_prompts(tmp_path, tokenizer, suffix):
    path = write_rows(ROWS, tmp_path / f"train{suffix}")
    ds = build_dataset(str(path), _cfg(), tokenizer)
    assert [e.prompt_text for e in ds] == [f"What is {i} + 1?" for i in range(3)]
    assert [e.ground_truth for e in ds] == ["1", "2", "3"]
    assert [e.extra_info for e in ds] == [{"index": i} for i in range(3)]
    assert ds[0].raw_prompt == ROWS[0]["prompt"]
    assert ds.skipped_rows == 0


def test_json_data_object_and_json_lines_named_json(tmp_path, tokenizer):
    (tmp_path / "a.json").write_text(json.dumps({"data": ROWS}))
    (tmp_path / "b.json").write_text("\n".join(json.dumps(r) for r in ROWS))
    for name in ("a.json", "b.json"):
        ds = build_dataset(tmp_path / name, _cfg(), tokenizer)
        assert len(ds) == 3


def test_datasets_directory(tmp_path, tokenizer):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "ds"))
    ds = build_dataset(tmp_path / "ds", _cfg(), tokenizer)
    assert [e.ground_truth for e in ds] == ["1", "2", "3"]
    assert ds[2].source.endswith("ds:row 2")


def test_datasets_missing_names_the_extra(tmp_path, monkeypatch):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "state.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(DataError, match=r"temper-rl\[dev\]"):
        list(read_rows(tmp_path / "ds", "data.train_files"))


def test_home_list_directory_and_glob(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    write_rows(ROWS[:2], tmp_path / "a.jsonl")
    write_rows(ROWS[2:], tmp_path / "sub" / "b.parquet")
    ds = build_dataset(["~/a.jsonl", "~/sub"], _cfg(), tokenizer)
    assert [e.ground_truth for e in ds] == ["1", "2", "3"]
    assert len(list(read_rows(str(tmp_path / "*.jsonl")))) == 2


def test_missing_and_unsupported_files(tmp_path, tokenizer):
    with pytest.raises(DataError, match=r"data.val_files: file not found: .*nope.jsonl"):
        build_dataset(tmp_path / "nope.jsonl", _cfg(), tokenizer, key="data.val_files")
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(DataError, match=r"unsupported file type '.txt'"):
        build_dataset(tmp_path / "x.txt", _cfg(), tokenizer)
    (tmp_path / "obj.json").write_text('{"rows": []}')
    with pytest.raises(DataError, match="not a list of rows"):
        build_dataset(tmp_path / "obj.json", _cfg(), tokenizer)


def test_build_datasets_from_temper_config(tmp_path, tokenizer):
    from temper.config.schema import TemperConfig
    from temper.data import build_datasets

    write_rows(ROWS, tmp_path / "t.jsonl")
    cfg = TemperConfig()
    cfg.data = _cfg(train_files=[str(tmp_path / "t.jsonl")])
    train, val = build_datasets(cfg, tokenizer)
    assert len(train) == 3 and val is None
    cfg.data.val_files = [str(tmp_path / "t.jsonl")]
    _, val = build_datasets(cfg, tokenizer)
    assert val.name == "val" and "data/val/skipped_rows" in val.metrics()


def test_max_samples_keeps_first_usable_prompts(tmp_path, tokenizer):
    rows = [{"prompt": "a"}, {"bad": 1}, {"prompt": "b"}, {"prompt": "c"}, {"prompt": "d"}]
    path = write_rows(rows, tmp_path / "m.jsonl")
    ds = build_dataset(path, _cfg(), tokenizer, max_samples=2)
    assert [e.prompt_text for e in ds] == ["a", "b"] and ds.skipped_rows == 1
