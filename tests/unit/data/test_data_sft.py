"""Supervised samples (temper.data.sft): what is learnt, how samples are cut, which rows
are reported. Ids of the tiny tokenizer: ``c`` is ``ord(c) - 33``, newline 198,
``<|im_start|>`` 257, ``<|im_end|>`` 258 (also its EOS)."""

from __future__ import annotations

import json

import pytest
import torch

from temper.config.schema import TemperConfig
from temper.data.errors import DataError
from temper.data.sft import build_sft_dataset
from temper.data.sft_rows import learn_prompt, truncate

IM_END = 258


def config(**data) -> TemperConfig:
    cfg = TemperConfig(pipeline="sft")
    for key, value in data.items():
        section, _, field = key.partition("__")
        setattr(getattr(cfg, section), field, value)
    return cfg


def write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_prompt_and_response_learns_the_response_and_eos(tokenizer, tmp_path):
    """verl's layout: the templated prompt (generation prompt included), then the
    response's tokens closed by EOS — all of them learnt, none of the prompt."""
    files = [write(tmp_path / "d.jsonl", [{"prompt": "2+2?", "response": "4"}])]
    data = build_sft_dataset(files, config(), tokenizer, "train", "data.train_files", -1)
    (e,) = data.examples
    prompt = "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert list(e.prompt_ids) == ids(tokenizer, prompt)
    assert list(e.response_ids) == [*ids(tokenizer, "4"), IM_END]
    assert e.target_mask == (1, 1) and e.source.endswith("d.jsonl:line 1")
    batch = data.make_batch([0])
    assert batch["response_mask"].tolist() == [[1, 1]] and batch.meta["temperature"] == 1.0
    assert batch["attention_mask"].sum().item() == len(e.prompt_ids) + 2


def test_dotted_columns_roll_query_and_system(tokenizer, tmp_path):
    """verl's prompt_dict_keys are a dotted path; ROLL's query follows the instruction
    after a newline, its system column is the system turn."""
    row = {"extra": {"q": "Add", "a": "5"}, "input": "2 3", "sys": "Be brief"}
    files = [write(tmp_path / "d.jsonl", [row])]
    cfg = config(data__prompt_key="extra.q", sft__response_key="extra.a")
    cfg.sft.query_key, cfg.sft.system_key = "input", "sys"
    (e,) = build_sft_dataset(files, cfg, tokenizer, "train", "k", -1).examples
    text = (
        "<|im_start|>system\nBe brief<|im_end|>\n<|im_start|>user\nAdd\n2 3<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert list(e.prompt_ids) == ids(tokenizer, text)
    assert list(e.response_ids) == [*ids(tokenizer, "5"), IM_END]


def test_conversation_learns_every_assistant_turn_and_nothing_else(tokenizer, tmp_path):
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "yo"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
    ]
    files = [write(tmp_path / "d.jsonl", [{"messages": messages}])]
    cfg = config(data__messages_key="messages")
    (e,) = build_sft_dataset(files, cfg, tokenizer, "train", "k", -1).examples
    assert (
        tokenizer.decode(list(e.prompt_ids))
        == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    learnt = [t for t, m in zip(e.response_ids, e.target_mask) if m]
    context = [t for t, m in zip(e.response_ids, e.target_mask) if not m]
    assert tokenizer.decode(learnt) == "yo<|im_end|>\na<|im_end|>\n"
    assert tokenizer.decode(context) == "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"


def test_bad_rows_are_reported_by_file_and_row_and_skipped(tokenizer, tmp_path, caplog):
    rows = [
        {"prompt": "ok", "response": "fine"},
        {"prompt": "no response here"},
        {"prompt": "empty", "response": "  "},
        {"prompt": "null", "response": None},
    ]
    files = [write(tmp_path / "pairs.jsonl", rows)]
    data = build_sft_dataset(files, config(), tokenizer, "train", "data.train_files", -1)
    assert len(data) == 1 and data.metrics()["data/skipped_rows"] == 3
    reasons = [str(i) for i in data.skip_reasons]
    assert reasons[0].endswith("pairs.jsonl:line 2: missing column 'response' (row has: prompt)")
    assert reasons[1].endswith("pairs.jsonl:line 3: response is empty (column 'response')")
    assert reasons[2].endswith(
        "pairs.jsonl:line 4: column 'response' is null: the row has no response"
    )
    assert "skipping malformed row" in caplog.text


@pytest.mark.parametrize(
    ("messages", "reason"),
    [
        (
            [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
            "message 1: a second user turn in a row (turns must alternate user/assistant)",
        ),
        (
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "assistant", "content": "c"},
            ],
            "message 2: a second assistant turn in a row",
        ),
        ([{"role": "assistant", "content": "a"}], "the conversation starts with a assistant"),
        ([{"role": "user", "content": "a"}], "has no assistant turn to learn"),
        (
            [{"role": "user", "content": "a"}, {"role": "assistant", "content": ""}],
            "message 1 (assistant) is empty",
        ),
    ],
)
def test_turn_lists_that_do_not_alternate_are_reported(tokenizer, tmp_path, messages, reason):
    good = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    files = [write(tmp_path / "c.jsonl", [{"messages": good}, {"messages": messages}])]
    cfg = config(data__messages_key="messages")
    data = build_sft_dataset(files, cfg, tokenizer, "train", "k", -1)
    (issue,) = data.skip_reasons
    assert issue.where == "line 2" and reason in issue.reason, issue
    cfg.data.bad_rows = "error"
    with pytest.raises(DataError, match=r"c\.jsonl:line 2"):
        build_sft_dataset(files, cfg, tokenizer, "train", "k", -1)


def test_tool_turns_between_assistant_turns_are_context(tokenizer, tmp_path):
    messages = [
        {"role": "user", "content": "sum"},
        {"role": "assistant", "content": "call"},
        {"role": "tool", "content": "7"},
        {"role": "assistant", "content": "7"},
    ]
    files = [write(tmp_path / "t.jsonl", [{"messages": messages}])]
    (e,) = build_sft_dataset(
        files, config(data__messages_key="messages"), tokenizer, "t", "k", -1
    ).examples
    context = [t for t, m in zip(e.response_ids, e.target_mask) if not m]
    assert tokenizer.decode(context) == "<|im_start|>tool\n7<|im_end|>\n<|im_start|>assistant\n"


def test_truncation_follows_verl():
    prompt, response, mask = [1, 2, 3], [4, 5, 6, 7], [1, 1, 1, 1]
    assert truncate(prompt, response, mask, 7, "right") == (prompt, response, mask)
    assert truncate(prompt, response, mask, 5, "right") == ([1, 2, 3], [4, 5], [1, 1])
    assert truncate(prompt, response, mask, 5, "left") == ([3], [4, 5, 6, 7], [1, 1, 1, 1])
    # a cut into the response keeps one context token before the first learnt one
    assert truncate(prompt, response, mask, 3, "left") == ([5], [6, 7], [1, 1])
    assert truncate(prompt, response, mask, 3, "right") is None  # nothing left to learn
    assert truncate([1], [2, 3], [0, 1], 2, "right") is None


def test_overlong_samples_error_or_are_cut(tokenizer, tmp_path):
    files = [write(tmp_path / "d.jsonl", [{"prompt": "x" * 40, "response": "y" * 20}])]
    cfg = config()
    cfg.sft.max_length = 30
    with pytest.raises(DataError, match=r"d\.jsonl:line 1 has \d+ tokens") as err:
        build_sft_dataset(files, cfg, tokenizer, "train", "k", -1)
    assert err.value.key == "sft.max_length"
    cfg.data.truncation = "left"
    data = build_sft_dataset(files, cfg, tokenizer, "train", "k", -1)
    (e,) = data.examples
    assert len(e.prompt_ids) + len(e.response_ids) == 30 and e.truncated
    assert data.metrics()["data/truncated_samples"] == 1.0
    cfg.sft.max_length, cfg.data.truncation = 10, "right"  # the prompt alone is longer
    with pytest.raises(DataError, match="no usable sample") as err:
        build_sft_dataset(files, cfg, tokenizer, "train", "k", -1)
    assert "nothing left to learn after cutting" in str(err.value)


def test_batches_pad_prompts_left_and_responses_right(tokenizer, tmp_path):
    rows = [{"prompt": "a", "response": "bcd"}, {"prompt": "long prompt", "response": "e"}]
    data = build_sft_dataset([write(tmp_path / "d.jsonl", rows)], config(), tokenizer, "t", "k", -1)
    batch = data.make_batch([0, 1])
    pm, rm = batch["prompt_mask"], batch["response_mask"]
    assert pm[0, 0] == 0 and pm[:, -1].tolist() == [1, 1]
    assert rm.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    assert torch.equal(batch["attention_mask"], torch.cat([pm, rm], dim=1))


def test_learn_prompt_learns_every_token_after_the_first(tokenizer, tmp_path):
    """sft.learn_prompt (ROLL distill_on_prompt): the first token is the only context."""
    files = [write(tmp_path / "d.jsonl", [{"prompt": "2+2?", "response": "4"}])]
    cfg = config(sft__learn_prompt=True)
    (e,) = build_sft_dataset(files, cfg, tokenizer, "train", "data.train_files", -1).examples
    full = ids(tokenizer, "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert list(e.prompt_ids) == full[:1]
    assert list(e.response_ids) == [*full[1:], *ids(tokenizer, "4"), IM_END]
    assert set(e.target_mask) == {1}


def test_learn_prompt_keeps_placeholders_as_context():
    """Image and video placeholder ids stand for pixels: never learnt."""
    prompt, response, mask = learn_prompt([1, 9, 9, 2], [3, 4], frozenset({9}))
    assert (prompt, response, mask) == ([1], [9, 9, 2, 3, 4], [0, 0, 1, 1, 1])


def _image(path, color) -> str:
    from PIL import Image

    Image.new("RGB", (56, 56), color).save(path)
    return path.name


def test_image_rows_carry_pixels_and_bad_images_are_reported(tiny_vlm_dir, tmp_path, caplog):
    """A VL model's SFT rows: the prompt's <image> expands to the image's tokens, the batch
    carries its pixel inputs (a text row's are empty); a missing image file and an image
    column of the wrong type are reported by file and row and skipped."""
    from transformers import AutoTokenizer

    from temper.data.sft import build_sft_datasets
    from temper.data.vision import MULTI_MODAL_INPUTS

    tok = AutoTokenizer.from_pretrained(tiny_vlm_dir)
    rows = [
        {
            "prompt": "<image>Colour?",
            "response": "red",
            "images": [_image(tmp_path / "r.png", "red")],
        },
        {"prompt": "Colour?", "response": "none"},
        {"prompt": "<image>Colour?", "response": "red", "images": ["missing.png"]},
        {"prompt": "<image>Colour?", "response": "red", "images": [7]},
    ]
    cfg = config(
        model__path=str(tiny_vlm_dir), data__train_files=[write(tmp_path / "d.jsonl", rows)]
    )
    train, _ = build_sft_datasets(cfg, tok)
    assert train is not None and len(train) == 2 and len(train.skip_reasons) == 2
    image_id = tok.convert_tokens_to_ids("<|image_pad|>")
    assert list(train.examples[0].prompt_ids).count(image_id) == 4  # 56×56: (56/28)²
    batch = train.make_batch([0, 1])
    pixels = batch.objects[MULTI_MODAL_INPUTS]
    assert pixels[0]["image_grid_thw"].tolist() == [[1, 4, 4]] and pixels[1] == {}
    assert "d.jsonl:line 3: image 0 of column 'images': cannot read" in caplog.text
    assert "d.jsonl:line 4: image 0 of column 'images' must be bytes, a path or a dict" in (
        caplog.text
    )


def test_overlong_image_samples_are_reported_unless_the_cut_is_in_the_response(
    tiny_vlm_dir, tmp_path, caplog
):
    from transformers import AutoTokenizer

    from temper.data.sft import build_sft_datasets

    tok = AutoTokenizer.from_pretrained(tiny_vlm_dir)
    row = {"prompt": "<image>Colour?", "response": "red " * 40}
    row["images"] = [_image(tmp_path / "r.png", "red")]
    files = [write(tmp_path / "d.jsonl", [row])]
    cfg = config(model__path=str(tiny_vlm_dir), data__train_files=files, sft__max_length=48)
    cfg.data.truncation = "right"
    train, _ = build_sft_datasets(cfg, tok)
    assert train is not None and train.truncated == 1  # the response is cut
    cfg.data.truncation = "left"
    with pytest.raises(DataError, match="no usable sample"):
        build_sft_datasets(cfg, tok)
    assert "left truncation would cut image tokens" in caplog.text
