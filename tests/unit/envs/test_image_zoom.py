"""DeepEyes' image tools: bbox parsing, clamping to the image, the minimum size, the crop
and rotation themselves, and every bad call as an error observation."""

from __future__ import annotations

import pytest
from PIL import Image

from temper.envs.image_zoom import last_tool_call, parse_bbox, run_tool_call, zoom_box


def image(w: int = 200, h: int = 100) -> Image.Image:
    """A ``w`` × ``h`` image whose pixel (x, y) is (x, y, 0): a crop's origin is readable."""
    img = Image.new("RGB", (w, h))
    img.putdata([(x, y, 0) for y in range(h) for x in range(w)])
    return img


def call(**arguments) -> str:
    import json

    return json.dumps({"name": "image_zoom_in_tool", "arguments": arguments})


def test_parse_bbox_formats():
    assert parse_bbox([10, 20, 100, 200]) == (10.0, 20.0, 100.0, 200.0)
    assert parse_bbox((1.5, 2, 3, 4)) == (1.5, 2.0, 3.0, 4.0)
    assert parse_bbox(["10", "20", "100", "200"]) == (10.0, 20.0, 100.0, 200.0)
    assert parse_bbox("[10, 20, 100, 200]") == (10.0, 20.0, 100.0, 200.0)
    for bad, why in (
        ([1, 2, 3], "4 numbers"),
        ("10,20,100,200", "not a list"),
        ([1, 2, "x", 4], "'x' is not a number"),
        ([1, 2, True, 4], "True is not a number"),
        ([1, 2, float("nan"), 4], "not finite"),
        ({"x1": 1}, "4 numbers"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_bbox(bad)


def test_zoom_box_clamps_to_the_image():
    # 200 × 100: (-20, -5, 250, 80) → (0, 0, 200, 80)
    assert zoom_box((-20, -5, 250, 80), 200, 100) == (0.0, 0.0, 200.0, 80.0)
    assert zoom_box((10, 10, 90, 60), 200, 100) == (10.0, 10.0, 90.0, 60.0)  # inside: as is
    # clamped to nothing: x1 ≥ width after clamping, or inverted corners
    assert zoom_box((210, 0, 300, 50), 200, 100) is None
    assert zoom_box((90, 10, 10, 60), 200, 100) is None


def test_zoom_box_minimum_size_and_aspect():
    # the short side must exceed 30 pixels: 31 passes, 30 does not
    assert zoom_box((0, 0, 60, 31), 200, 100) == (0.0, 0.0, 60.0, 31.0)
    assert zoom_box((0, 0, 60, 30), 200, 100) is None
    # the long side at least 56: 56 passes, 55 does not (short side 40)
    assert zoom_box((0, 0, 56, 40), 200, 100) is not None
    assert zoom_box((0, 0, 55, 40), 200, 100) is None
    # clamping can make a box too small: (170, 0, 260, 90) → (170, 0, 200, 90), 30 wide
    assert zoom_box((170, 0, 260, 90), 200, 100) is None
    # aspect ratio above 100 is refused: 3200 / 31 ≈ 103
    assert zoom_box((0, 0, 3200, 31), 4000, 100) is None
    assert zoom_box((0, 0, 3100, 31), 4000, 100) is not None  # 100.0 exactly


def test_crop_is_the_box_of_the_original():
    result = run_tool_call(call(bbox_2d=[40, 20, 120.4, 70.6], label="x"), image())
    assert result.ok and not result.error
    crop = result.image
    # corners rounded to pixels: (40, 20, 120, 71) → 80 × 51, origin pixel (40, 20)
    assert crop.size == (80, 51)
    assert crop.getpixel((0, 0)) == (40, 20, 0)
    assert crop.getpixel((79, 50)) == (119, 70, 0)
    # out-of-image corners are clamped: the crop ends at the image's edge
    edge = run_tool_call(call(bbox_2d=[130, 40, 400, 300]), image()).image
    assert edge.size == (70, 60) and edge.getpixel((69, 59)) == (199, 99, 0)
    # ``bbox`` (DeepEyes' first prompt's name) is read too
    assert run_tool_call(call(bbox=[0, 0, 60, 60]), image()).image.size == (60, 60)


def test_rotate():
    img = image()
    raw = '{"name": "image_rotate_tool", "arguments": {"angle": 180}}'
    rotated = run_tool_call(raw, img).image
    assert rotated.size == img.size
    assert rotated.getpixel((0, 0)) == img.getpixel((199, 99))  # half a turn


@pytest.mark.parametrize(
    ("text", "error", "invalid_json"),
    [
        ("{not json", "Error: invalid tool call", True),
        ("[1, 2]", "Error: a tool call is a JSON object", True),
        ('{"name": "image_zoom_in_tool"}', "has no arguments object", False),
        ('{"name": "image_zoom_in_tool", "arguments": {}}', "needs bbox_2d", False),
        (call(bbox_2d=[0, 0, 20, 20]), "too small", False),
        (call(bbox_2d=[0, 0, 20]), "4 numbers", False),
        ('{"name": "paint", "arguments": {}}', "unknown tool 'paint'", False),
        ('{"name": "image_rotate_tool", "arguments": {"angle": "x"}}', "numeric angle", False),
    ],
)
def test_bad_calls_are_error_observations(text, error, invalid_json):
    result = run_tool_call(text, image())
    assert not result.ok and result.image is None
    assert result.error.startswith("Error: ") and error in result.error
    assert result.invalid_json is invalid_json


def test_last_tool_call():
    text = "<tool_call>one</tool_call> then <tool_call>\ntwo\n</tool_call>"
    assert last_tool_call(text) == "\ntwo\n"
    assert last_tool_call("<tool_call>unclosed") is None
