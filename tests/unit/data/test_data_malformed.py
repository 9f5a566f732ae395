"""Malformed rows are reported with file and line, skipped and counted — or fail the load."""

from __future__ import annotations

import pytest

from temper.config.schema import DataConfig
from temper.data import DataError, build_dataset

GOOD = '{"prompt": "ok", "ground_truth": "1"}'
LINES = [
    GOOD,  # 1
    "{not json",  # 2 unparsable
    '{"question": "no prompt column"}',  # 3 missing key
    '{"prompt": "   "}',  # 4 empty
    '{"prompt": 5}',  # 5 wrong type
    "",  # 6 blank: ignored, not a bad row
    '{"prompt": [{"role": "user", "content": ["part"]}]}',  # 7 wrong content type
    '{"prompt": "x", "extra_info": "oops"}',  # 8 extra_info not an object
    "[1, 2]",  # 9 not an object
    '{"prompt": []}',  # 10 empty chat
    GOOD,  # 11
]


def _file(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(LINES) + "\n")
    return path


def test_bad_rows_are_reported_with_file_and_line(tmp_path, tokenizer, caplog):
    ds = build_dataset(_file(tmp_path), DataConfig(max_prompt_length=64), tokenizer)
    assert len(ds) == 2
    assert ds.skipped_rows == 8 and ds.metrics()["data/skipped_rows"] == 8
    where = [issue.where for issue in ds.skip_reasons]
    assert where == [f"line {n}" for n in (2, 3, 4, 5, 7, 8, 9, 10)]
    reasons = [str(issue) for issue in ds.skip_reasons]
    assert all(r.startswith(f"{tmp_path / 'bad.jsonl'}:line ") for r in reasons)
    assert "unparsable JSON" in reasons[0]
    assert "missing column 'prompt'" in reasons[1]
    assert "prompt is empty" in reasons[2]
    assert "got int" in reasons[3]
    assert "content must be a string" in reasons[4]
    assert "extra_info" in reasons[5]
    assert "expected a JSON object" in reasons[6]
    assert "empty list" in reasons[7]
    assert "bad.jsonl:line 2" in caplog.text  # logged, not silent
    assert ds.rows_read == 10


def test_bad_rows_error_fails_at_load(tmp_path, tokenizer):
    cfg = DataConfig(max_prompt_length=64, bad_rows="error")
    with pytest.raises(DataError, match=r"bad.jsonl:line 2: unparsable JSON.*bad_rows=skip"):
        build_dataset(_file(tmp_path), cfg, tokenizer)


def test_no_usable_rows_is_an_error(tmp_path, tokenizer):
    path = tmp_path / "all_bad.jsonl"
    path.write_text('{"q": 1}\n')
    with pytest.raises(DataError, match=r"no usable prompt.*missing column 'prompt'"):
        build_dataset(path, DataConfig(), tokenizer)


def test_csv_bad_rows(tmp_path, tokenizer):
    path = tmp_path / "d.csv"
    path.write_text("prompt,ground_truth\nhello,1\n,2\na,b,c\n")
    ds = build_dataset(path, DataConfig(max_prompt_length=64), tokenizer)
    assert len(ds) == 1 and ds[0].ground_truth == "1"
    assert [str(i) for i in ds.skip_reasons] == [
        f"{path}:line 3: column 'prompt' is null: the row has no prompt",
        f"{path}:line 4: 1 more field(s) than the header",
    ]
