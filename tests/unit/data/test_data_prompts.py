"""Templating, column resolution and truncation, checked against hand-computed token ids.

Tiny tokenizer: printable ASCII ``c`` -> ``ord(c) - 33``; newline 198; ``<|im_start|>`` 257,
``<|im_end|>`` 258.
"""

from __future__ import annotations

import copy
import json

import pytest

from temper.config.errors import ConfigError
from temper.config.schema import DataConfig
from temper.data import DataError, build_dataset, write_rows
from temper.data.prompts import truncate_ids

NL, START, END = 198, 257, 258


def ids(text: str) -> list[int]:
    return [ord(c) - 33 for c in text]


def _write(tmp_path, rows, name="d.jsonl"):
    return write_rows(rows, tmp_path / name)


def _one(tmp_path, tokenizer, rows, **kw):
    kw.setdefault("max_prompt_length", 64)
    return build_dataset(_write(tmp_path, rows), DataConfig(**kw), tokenizer)


def test_native_template_ids(tmp_path, tokenizer):
    ds = _one(tmp_path, tokenizer, [{"prompt": [{"role": "user", "content": "hi"}]}])
    want = [START, *ids("user"), NL, *ids("hi"), END, NL, START, *ids("assistant"), NL]
    assert list(ds[0].prompt_ids) == want
    assert ds[0].prompt_text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_system_prompt_prepended_once(tmp_path, tokenizer):
    rows = [
        {"prompt": "hi"},
        {"prompt": [{"role": "system", "content": "own"}, {"role": "user", "content": "hi"}]},
    ]
    ds = _one(tmp_path, tokenizer, rows, system_prompt="sys")
    assert ds[0].raw_prompt == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
    ]
    assert ds[0].prompt_text.startswith("<|im_start|>system\nsys<|im_end|>\n")
    assert [m["content"] for m in ds[1].raw_prompt] == ["own", "hi"]


def test_raw_template_and_joined_chat(tmp_path, tokenizer):
    rows = [
        {"prompt": "abc"},
        {"prompt": [{"role": "user", "content": "ab"}, {"role": "user", "content": "cd"}]},
    ]
    ds = _one(tmp_path, tokenizer, rows, chat_template="raw")
    assert list(ds[0].prompt_ids) == ids("abc")
    assert list(ds[1].prompt_ids) == [*ids("ab"), NL, NL, *ids("cd")]


def test_custom_jinja_template(tmp_path, tokenizer):
    template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    ds = _one(tmp_path, tokenizer, [{"prompt": "xy"}], chat_template=template)
    assert ds[0].prompt_text == "[xy]"


def test_native_needs_a_chat_template(tmp_path, tokenizer):
    bare = copy.copy(tokenizer)
    bare.chat_template = None
    with pytest.raises(ConfigError, match="data.chat_template"):
        _one(tmp_path, bare, [{"prompt": "x"}])
    with pytest.raises(ConfigError, match="unknown value 'chatml'"):
        _one(tmp_path, tokenizer, [{"prompt": "x"}], chat_template="chatml")


def test_columns_and_fallbacks(tmp_path, tokenizer):
    rows = [
        {"prompt": "a", "reward_model": {"ground_truth": "1"}, "data_source": "openai/gsm8k"},
        {"prompt": "b", "ground_truth": "2", "tag": "math"},
        {"prompt": "c", "answer": "3", "extra_info": None},
        {"prompt": "d"},
    ]
    ds = _one(tmp_path, tokenizer, rows)
    assert [e.ground_truth for e in ds] == ["1", "2", "3", None]
    assert [e.data_source for e in ds] == ["openai/gsm8k", "unknown", "unknown", "unknown"]
    assert [e.tag for e in ds] == ["openai/gsm8k", "math", "unknown", "unknown"]
    assert ds[2].extra_info == {}


def test_roll_messages_column(tmp_path, tokenizer):
    messages = [{"role": "user", "content": "hi"}]
    rows = [
        {"messages": json.dumps(messages), "ground_truth": "x", "tag": "math"},
        {"messages": messages, "ground_truth": "y", "tag": "code"},
    ]
    ds = _one(tmp_path, tokenizer, rows, messages_key="messages", chat_template="raw")
    assert [list(e.prompt_ids) for e in ds] == [ids("hi"), ids("hi")]
    assert [e.raw_prompt for e in ds] == [messages, messages]
    assert [e.tag for e in ds] == ["math", "code"]


def test_truncate_ids_modes():
    seq = list(range(10))
    assert truncate_ids(seq, 4, "left") == [6, 7, 8, 9]
    assert truncate_ids(seq, 4, "right") == [0, 1, 2, 3]
    assert truncate_ids(seq, 5, "middle") == [0, 1, 7, 8, 9]
    assert truncate_ids(seq, 10, "left") == seq
    with pytest.raises(ValueError):
        truncate_ids(seq, 4, "error")


@pytest.mark.parametrize(
    ("mode", "kept"),
    [("left", "ghij"), ("right", "abcd"), ("middle", "abij")],
)
def test_truncation_on_tokenizer(tmp_path, tokenizer, mode, kept):
    rows = [{"prompt": "abcdefghij"}, {"prompt": "xyz"}]
    ds = _one(tmp_path, tokenizer, rows, chat_template="raw", max_prompt_length=4, truncation=mode)
    assert list(ds[0].prompt_ids) == ids(kept)
    assert ds[0].prompt_text == kept
    assert list(ds[1].prompt_ids) == ids("xyz")
    assert ds.truncated == 1 and ds.metrics()["data/truncated_prompts"] == 1


def test_truncation_error_names_row_file_length_and_fix(tmp_path, tokenizer):
    rows = [{"prompt": "ok"}, {"prompt": "abcdefghij"}]
    with pytest.raises(DataError) as err:
        _one(tmp_path, tokenizer, rows, chat_template="raw", max_prompt_length=4)
    msg = str(err.value)
    assert "d.jsonl:line 2" in msg and "10 tokens" in msg and "max_prompt_length=4" in msg
    assert "data.truncation" in msg and err.value.key == "data.max_prompt_length"


def test_filter_overlong_drops_and_counts(tmp_path, tokenizer):
    rows = [{"prompt": "abcdefghij"}, {"prompt": "xyz"}, {"prompt": "abcde"}]
    ds = _one(
        tmp_path,
        tokenizer,
        rows,
        chat_template="raw",
        max_prompt_length=4,
        filter_overlong_prompts=True,
    )
    assert [e.prompt_text for e in ds] == ["xyz"]
    assert ds.filtered_overlong == 2 and ds.skipped_rows == 0
    assert ds.metrics()["data/filtered_overlong_prompts"] == 2


def test_apply_chat_template_kwargs(tmp_path, tokenizer):
    cfg = DataConfig()
    if not hasattr(cfg, "apply_chat_template_kwargs"):
        pytest.skip("schema without apply_chat_template_kwargs")
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{{ suffix }}"
    ds = _one(
        tmp_path,
        tokenizer,
        [{"prompt": "q"}],
        chat_template=template,
        apply_chat_template_kwargs={"suffix": "!"},
    )
    assert ds[0].prompt_text == "q!"
