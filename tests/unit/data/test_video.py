"""Videos in prompt data: which frames are taken (qwen-vl-utils' rule, hand-computed
here), the frame size within the pixel bounds, the patch layout of
``pixel_values_videos``, decoding with PyAV, rows read through the model's processor
parts, bad videos reported per row, and vLLM rollout of video prompts refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from temper.config import ConfigError
from temper.config.schema import DataConfig
from temper.data import build_dataset
from temper.data.video import (
    Sampling,
    VideoInput,
    frame_indices,
    frame_list_indices,
    frame_pixel_bounds,
    num_frames,
    video_patches,
)
from temper.data.vision import MULTI_MODAL_INPUTS, load_vision_processor, smart_resize

VIDEO_PAD = "<|video_pad|>"

# --------------------------------------------------------------------------- sampling


def test_frames_of_a_file_follow_fps_within_min_and_max_frames():
    # 8 frames at 4 fps = 2 s; 2 fps wants 4 frames, spread over 0..7: 0, 2.33, 4.67, 7
    assert num_frames(8, 4.0, Sampling(fps=2.0)) == 4
    assert frame_indices(8, 4) == [0, 2, 5, 7]
    # 10 s at 30 fps (300 frames): 2 fps wants 20, max_frames 16 caps it
    assert num_frames(300, 30.0, Sampling(fps=2.0, max_frames=16)) == 16
    assert frame_indices(300, 16) == [
        0, 20, 40, 60, 80, 100, 120, 140, 159, 179, 199, 219, 239, 259, 279, 299,
    ]  # fmt: skip
    # 5 frames at 30 fps wants 0.33 frames: min_frames (4) lifts it, 0, 1.33, 2.67, 4
    assert num_frames(5, 30.0, Sampling(fps=2.0)) == 4
    assert frame_indices(5, 4) == [0, 1, 3, 4]
    # an odd wish rounds down to whole temporal patches: 7 s at 1 fps of 2 fps wants 14;
    # 9 frames wanted of 9 -> 8
    assert num_frames(7, 1.0, Sampling(fps=2.0)) == 6  # min(14, floor2(7) = 6)
    assert num_frames(9, 1.0, Sampling(fps=1.0)) == 8
    # max_frames is rounded down to even too
    assert num_frames(100, 10.0, Sampling(fps=10.0, max_frames=5)) == 4


def test_a_fixed_frame_count_and_too_short_videos():
    assert num_frames(20, 4.0, Sampling(nframes=5)) == 4  # round(2.5) = 2 patches
    assert num_frames(20, 4.0, Sampling(nframes=7)) == 8  # round(3.5) = 4 patches
    assert num_frames(3, 30.0, Sampling()) == 2  # all a 3-frame video has, made even
    with pytest.raises(ValueError, match="at least 2"):
        num_frames(1, 30.0, Sampling())
    with pytest.raises(ValueError, match="no frame rate"):
        num_frames(10, 0.0, Sampling())


def test_a_frame_list_is_taken_whole_padded_even_and_thinned_to_max_frames():
    assert frame_list_indices(3, 768) == [0, 1, 2, 2]  # odd: the last frame repeats
    assert frame_list_indices(4, 768) == [0, 1, 2, 3]
    assert frame_list_indices(10, 4) == [0, 3, 6, 9]  # linspace(0, 9, 4)
    assert frame_list_indices(5, 5) == [0, 1, 3, 4]  # cap floor2(5) = 4: linspace(0, 4, 4)


# --------------------------------------------------------------------------- pixel bounds


def test_frame_pixel_bounds_as_qwen_vl_utils():
    f = 28
    # defaults: 128..768 tokens a frame (the total of 0.9·128000 tokens does not bind)
    assert frame_pixel_bounds(4, f, Sampling()) == (128 * f * f, 768 * f * f)
    # Video-R1's settings: min = max = 128 tokens, total 12288 tokens, 192 frames ->
    # total / 192 · 2 = 128 tokens, below 1.05·min, so 1.05·min; then max_pixels caps it
    r1 = Sampling(min_pixels=100352, max_pixels=100352, total_pixels=9633792)
    assert frame_pixel_bounds(192, f, r1) == (100352, 100352)
    # a small total shrinks each frame: 256 tokens over 8 frames -> 64 tokens a frame
    low, high = frame_pixel_bounds(8, f, Sampling(min_pixels=3136, total_pixels=256 * f * f))
    assert (low, high) == (3136, 64 * f * f)
    # a 640×480 frame within them: β = sqrt(480·640 / 50176) = 2.474, so
    # h = ⌊480 / 2.474 / 28⌋·28 = 168, w = ⌊640 / 2.474 / 28⌋·28 = 252: 6×9 tokens a patch
    assert smart_resize(480, 640, f, low, int(high)) == (168, 252)


def test_patch_times_average_each_temporal_patch():
    video = VideoInput("v.mp4", (0, 2, 4, 6), 28, 28, 2.0, 2, times=(0.0, 0.5, 1.0, 1.5))
    assert video.patch_times(2) == [0.25, 1.25]


# --------------------------------------------------------------------------- layout


def test_two_identical_frames_give_the_image_processors_patches():
    """The image processor repeats an image over a temporal patch; a video whose two
    frames are that image must give the same patches (same order, same normalization)."""
    from transformers import Qwen2VLImageProcessorPil

    proc = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=56 * 84)
    gen = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (56, 84, 3), generator=gen, dtype=torch.uint8).numpy()
    frame = Image.fromarray(pixels)
    image = proc(images=[frame], return_tensors="pt")
    values, grid = video_patches(
        [frame, frame],
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
        rescale_factor=proc.rescale_factor,
        mean=proc.image_mean,
        std=proc.image_std,
    )
    assert grid == (1, 4, 6) == tuple(image["image_grid_thw"][0].tolist())
    torch.testing.assert_close(values, image["pixel_values"], atol=1e-5, rtol=1e-5)


def test_an_odd_frame_count_repeats_the_last_frame_in_its_patch():
    frames = [Image.new("RGB", (28, 28), (v, v, v)) for v in (0, 100, 200)]
    values, grid = video_patches(
        frames,
        patch_size=14,
        merge_size=2,
        temporal_patch_size=2,
        rescale_factor=1.0,
        mean=(0.0, 0.0, 0.0),
        std=(1.0, 1.0, 1.0),
    )
    assert grid == (2, 2, 2) and values.shape == (8, 3 * 2 * 14 * 14)
    # each row: C × T × P × P; patch 2's two frames are both the last (200)
    first = values[0].view(3, 2, 14, 14)
    last = values[-1].view(3, 2, 14, 14)
    assert first[:, 0].eq(0).all() and first[:, 1].eq(100).all()
    assert last.eq(200).all()


# --------------------------------------------------------------------------- files and rows


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Path:
    pytest.importorskip("av")
    from temper.utils.tiny_video import ramp, write_video

    root = tmp_path_factory.mktemp("clips")
    return write_video(root / "ramp.mp4", ramp(8), fps=4, size=(32, 48))


def test_a_file_is_probed_and_its_frames_decoded(clip):
    from temper.data.video import decode_frames, probe

    info = probe(clip)
    assert (info.frames, info.fps, info.height, info.width) == (8, 4.0, 32, 48)
    frames = decode_frames(str(clip), [0, 2, 5, 7, 7])
    levels = [int(sum(f.getpixel((24, 16))) / 3) for f in frames]
    expected = [i * 255 // 8 for i in (0, 2, 5, 7, 7)]  # ramp's grey levels (lossy codec)
    assert all(abs(a - b) <= 8 for a, b in zip(levels, expected)), levels


def _video_row(videos: list, prompt: str = "<video>Which colour?") -> dict:
    return {
        "data_source": "visual_color",
        "prompt": [{"role": "user", "content": prompt}],
        "videos": videos,
        "reward_model": {"ground_truth": "red"},
    }


def test_video_rows_become_video_tokens_and_pixel_inputs(clip, tiny_vlm_dir, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_vlm_dir)
    Image.new("RGB", (30, 30), "red").save(tmp_path / "f.png")
    rows = [
        _video_row([str(clip)]),  # 8 frames at 4 fps, 2 fps -> 4 frames: 2 patches
        _video_row([{"video": str(clip), "nframes": 6}]),  # 3 patches
        _video_row([["f.png", "f.png", "f.png"]]),  # 3 frames -> 4: 2 patches
        _video_row([str(clip)], prompt="no mark"),
        _video_row([{"video": str(clip), "video_start": 1.0}]),
        _video_row([str(tmp_path / "gone.mp4")]),
    ]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = DataConfig(max_prompt_length=256, video_min_pixels=3136, video_max_pixels=3136)
    vision = load_vision_processor(str(tiny_vlm_dir), tok, cfg)
    ds = build_dataset([str(data)], cfg, tok, vision=vision)
    assert [len(e.videos) for e in ds.examples] == [1, 1, 1]
    # the 48×32 clip grows to min_pixels keeping its shape, 84×56: 3×2 tokens a temporal
    # patch; the 30×30 frames become 56×56: 2×2
    assert [(v.width, v.height) for e in ds.examples for v in e.videos] == [(84, 56)] * 2 + [
        (56, 56)
    ]
    assert [e.videos[0].tokens for e in ds.examples] == [12, 18, 8]
    assert [e.prompt_text.count(VIDEO_PAD) for e in ds.examples] == [12, 18, 8]
    assert ds.examples[0].videos[0].indices == (0, 2, 5, 7)
    reasons = {i.where: i.reason for i in ds.skip_reasons}
    assert "0 <video> mark(s) for 1 video(s)" in reasons["line 4"]
    assert "video_start" in reasons["line 5"]
    assert "no video file at" in reasons["line 6"]
    batch = ds.make_batch(list(range(3)))
    inputs = batch.objects[MULTI_MODAL_INPUTS]
    assert [tuple(i["video_grid_thw"][0].tolist()) for i in inputs] == [
        (2, 4, 6),
        (3, 4, 6),
        (2, 4, 4),
    ]
    assert [i["pixel_values_videos"].shape for i in inputs] == [
        (48, 1176),
        (72, 1176),
        (32, 1176),
    ]
    assert "second_per_grid_ts" not in inputs[0]  # Qwen2-VL's M-RoPE has no time scale


def test_vllm_rollout_of_video_prompts_is_refused_at_check(tmp_path):
    from temper.pipelines.catalog import build_config
    from temper.pipelines.preflight_data import check_prompt_data

    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(_video_row(["clip.mp4"])) + "\n")

    def cfg(engine: str):
        return build_config(
            {
                "model": {"path": "tiny"},
                "data": {"train_files": [str(data)], "train_batch_size": 1},
                "rollout": {"engine": engine},
            }
        )

    with pytest.raises(ConfigError, match="vLLM rollout of video prompts") as err:
        check_prompt_data(cfg("vllm"), [])
    assert err.value.key == "rollout.engine" and "rollout.engine=hf" in str(err.value)
    check_prompt_data(cfg("hf"), [])  # the hf engine generates from videos
