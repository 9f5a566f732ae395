"""A tiny random Qwen2-VL-family (vision-language) model with a real tokenizer, built offline.

The vision-language counterpart of :mod:`temper.utils.tiny`: two text layers, a two-block
vision tower, and the byte-level tokenizer of the tiny text model plus the special tokens
a Qwen2-VL processor needs (``<|vision_start|>``, ``<|image_pad|>``, ``<|vision_end|>``,
``<|video_pad|>``) and a few whole-word tokens (the colour names of temper's
``visual_color`` task, as any real BPE vocabulary has them: a two-layer model then learns
to answer in one token instead of spelling byte by byte), with a Qwen2-VL-style chat
template (an ``{"type": "image"}`` part
renders as ``<|vision_start|><|image_pad|><|vision_end|>``) and a Qwen2-VL image processor
(``preprocessor_config.json``, PIL backend: no torchvision needed). It loads with
``AutoModelForImageTextToText`` / ``AutoTokenizer`` / ``AutoImageProcessor`` like a hub
checkpoint, and a forward with one small image takes milliseconds on a CPU.

    python -m temper.utils.tiny_vlm DIR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|pad|>",
]

#: Whole words with a token of their own (matched as whole words only).
WORD_TOKENS = ["red", "green", "blue", "yellow", "black", "purple"]

# Qwen2-VL's chat template without the default system turn (shorter tiny prompts).
QWEN2_VL_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'video' or 'video' in part %}"
    "{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{% elif 'text' in part %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

#: Pixel limits of the tiny model's image processor: 4 to 64 patches of 28×28 pixels
#: (1 to 16 image tokens after the 2×2 merge), so test prompts stay short.
MIN_PIXELS = 4 * 28 * 28
MAX_PIXELS = 64 * 28 * 28


def build_vl_tokenizer(out_dir: str | Path) -> Any:
    """Byte-level tokenizer (256 byte tokens, no merges) + Qwen2-VL special tokens +
    :data:`WORD_TOKENS`."""
    from temper.utils.tiny import byte_tokenizer

    return byte_tokenizer(out_dir, SPECIAL_TOKENS, QWEN2_VL_TEMPLATE, tuple(WORD_TOKENS))


def make_tiny_vlm(
    out_dir: str | Path,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 128,
    vision_depth: int = 2,
    vision_embed_dim: int = 32,
    vision_heads: int = 2,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
    seed: int = 0,
    family: str = "qwen2_vl",
) -> Path:
    """Write a tiny ``Qwen2VLForConditionalGeneration`` (``family="qwen2_5_vl"``:
    ``Qwen2_5_VLForConditionalGeneration``, windowed vision attention; ``"qwen3_vl"``:
    ``Qwen3VLForConditionalGeneration``, 16-pixel patches and deepstack features) +
    tokenizer + image processor.

    Idempotent (a stamp file records the arguments). The text head size is
    ``hidden_size / num_heads`` (32 by default, which vLLM's CPU attention supports);
    M-RoPE splits its 16 rotary frequencies 4/6/6 over time, height and width.
    """
    import torch
    from transformers import (
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessorPil,
    )

    if family not in FAMILIES:
        raise ValueError(f"family must be one of {', '.join(FAMILIES)}, got {family!r}")

    out = Path(out_dir)
    stamp = out / "temper_tiny_vlm.json"
    spec = dict(
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        vision_depth=vision_depth,
        vision_embed_dim=vision_embed_dim,
        vision_heads=vision_heads,
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        seed=seed,
        family=family,
    )
    if stamp.is_file() and json.loads(stamp.read_text()) == spec:
        return out
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_vl_tokenizer(out)
    patch = 16 if family == "qwen3_vl" else 14
    # pixel limits are given for 14-pixel patches: scale them to this family's patch area
    scale = (patch / 14) ** 2
    Qwen2VLImageProcessorPil(
        min_pixels=int(min_pixels * scale), max_pixels=int(max_pixels * scale), patch_size=patch
    ).save_pretrained(str(out))
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    head = hidden_size // num_heads
    unit = head // 16  # M-RoPE sections (t, h, w) sum to head / 2, as 16/24/24 of 128
    vision: dict[str, Any] = dict(
        depth=vision_depth,
        num_heads=vision_heads,
        patch_size=patch,
        spatial_merge_size=2,
        temporal_patch_size=2,
    )
    if family == "qwen2_vl":
        vision.update(embed_dim=vision_embed_dim, hidden_size=hidden_size, mlp_ratio=2)
    elif family == "qwen3_vl":  # learned position grid (a square count) and deepstack
        vision.update(
            hidden_size=vision_embed_dim,
            intermediate_size=2 * vision_embed_dim,
            out_hidden_size=hidden_size,
            num_position_embeddings=64,
            deepstack_visual_indexes=[0],
        )
    else:  # 2.5: the tower's width is hidden_size, its output out_hidden_size
        vision.update(
            hidden_size=vision_embed_dim,
            intermediate_size=2 * vision_embed_dim,
            out_hidden_size=hidden_size,
            window_size=56,
            fullatt_block_indexes=[vision_depth - 1],
        )
    config_cls, model_cls = {
        "qwen2_vl": (Qwen2VLConfig, Qwen2VLForConditionalGeneration),
        "qwen2_5_vl": (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration),
        "qwen3_vl": _qwen3_vl_classes(),
    }[family]
    text_extra: dict[str, Any] = {"head_dim": head} if family == "qwen3_vl" else {}
    config = config_cls(
        text_config=dict(
            **text_extra,
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            max_position_embeddings=4096,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [2 * unit, 3 * unit, 3 * unit],
            },
            eos_token_id=ids["<|im_end|>"],
            pad_token_id=ids["<|pad|>"],
            bos_token_id=None,
        ),
        vision_config=vision,
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_cls(config)
    model.generation_config.eos_token_id = ids["<|im_end|>"]
    model.generation_config.pad_token_id = ids["<|pad|>"]
    model.save_pretrained(str(out))
    stamp.write_text(json.dumps(spec))
    return out


#: Model families :func:`make_tiny_vlm` builds.
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")


def _qwen3_vl_classes() -> tuple[Any, Any]:
    """Qwen3-VL's config and model classes (transformers ≥ 5 has them)."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    return Qwen3VLConfig, Qwen3VLForConditionalGeneration


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    args = parser.parse_args()
    print(make_tiny_vlm(args.out_dir))


if __name__ == "__main__":
    main()
