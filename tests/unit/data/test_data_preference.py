"""Preference pairs (temper.data.preference): the layout of a pair, bad rows reported by
file and row, truncation. Ids of the tiny tokenizer: ``<|im_end|>`` 258 (also its EOS)."""

from __future__ import annotations

import json

import pytest

from temper.config.schema import TemperConfig
from temper.data.errors import DataError
from temper.data.preference import build_pair_dataset
from temper.data.tasks import arithmetic_rows

IM_END = 258


def config(**data) -> TemperConfig:
    cfg = TemperConfig(pipeline="dpo")
    for key, value in data.items():
        section, _, field = key.partition("__")
        setattr(getattr(cfg, section), field, value)
    return cfg


def write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_pair_is_two_rows_with_one_prompt(tokenizer, tmp_path):
    """Chosen row then rejected row, the templated prompt on both, each response closed by
    EOS and learnt; ``chosen`` marks the chosen rows."""
    rows = [{"prompt": "2+2?", "chosen": "4", "rejected": "5"}]
    data = build_pair_dataset(
        [write(tmp_path / "d.jsonl", rows)], config(), tokenizer, "train", "k", -1
    )
    (pair,) = data.pairs
    prompt = ids(tokenizer, "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert list(pair.chosen.prompt_ids) == prompt == list(pair.rejected.prompt_ids)
    assert list(pair.chosen.response_ids) == [*ids(tokenizer, "4"), IM_END]
    assert list(pair.rejected.response_ids) == [*ids(tokenizer, "5"), IM_END]
    batch = data.make_batch([0])
    assert len(batch) == 2 and batch["chosen"].tolist() == [1, 0]
    assert batch["response_mask"].tolist() == [[1, 1], [1, 1]]
    assert batch["uid"] == ["train-0", "train-0"] and batch["index"] == [0, 0]


def test_conversational_pairs_are_the_same_pair(tokenizer, tmp_path):
    """Responses as conversations ending with the assistant's turn (TRL's and
    UltraFeedback's rows): the earlier turns are the prompt — with the whole conversation
    in each response, or the assistant turn alone after the prompt column."""
    user = {"role": "user", "content": "2+2?"}
    rows = [
        {"prompt": "2+2?", "chosen": "4", "rejected": "5"},
        {
            "prompt": "2+2?",
            "chosen": [user, {"role": "assistant", "content": "4"}],
            "rejected": [user, {"role": "assistant", "content": "5"}],
        },
        {
            "prompt": [user],
            "chosen": [{"role": "assistant", "content": "4"}],
            "rejected": json.dumps([{"role": "assistant", "content": "5"}]),
        },
    ]
    data = build_pair_dataset(
        [write(tmp_path / "d.jsonl", rows)], config(), tokenizer, "train", "k", -1
    )
    plain, whole, alone = data.pairs
    for pair in (whole, alone):
        assert pair.chosen.prompt_ids == plain.chosen.prompt_ids
        assert pair.chosen.response_ids == plain.chosen.response_ids
        assert pair.rejected.response_ids == plain.rejected.response_ids


def test_bad_rows_are_reported_by_file_and_row(tokenizer, tmp_path, caplog):
    rows = [
        {"prompt": "a?", "rejected": "no"},  # no chosen
        {"prompt": "b?", "chosen": "yes", "rejected": "  "},  # empty response
        {"prompt": "c?", "chosen": "same", "rejected": "same"},  # prefers nothing
        {"prompt": "d?", "chosen": "yes", "rejected": "no"},
        {"prompt": "e?", "chosen": [{"role": "user", "content": "e?"}], "rejected": "no"},
        {"prompt": "f?", "chosen": [{"role": "assistant", "content": " "}], "rejected": "no"},
    ]
    path = write(tmp_path / "d.jsonl", rows)
    data = build_pair_dataset([path], config(), tokenizer, "train", "data.train_files", -1)
    assert len(data) == 1 and len(data.skip_reasons) == 5
    reasons = [str(issue) for issue in data.skip_reasons]
    assert "d.jsonl" in reasons[0] and "line 1" in reasons[0] and "'chosen'" in reasons[0]
    assert "line 2" in reasons[1] and "empty" in reasons[1] and "'rejected'" in reasons[1]
    assert "line 3" in reasons[2] and "prefers nothing" in reasons[2]
    assert "line 5" in reasons[3] and "does not end with an assistant turn" in reasons[3]
    assert "line 6" in reasons[4] and "empty (column 'chosen' (its last turn))" in reasons[4]
    assert data.metrics()["data/skipped_rows"] == 5.0
    with pytest.raises(DataError, match="line 1"):
        build_pair_dataset(
            [path], config(data__bad_rows="error"), tokenizer, "train", "data.train_files", -1
        )


def test_overlong_pairs_follow_truncation(tokenizer, tmp_path):
    rows = [{"prompt": "q", "chosen": "x" * 40, "rejected": "y"}]
    path = write(tmp_path / "d.jsonl", rows)
    with pytest.raises(DataError, match="dpo.max_length"):
        build_pair_dataset(
            [path], config(dpo__max_length=30), tokenizer, "train", "data.train_files", -1
        )
    cfg = config(dpo__max_length=30, data__truncation="right")
    (pair,) = build_pair_dataset([path], cfg, tokenizer, "train", "k", -1).pairs
    assert len(pair.chosen.prompt_ids) + len(pair.chosen.response_ids) == 30
    assert pair.chosen.truncated and not pair.rejected.truncated


def test_arithmetic_pairs_load(tokenizer, tmp_path):
    """The built-in task's pairs: the right answer chosen, a wrong one rejected."""
    rows = arithmetic_rows(4, pairs=True)
    data = build_pair_dataset(
        [write(tmp_path / "d.jsonl", rows)], config(), tokenizer, "train", "k", -1
    )
    assert len(data) == 4 and not data.skip_reasons
    for row in rows:
        assert row["chosen"] != row["rejected"]
        assert row["chosen"].split("#### ")[1] == row["reward_model"]["ground_truth"]
