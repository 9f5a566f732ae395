"""Images in prompt data: verl's geometry3k row shape read through the model's processor
parts — decoding, sizing within the pixel limits, ``<image>`` → image tokens — and bad
images reported per row like bad text rows."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from temper.config.schema import DataConfig
from temper.data import DataError, build_dataset
from temper.data.row_files import write_rows
from temper.data.vision import (
    MULTI_MODAL_DATA,
    MULTI_MODAL_INPUTS,
    collapse_image_tokens,
    load_vision_processor,
    smart_resize,
)

IMAGE_PAD = "<|image_pad|>"


def png(size: tuple[int, int] = (56, 56), color: str = "red") -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def row(prompt: str, images: list, truth: str = "red", **extra) -> dict:
    """A row as verl's geometry3k preprocessing writes it."""
    return {
        "data_source": "hiyouga/geometry3k",
        "prompt": [{"role": "user", "content": prompt}],
        "images": images,
        "reward_model": {"style": "rule", "ground_truth": truth},
        **extra,
    }


@pytest.fixture(scope="module")
def vl(tiny_vlm_dir):
    from transformers import AutoTokenizer

    return tiny_vlm_dir, AutoTokenizer.from_pretrained(tiny_vlm_dir)


def load(vl, path, **kw):
    model_dir, tok = vl
    cfg = DataConfig(max_prompt_length=kw.pop("max_prompt_length", 256), **kw)
    return build_dataset(path, cfg, tok, vision=load_vision_processor(str(model_dir), tok, cfg))


def test_smart_resize_is_the_image_processors_rule():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize as hf

    for h in (1, 13, 28, 56, 100, 299, 1000, 4000):
        for w in (5, 28, 77, 640, 3000):
            if max(h, w) / min(h, w) > 200:
                with pytest.raises(ValueError, match="aspect ratio"):
                    smart_resize(h, w, 28, 3136, 50176)
                continue
            for lo, hi in ((3136, 50176), (784, 1 << 20), (3136, 12845056)):
                assert smart_resize(h, w, 28, lo, hi) == hf(h, w, 28, lo, hi), (h, w, lo, hi)


def test_every_image_form_is_read_and_expanded_to_its_tokens(vl, tmp_path):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "b.png").write_bytes(png((112, 56), "blue"))
    stored = [  # parquet: one type per column, as geometry3k's files hold them
        row("<image>What colour?", [{"bytes": png(), "path": None}]),
        row("<image> and <image>", [{"bytes": png((300, 100))}, {"bytes": png()}]),
        row("<image>", [{"bytes": png((224, 224)), "max_pixels": 56 * 56}]),  # per-image cap
        row("no image at all", []),
    ]
    listed = [  # json lines: paths (relative to the data file), dicts with a path or image
        row("<image>", ["imgs/b.png"]),
        row("Which?<image>", [{"path": "imgs/b.png"}]),
        row("<image>", [{"image": str(tmp_path / "imgs" / "b.png")}]),
    ]
    raw = [row("<image>", [png()])]  # bytes straight in the column
    rows = stored + listed + raw
    files = [
        write_rows(stored, tmp_path / "a.parquet"),
        write_rows(listed, tmp_path / "b.jsonl"),
        write_rows(raw, tmp_path / "c.parquet"),
    ]
    ds = load(vl, files)
    assert ds.skip_reasons == []
    # tokens per image: (h / 28) · (w / 28) after sizing
    expected = [[4], [44, 4], [4], [], [8], [8], [8], [4]]
    assert [[img.tokens for img in e.images] for e in ds.examples] == expected
    _, tok = vl
    pad = tok.convert_tokens_to_ids(IMAGE_PAD)
    for example, counts, source in zip(ds.examples, expected, rows):
        assert example.prompt_ids.count(pad) == sum(counts)
        assert example.raw_prompt == source["prompt"]  # the <image> marks, for dumps
    first = ds.examples[0].prompt_text
    assert first.startswith("<|im_start|>user\n<|vision_start|>" + IMAGE_PAD * 4)
    assert first.endswith("<|vision_end|>What colour?<|im_end|>\n<|im_start|>assistant\n")


def test_collated_inputs_match_the_image_tokens_and_are_shared_by_the_n_responses(vl, tmp_path):
    rows = [row("<image> and <image>", [png((300, 100)), png()]), row("text only", [])]
    ds = load(vl, write_rows(rows, tmp_path / "d.parquet"))
    batch = ds.make_batch([0, 1])
    data, inputs = batch[MULTI_MODAL_DATA], batch[MULTI_MODAL_INPUTS]
    assert inputs[1] == {} and data[1] == {}
    assert inputs[0]["image_grid_thw"].tolist() == [[1, 8, 22], [1, 4, 4]]  # 100×300 image
    assert inputs[0]["pixel_values"].shape == (22 * 8 + 16, 3 * 2 * 14 * 14)
    assert [im.size for im in data[0]["image"]] == [(308, 112), (56, 56)]  # (w, h), resized
    repeated = batch.repeat(4)  # what a rollout engine does with n = 4
    assert all(repeated[MULTI_MODAL_INPUTS][i] is inputs[0] for i in range(4))


def test_pixel_limit_keys_resize(vl, tmp_path):
    path = write_rows([row("<image>", [png((448, 448))])], tmp_path / "d.parquet")
    assert load(vl, path).examples[0].images[0].tokens == 64  # the processor's max: 64 tokens
    small = load(vl, path, image_max_pixels=112 * 112).examples[0].images[0]
    assert (small.height, small.width, small.tokens) == (112, 112, 16)
    grown = load(vl, write_rows([row("<image>", [png((20, 20))])], tmp_path / "s.parquet"))
    assert grown.examples[0].images[0].tokens == 4  # up to image_min_pixels (the processor's)
    big_min = load(vl, path, image_min_pixels=84 * 84, image_max_pixels=84 * 84)
    assert big_min.examples[0].images[0].tokens == 9


def test_bad_images_are_reported_per_row_and_skipped(vl, tmp_path, caplog):
    stored = [
        row("<image>", [png()]),
        row("<image>", [b"not an image"]),
        row("<image><image>", [png()]),
        row("<image>", [png((2000, 5))]),
    ]
    (tmp_path / "ok.png").write_bytes(png())
    listed = [
        row("<image>", ["missing.png"]),
        row("<image>", ["ok.png"], videos=[{"video": "clip.mp4"}]),
        row("<image>", ["https://example.com/a.png"]),
        row("<image>", [{"path": None}]),
        row("<image>", ["ok.png"], audios=["speech.wav"]),
    ]
    files = [write_rows(stored, tmp_path / "a.parquet"), write_rows(listed, tmp_path / "b.jsonl")]
    ds = load(vl, files)
    assert len(ds) == 1 and ds.metrics()["data/skipped_rows"] == 8
    reasons = {f"{Path(i.file).name}:{i.where}": i.reason for i in ds.skip_reasons}
    assert "cannot be decoded (UnidentifiedImageError" in reasons["a.parquet:row 1"]
    assert "0x" not in reasons["a.parquet:row 1"]  # no memory addresses in reports
    assert "2 <image> mark(s) for 1 image(s)" in reasons["a.parquet:row 2"]
    assert "aspect ratio" in reasons["a.parquet:row 3"]
    assert "cannot read" in reasons["b.jsonl:line 1"] and "missing.png" in reasons["b.jsonl:line 1"]
    assert "no video file at" in reasons["b.jsonl:line 2"]  # videos are read like images
    assert "URL" in reasons["b.jsonl:line 3"]
    assert "neither bytes, path nor image" in reasons["b.jsonl:line 4"]
    assert "audio inputs are not supported" in reasons["b.jsonl:line 5"]
    assert "skipping malformed row" in caplog.text


def test_bad_image_fails_the_load_with_bad_rows_error(vl, tmp_path):
    path = write_rows([row("<image>", [png()]), row("<image>", [b"xx"])], tmp_path / "d.parquet")
    with pytest.raises(DataError, match=r"d\.parquet:row 1: image 0 of column 'images'"):
        load(vl, path, bad_rows="error")


def test_images_for_a_text_model_fail_naming_image_key(tokenizer, tmp_path):
    path = write_rows([row("<image>hi", [png()])], tmp_path / "d.parquet")
    with pytest.raises(DataError, match=r"data\.image_key: .*not a vision-language model"):
        build_dataset(path, DataConfig(chat_template="raw"), tokenizer)


def test_overlong_prompt_with_images_is_reported_not_cut(vl, tmp_path):
    path = write_rows([row("<image>", [png((448, 448))]), row("hi", [])], tmp_path / "d.parquet")
    ds = load(vl, path, max_prompt_length=40, truncation="left")
    assert len(ds) == 1 and "truncating it would cut image tokens" in ds.skip_reasons[0].reason
    assert load(vl, path, max_prompt_length=40, filter_overlong_prompts=True).filtered_overlong == 1


def test_roll_rows_plain_string_prompt_and_raw_template(vl, tmp_path):
    """ROLL's VL pipeline reads a plain string from its messages column (``prompt``)."""
    rows = [
        {"prompt": "<image>How many?", "images": [png()], "reward_model": {"ground_truth": "1"}},
        {"prompt": json.dumps([{"role": "user", "content": "<image>x"}]), "images": [png()]},
    ]
    path = write_rows(rows, tmp_path / "roll.parquet")
    ds = load(vl, path, messages_key="prompt")
    assert [e.prompt_ids.count(vl[1].convert_tokens_to_ids(IMAGE_PAD)) for e in ds] == [4, 4]
    raw = load(vl, path, messages_key="prompt", chat_template="raw")
    assert (
        raw.examples[0].prompt_text
        == "<|vision_start|>" + IMAGE_PAD * 4 + "<|vision_end|>How many?"
    )


def test_collapse_image_tokens_for_engines_that_expand_them():
    ids = [1, 9, 9, 9, 2, 9, 9, 3]
    assert collapse_image_tokens(ids, 9, [3, 2]) == [1, 9, 2, 9, 3]
    with pytest.raises(ValueError):
        collapse_image_tokens(ids, 9, [3, 3])
    with pytest.raises(ValueError):
        collapse_image_tokens(ids, 9, [3, 2, 1])


def test_same_inputs_as_the_full_processor_where_it_can_be_built(vl, tmp_path):
    """Users with torchvision (the full ``AutoProcessor``) get the same model inputs: the
    processor's own expansion, resize and pixels equal temper's parts-built ones."""
    pytest.importorskip("torchvision", reason="AutoProcessor of Qwen2-VL needs torchvision")
    from transformers import AutoProcessor

    model_dir, _tok = vl
    processor = AutoProcessor.from_pretrained(str(model_dir))
    images = [png((300, 100)), png((56, 84), "green")]
    path = write_rows([row("<image> vs <image>?", images)], tmp_path / "d.parquet")
    ds = load(vl, path)
    ours = ds.make_batch([0])
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image"},
                {"type": "text", "text": " vs "},
                {"type": "image"},
                {"type": "text", "text": "?"},
            ],
        }
    ]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    pil = [Image.open(io.BytesIO(b)).convert("RGB") for b in images]
    theirs = processor(text=[text], images=pil, return_tensors="pt")
    assert list(ds.examples[0].prompt_ids) == theirs["input_ids"][0].tolist()
    inputs = ours[MULTI_MODAL_INPUTS][0]
    assert torch.equal(inputs["image_grid_thw"], theirs["image_grid_thw"])
    torch.testing.assert_close(
        inputs["pixel_values"], theirs["pixel_values"], atol=0.02, rtol=0
    )  # ≤ 1 intensity level: PIL vs torchvision resize


def test_model_directory_without_processor_files_is_reported(tiny_vlm_dir, tmp_path):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(tiny_vlm_dir, bare)
    (Path(bare) / "preprocessor_config.json").unlink()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(bare)
    with pytest.raises(DataError, match=r"model\.path: .*without an image processor"):
        load_vision_processor(str(bare), tok, DataConfig())
