"""Prompt batches: left padding with the tokenizer's pad id, masks, objects, uids."""

from __future__ import annotations

import torch

from temper.config.schema import DataConfig, TemperConfig
from temper.data import build_dataset, build_sampler, left_pad, next_prompt_batch, write_rows

PAD = 259


def test_left_pad():
    ids, mask = left_pad([[1, 2], [3, 4, 5, 6], []], PAD)
    assert ids.tolist() == [[PAD, PAD, 1, 2], [3, 4, 5, 6], [PAD] * 4]
    assert mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]]
    ids, _ = left_pad([[7]], PAD, length=3)
    assert ids.tolist() == [[PAD, PAD, 7]]


def test_prompt_batch(tmp_path, tokenizer):
    rows = [
        {"prompt": "ab", "data_source": "arithmetic", "reward_model": {"ground_truth": "1"}},
        {"prompt": "abcd", "data_source": "countdown", "extra_info": {"k": 1}, "tag": "t"},
    ]
    path = write_rows(rows, tmp_path / "d.parquet")
    ds = build_dataset(path, DataConfig(chat_template="raw", max_prompt_length=8), tokenizer)
    assert ds.pad_token_id == tokenizer.pad_token_id == PAD
    batch = ds.make_batch([1, 0], ["u1", "u0"])
    assert batch["prompt_ids"].tolist() == [[64, 65, 66, 67], [PAD, PAD, 64, 65]]
    assert batch["prompt_mask"].tolist() == [[1, 1, 1, 1], [0, 0, 1, 1]]
    assert batch["prompt_ids"].dtype == torch.long
    assert batch["uid"] == ["u1", "u0"] and batch["index"] == [1, 0]
    assert batch["data_source"] == ["countdown", "arithmetic"]
    assert batch["tag"] == ["t", "arithmetic"]
    assert batch["ground_truth"] == [None, "1"]
    assert batch["extra_info"] == [{"k": 1}, {}]
    assert batch["prompt_text"] == ["abcd", "ab"]
    assert batch["raw_prompt"][1] == [{"role": "user", "content": "ab"}]
    batch["extra_info"][0]["k"] = 99  # the dataset keeps its own copy
    assert ds[1].extra_info == {"k": 1}

    cfg = TemperConfig()
    cfg.data.train_batch_size = 2
    sampler = build_sampler(cfg, len(ds), ds.tags)
    first = next_prompt_batch(ds, sampler)
    assert len(first) == 2 and first.meta["epoch"] == 0
    assert sorted(first["uid"]) == ["0-0", "0-1"]
    assert sampler.epoch == 1

    evals = list(ds.eval_batches(batch_size=1))
    assert [b["uid"] for b in evals] == [["train-0"], ["train-1"]]
